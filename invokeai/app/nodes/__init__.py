"""Nodes and graphs. Every node module is imported here, before graph.py, whose node union is built from the
registry when it is imported: a node module not listed here is missing from graphs and the OpenAPI document."""

from invokeai.app.nodes import image, krea2, primitives, sd1  # noqa: F401 - imported to register their nodes
from invokeai.app.nodes.graph import Graph  # noqa: F401 - after the node modules, see above
