"""Every node type this server registers under a name InvokeAI 6.14.2 also has takes InvokeAI's inputs (names,
requiredness, defaults) and returns InvokeAI's output (its type tag and fields), read from InvokeAI's own OpenAPI
document. Only the differences listed in ALLOWED may remain, and each must still be there."""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import invokeai.app.nodes  # noqa: F401  (registers every node type)
from invokeai.app.nodes.base import BaseInvocation, invocation_classes

REFERENCE = Path(__file__).parents[3].parent / "shared" / "reference" / "invokeai-6.14.2-openapi.json"

# Node types another part of the work converts on its own.
SKIPPED_PREFIXES = ("krea2_",)

# (node type, input) -> why this server's node has an input InvokeAI's lacks. Each has a default that keeps
# InvokeAI's behaviour, so a graph built for InvokeAI runs the same.
ALLOWED: dict[tuple[str, str], str] = {
    ("rand_int", "seed"): "this server's addition; unset (the default) draws a new number each run, as InvokeAI does",
    ("flux_text_encoder", "prompt_2"): "this server's addition: a separate T5 prompt; unset, T5 gets the prompt",
    ("z_image_i2l", "seed"): "this server's addition: the posterior sample's seed (InvokeAI samples it unseeded)",
}

# What a difference is, per input: (required, default or None where required).
Shape = tuple[bool, Any]


def _reference() -> dict[str, Any]:
    if not REFERENCE.is_file():
        pytest.skip(f"InvokeAI 6.14.2's OpenAPI document is not at {REFERENCE}")
    return json.loads(REFERENCE.read_text())["components"]["schemas"]


def _tag(schema: dict[str, Any]) -> str | None:
    prop = schema.get("properties", {}).get("type", {})
    return prop.get("const") or (prop.get("enum") or [None])[0] or prop.get("default")


def _reference_nodes(schemas: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        _tag(schema): schema
        for name, schema in schemas.items()
        if name.endswith("Invocation") and schema.get("class") == "invocation"
    }


def _reference_inputs(schema: dict[str, Any]) -> dict[str, Shape]:
    # InvokeAI parses a required input as optional (an edge may feed it) and keeps the truth in orig_required and
    # orig_default; board and metadata are its "internal" inputs.
    inputs = {}
    for name, prop in schema["properties"].items():
        if prop.get("field_kind") in ("input", "internal"):
            required = bool(prop.get("orig_required", False))
            inputs[name] = (required, None if required else prop.get("orig_default", prop.get("default")))
    return inputs


def _json(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Enum):
        return value.value
    return value


def _our_inputs(cls: type[BaseInvocation]) -> dict[str, Shape]:
    inputs = {}
    for name, spec in cls.input_specs().items():
        default = None if spec.required else cls.model_fields[name].get_default(call_default_factory=True)
        inputs[name] = (spec.required, _json(default))
    return inputs


def _output_shape(tag: str | None, fields: set[str]) -> tuple[str | None, list[str]]:
    return tag, sorted(fields - {"type"})


def _colliding() -> list[tuple[type[BaseInvocation], dict[str, Any], dict[str, Any]]]:
    schemas = _reference()
    reference = _reference_nodes(schemas)
    found = []
    for cls in invocation_classes():
        tag = cls.model_fields["type"].default
        if tag in reference and not tag.startswith(SKIPPED_PREFIXES):
            found.append((cls, reference[tag], schemas))
    return found


def _differences(cls: type[BaseInvocation], schema: dict[str, Any], schemas: dict[str, Any]) -> list[str]:
    tag = cls.model_fields["type"].default
    theirs, ours = _reference_inputs(schema), _our_inputs(cls)
    found = [f"{tag}: missing InvokeAI's input {name!r} {theirs[name]}" for name in sorted(theirs.keys() - ours)]
    found += [
        f"{tag}: input {name!r} is (required, default) {ours[name]}, InvokeAI's {theirs[name]}"
        for name in sorted(theirs.keys() & ours.keys())
        if ours[name] != theirs[name]
    ]
    found += [
        f"{tag}: extra input {name!r} {ours[name]}"
        for name in sorted(ours.keys() - theirs.keys())
        if (tag, name) not in ALLOWED
    ]
    output = schemas[schema["output"]["$ref"].rsplit("/", 1)[-1]]
    ours_out = cls.output_class()
    expected = _output_shape(_tag(output), set(output["properties"]))
    actual = _output_shape(ours_out.model_fields["type"].default, set(ours_out.model_fields))
    if actual != expected:
        found.append(f"{tag}: output (type, fields) is {actual}, InvokeAI's {expected}")
    return found


def test_node_types_invokeai_also_has_take_its_inputs_and_give_its_outputs() -> None:
    colliding = _colliding()
    # The check must not pass by finding nothing to compare.
    assert {"blank_image", "img_resize", "integer", "denoise_latents", "z_image_denoise"} <= {
        cls.model_fields["type"].default for cls, _, _ in colliding
    }
    differences = [line for cls, schema, schemas in colliding for line in _differences(cls, schema, schemas)]
    assert differences == []


@pytest.mark.parametrize(("node_type", "name"), sorted(ALLOWED))
def test_each_allowed_difference_is_still_there(node_type: str, name: str) -> None:
    reference = _reference_nodes(_reference())
    [cls] = [cls for cls in invocation_classes() if cls.model_fields["type"].default == node_type]
    assert node_type in reference, f"InvokeAI has no {node_type}: drop it from ALLOWED"
    assert name in cls.input_specs(), f"{node_type} no longer has {name!r}: drop it from ALLOWED"
    assert name not in _reference_inputs(reference[node_type]), f"InvokeAI's {node_type} has {name!r} too"
    # An extra input must be optional, so that InvokeAI's graphs, which never set it, still run.
    assert not cls.input_specs()[name].required
