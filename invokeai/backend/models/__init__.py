"""Models on disk: probing what a path is, loading each component per format, shipped configs, demo models.

Importing this package (or `probe`) imports neither torch nor diffusers; the loaders and the demo builder do.
"""
