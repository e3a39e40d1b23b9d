"""Stable Diffusion 1.x: see `descriptor`."""
