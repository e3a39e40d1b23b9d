"""InvokeAI: a node-graph image generation server."""

# The one place the version is written; pyproject.toml reads it (tool.setuptools.dynamic).
__version__ = "0.1.0"
