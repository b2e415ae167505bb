"""The decoder model: its layers, its shape by arithmetic, and how a layout builds it."""
