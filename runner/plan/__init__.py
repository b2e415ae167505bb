"""Plan before you spend: memory, host, disk and step time of a layout, without a rank."""
