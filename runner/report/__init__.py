"""``ladder report``: compare the cells of one or more runs and sweeps.

collect.py   find run directories under the given paths and read what each left (defensively)
rows.py      one flat, typed row per cell: layout, memory, speed, loss, status; sorting, best marks
compare.py   do the loss curves of cells with the same global batch coincide; what configs differ
text.py      rows as Markdown, CSV or JSON, for piping
terminal.py  rows as a rich table for the terminal
svg.py       chart primitives drawn as inline SVG (no JS library, no network)
charts.py    the report's charts: memory per term, MFU and tokens/s against gpus, loss curves
html.py      the one self-contained HTML page
"""
