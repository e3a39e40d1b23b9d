"""Krea-2: see `descriptor`."""
