"""Nodes and graphs. Every node module is imported here, before graph.py, whose node union is built from the
registry when it is imported: a node module not imported here is missing from graphs and the OpenAPI document.
Each model family names its node module in its descriptor, so a new family's nodes need no line here."""

import importlib

from invokeai.app.nodes import image, primitives  # noqa: F401 - imported to register their nodes
from invokeai.backend.families import FAMILIES

for _family in FAMILIES:
    importlib.import_module(_family.node_module)

# InvokeAI's node types that span families or belong to none (its SD-1/SDXL nodes take the sd1 and sdxl modules').
from invokeai.app.nodes import metadata, sd_invocations  # noqa: E402, F401 - imported to register their nodes
from invokeai.app.nodes.graph import Graph  # noqa: E402, F401 - after the node modules, see above
