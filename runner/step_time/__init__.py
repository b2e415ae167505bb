"""The step-time model: a layout's step time and MFU from a device's measured rates, and the
calibration that measures them."""
