"""Anima's nodes take InvokeAI 6.14.2's inputs (their shapes are checked with every node type InvokeAI also has, in
test_invokeai_node_shapes.py): conditioning as one field or a list of one (a collect node's output); the loader's
encoder and VAE default to the model's own; inputs for features this server lacks refused naming them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from invokeai.app.nodes import Graph  # noqa: F401 - imports every family's node module
from invokeai.app.nodes.anima import AnimaConditioningField, AnimaDenoiseInvocation, AnimaModelLoaderInvocation
from invokeai.app.nodes.compat import can_connect


def _denoise(**fields: Any) -> AnimaDenoiseInvocation:
    base = {
        "id": "d",
        "transformer": {"transformer": {"key": "k"}},
        "positive_conditioning": {"conditioning_name": "c"},
    }
    return AnimaDenoiseInvocation.model_validate({**base, **fields})


def test_conditioning_is_one_field_or_a_list_of_one() -> None:
    assert _denoise(positive_conditioning=[{"conditioning_name": "c"}]).positive_conditioning == [
        AnimaConditioningField(conditioning_name="c")
    ]
    destination = AnimaDenoiseInvocation.input_types()["positive_conditioning"]
    assert can_connect(list[AnimaConditioningField], destination)
    assert can_connect(AnimaConditioningField, destination)
    for value in ([], [{"conditioning_name": "a"}, {"conditioning_name": "b"}]):
        with pytest.raises(ValidationError, match="positive_conditioning"):
            _denoise(positive_conditioning=value)
    with pytest.raises(ValidationError, match="at most one"):
        _denoise(negative_conditioning=[{"conditioning_name": "a"}, {"conditioning_name": "b"}])


def test_invokeais_defaults() -> None:
    node = _denoise()
    assert (node.guidance_scale, node.steps, node.width, node.height, node.scheduler) == (4.5, 30, 1024, 1024, "euler")
    loader = AnimaModelLoaderInvocation.model_validate({"id": "l", "model": {"name": "demo-anima"}})
    assert loader.vae_model is None and loader.qwen3_encoder_model is None


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("denoising_end", 0.5, "denoising_end"),
        ("add_noise", False, "add_noise"),
        ("noise", {"latents_name": "n"}, "noise from another node"),
        ("control_lllite", {"image_name": "i"}, "LLLite"),
        ("scheduler", "er_sde", "'euler' or 'lcm'"),
        ("width", 1000, "multiple of 16"),
        ("guidance_scale", 0.5, "greater than or equal to 1"),
    ],
)
def test_what_this_server_lacks_is_refused_naming_it(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        _denoise(**{field: value})
