"""Built-in model presets (real diffusers classes, random weights)."""
