"""Every node type this server registers under a name InvokeAI 6.14.2 also has takes InvokeAI's inputs (names,
requiredness, defaults) and returns InvokeAI's output (its type tag and fields), as InvokeAI's own OpenAPI document
has them (kept in invokeai_node_shapes.json: see invokeai_node_shapes.py). Only the differences listed in ALLOWED may
remain, and each must still be there."""

from __future__ import annotations

import json
from enum import Enum
from typing import Any

import pytest
from invokeai_node_shapes import REFERENCE, SHAPES, extract
from pydantic import BaseModel

import invokeai.app.nodes  # noqa: F401  (registers every node type)
from invokeai.app.nodes.base import BaseInvocation, invocation_classes

# (node type, input) -> why this server's node has an input InvokeAI's lacks. Each has a default that keeps
# InvokeAI's behaviour, so a graph built for InvokeAI runs the same.
ALLOWED: dict[tuple[str, str], str] = {
    ("rand_int", "seed"): "this server's addition; unset (the default) draws a new number each run, as InvokeAI does",
    ("flux_text_encoder", "prompt_2"): "this server's addition: a separate T5 prompt; unset, T5 gets the prompt",
    ("z_image_i2l", "seed"): "this server's addition: the posterior sample's seed (InvokeAI samples it unseeded)",
    ("qwen_image_i2l", "seed"): "this server's addition: the posterior sample's seed (InvokeAI samples it unseeded)",
    ("qwen_image_i2l", "reference"): "this server's addition: true encodes a Qwen-Image-Edit reference as the Edit "
    "pipelines do (their size, the posterior's mode); false (the default) encodes as InvokeAI does",
}

# (node type, input) -> why this server's node defaults an input InvokeAI requires. InvokeAI's graphs always set it,
# so they run the same; a graph that leaves it unset (this server's web UI names only the model) gets the model's own.
OPTIONAL: dict[tuple[str, str], str] = {
    ("anima_model_loader", "vae_model"): "unset: the model's own VAE (a pipeline's, or its paired pipeline's)",
    ("anima_model_loader", "qwen3_encoder_model"): "unset: the model's own Qwen3 encoder, or its paired pipeline's",
}

# What a difference is, per input: (required, default or None where required).
Shape = tuple[bool, Any]


def _shapes() -> dict[str, dict[str, Any]]:
    return json.loads(SHAPES.read_text())


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


def _colliding() -> list[type[BaseInvocation]]:
    shapes = _shapes()
    return [cls for cls in invocation_classes() if cls.model_fields["type"].default in shapes]


def _differences(cls: type[BaseInvocation], shape: dict[str, Any]) -> list[str]:
    tag = cls.model_fields["type"].default
    theirs = {name: (required, default) for name, (required, default) in shape["inputs"].items()}
    ours = _our_inputs(cls)
    found = [f"{tag}: missing InvokeAI's input {name!r} {theirs[name]}" for name in sorted(theirs.keys() - ours)]
    found += [
        f"{tag}: input {name!r} is (required, default) {ours[name]}, InvokeAI's {theirs[name]}"
        for name in sorted(theirs.keys() & ours.keys())
        if ours[name] != theirs[name]
        and not ((tag, name) in OPTIONAL and ours[name] == (False, None) and theirs[name][0])
    ]
    found += [
        f"{tag}: extra input {name!r} {ours[name]}"
        for name in sorted(ours.keys() - theirs.keys())
        if (tag, name) not in ALLOWED
    ]
    output = cls.output_class()
    actual = [output.model_fields["type"].default, sorted(set(output.model_fields) - {"type"})]
    if actual != shape["output"]:
        found.append(f"{tag}: output [type, fields] is {actual}, InvokeAI's {shape['output']}")
    return found


def test_node_types_invokeai_also_has_take_its_inputs_and_give_its_outputs() -> None:
    colliding = _colliding()
    # The check must not pass by finding nothing to compare.
    assert {
        "blank_image",
        "img_resize",
        "denoise_latents",
        "flux_denoise",
        "krea2_denoise",
        "z_image_denoise",
        "qwen_image_denoise",
        "qwen_image_i2l",
    } <= {cls.model_fields["type"].default for cls in colliding}
    shapes = _shapes()
    differences = [line for cls in colliding for line in _differences(cls, shapes[cls.model_fields["type"].default])]
    assert differences == []


@pytest.mark.skipif(not REFERENCE.is_file(), reason=f"InvokeAI 6.14.2's OpenAPI document is not at {REFERENCE}")
def test_the_committed_shapes_are_the_reference_documents() -> None:
    # Every node type of InvokeAI's name is in the extract, as the document has it: a new one, or a stale extract,
    # fails here until `python tests/app/nodes/invokeai_node_shapes.py` is rerun.
    assert _shapes() == extract()


@pytest.mark.parametrize(("node_type", "name"), sorted(ALLOWED))
def test_each_allowed_difference_is_still_there(node_type: str, name: str) -> None:
    shapes = _shapes()
    [cls] = [cls for cls in invocation_classes() if cls.model_fields["type"].default == node_type]
    assert node_type in shapes, f"InvokeAI has no {node_type}: drop it from ALLOWED"
    assert name in cls.input_specs(), f"{node_type} no longer has {name!r}: drop it from ALLOWED"
    assert name not in shapes[node_type]["inputs"], f"InvokeAI's {node_type} has {name!r} too"
    # An extra input must be optional, so that InvokeAI's graphs, which never set it, still run.
    assert not cls.input_specs()[name].required


@pytest.mark.parametrize(("node_type", "name"), sorted(OPTIONAL))
def test_each_input_made_optional_is_required_by_invokeai_and_defaults_to_none_here(node_type: str, name: str) -> None:
    shapes = _shapes()
    [cls] = [cls for cls in invocation_classes() if cls.model_fields["type"].default == node_type]
    assert shapes[node_type]["inputs"][name][0], f"InvokeAI's {node_type} does not require {name!r}: drop it"
    assert _our_inputs(cls)[name] == (False, None)
