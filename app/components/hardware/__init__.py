"""The device: detection, presets, precision, memory and allocator settings."""
