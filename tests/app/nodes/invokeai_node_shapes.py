"""InvokeAI 6.14.2's node shapes, for the node types this server also registers: each one's inputs (required, and
the default where not) and its output (type tag and fields), taken from InvokeAI's OpenAPI document
(../shared/reference/invokeai-6.14.2-openapi.json beside the checkout) and kept in invokeai_node_shapes.json, so that a
run without the reference beside the checkout still checks.

    python tests/app/nodes/invokeai_node_shapes.py [reference.json]   # rewrites invokeai_node_shapes.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SHAPES = HERE / "invokeai_node_shapes.json"
REFERENCE = HERE.parents[3] / "shared" / "reference" / "invokeai-6.14.2-openapi.json"


def _tag(schema: dict[str, Any]) -> str | None:
    prop = schema.get("properties", {}).get("type", {})
    return prop.get("const") or (prop.get("enum") or [None])[0] or prop.get("default")


def _inputs(schema: dict[str, Any]) -> dict[str, list[Any]]:
    # InvokeAI parses a required input as optional (an edge may feed it) and keeps the truth in orig_required and
    # orig_default; board and metadata are its "internal" inputs.
    inputs = {}
    for name, prop in schema["properties"].items():
        if prop.get("field_kind") in ("input", "internal"):
            required = bool(prop.get("orig_required", False))
            inputs[name] = [required, None if required else prop.get("orig_default", prop.get("default"))]
    return inputs


def reference_shapes(reference: Path = REFERENCE) -> dict[str, dict[str, Any]]:
    """Every invocation of the document: node type -> {"inputs": {name: [required, default]}, "output": [tag,
    sorted fields without "type"]}."""
    schemas = json.loads(reference.read_text())["components"]["schemas"]
    shapes = {}
    for name, schema in schemas.items():
        if not (name.endswith("Invocation") and schema.get("class") == "invocation"):
            continue
        output = schemas[schema["output"]["$ref"].rsplit("/", 1)[-1]]
        shapes[_tag(schema)] = {
            "inputs": _inputs(schema),
            "output": [_tag(output), sorted(set(output["properties"]) - {"type"})],
        }
    return shapes


def ours() -> set[str]:
    import invokeai.app.nodes  # noqa: F401  (registers every node type)
    from invokeai.app.nodes.base import invocation_classes

    return {cls.model_fields["type"].default for cls in invocation_classes()}


def extract(reference: Path = REFERENCE) -> dict[str, dict[str, Any]]:
    """The reference's shapes of the node types this server registers."""
    registered = ours()
    return {tag: shape for tag, shape in sorted(reference_shapes(reference).items()) if tag in registered}


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else REFERENCE
    SHAPES.write_text(json.dumps(extract(source), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SHAPES}")
