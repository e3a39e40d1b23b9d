"""Krea-2's nodes behave as InvokeAI 6.14.2's (their shapes are checked with every node type InvokeAI also has, in
test_invokeai_node_shapes.py): InvokeAI's buildKrea2Graph decodes with qwen_image_l2i, so there is no krea2_vae_decode;
positive conditioning as one field or a list of one (a collect node's output); InvokeAI's cfg_scale turned into
Krea2Pipeline's guidance per step; inputs for features this server lacks refused naming them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from invokeai.app.nodes import Graph  # noqa: F401 - imports every family's node module
from invokeai.app.nodes.base import invocation_class
from invokeai.app.nodes.compat import can_connect
from invokeai.app.nodes.krea2 import Krea2ConditioningField, Krea2DenoiseInvocation, Krea2TextEncoderInvocation
from invokeai.app.nodes.qwen_image import QwenImageLatentsToImageInvocation


def test_the_old_decode_node_is_gone() -> None:
    # InvokeAI has no krea2_vae_decode: its graphs decode with qwen_image_l2i.
    assert invocation_class("krea2_vae_decode") is None


def _denoise(**fields: Any) -> Krea2DenoiseInvocation:
    base = {
        "id": "d",
        "transformer": {"transformer": {"key": "k"}},
        "positive_conditioning": {"conditioning_name": "c"},
    }
    return Krea2DenoiseInvocation.model_validate({**base, **fields})


def test_positive_conditioning_is_one_field_or_a_list_of_one() -> None:
    assert _denoise(positive_conditioning=[{"conditioning_name": "c"}]).positive_conditioning == [
        Krea2ConditioningField(conditioning_name="c")
    ]
    # A collect node's output (a list), as buildKrea2Graph wires it, and a text encoder's (one field) both connect.
    destination = Krea2DenoiseInvocation.input_types()["positive_conditioning"]
    assert can_connect(list[Krea2ConditioningField], destination)
    assert can_connect(Krea2ConditioningField, destination)
    for value in ([], [{"conditioning_name": "a"}, {"conditioning_name": "b"}]):
        with pytest.raises(ValidationError, match="positive_conditioning"):
            _denoise(positive_conditioning=value)


@pytest.mark.parametrize(
    ("cfg_scale", "negative", "expected"),
    [
        (1.0, True, [0.0, 0.0, 0.0]),  # InvokeAI's default: no guidance
        (5.5, True, [4.5, 4.5, 4.5]),  # the pipeline's guidance_scale is one less
        (5.5, False, [0.0, 0.0, 0.0]),  # no negative prompt: InvokeAI guides nothing
        (0.5, True, [0.0, 0.0, 0.0]),  # 1 or less is off, not a negative guidance
        ([3.0, 1.0, 2.0], True, [2.0, 0.0, 1.0]),  # one per step
    ],
)
def test_cfg_scale_becomes_the_pipelines_guidance_per_step(cfg_scale: Any, negative: bool, expected: list) -> None:
    assert _denoise(cfg_scale=cfg_scale, steps=3)._pipeline_scales(negative) == expected


def test_a_cfg_scale_list_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="cfg_scale: 2 values given for 3 steps"):
        _denoise(cfg_scale=[2.0, 2.0], steps=3)._pipeline_scales(True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("latents", {"latents_name": "x"}),
        ("denoise_mask", {"mask_name": "x"}),
        ("denoising_start", 0.5),
        ("denoising_end", 0.5),
        ("style_reference", {"reference_latents_name": "x", "width": 64, "height": 64}),
        ("style_reference_conditioning", {"conditioning_name": "x"}),
        ("positive_conditioning", {"conditioning_name": "c", "mask": {"tensor_name": "m"}}),
        ("transformer", {"transformer": {"key": "k"}, "loras": [{"lora": {"key": "l"}, "weight": 1.0}]}),
        ("width", 1000),
    ],
)
def test_inputs_this_server_cannot_honour_are_refused_naming_them(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        _denoise(**{field: value})


def test_the_text_encoders_and_decoders_unsupported_inputs_are_refused_naming_them() -> None:
    encoder = {"tokenizer": {"key": "k"}, "text_encoder": {"key": "k"}}
    with pytest.raises(ValidationError, match="mask"):
        Krea2TextEncoderInvocation(id="t", prompt="p", qwen3_vl_encoder=encoder, mask={"tensor_name": "m"})
    with pytest.raises(ValidationError, match="loras"):
        Krea2TextEncoderInvocation(id="t", prompt="p", qwen3_vl_encoder={**encoder, "loras": [{"lora": {}}]})
    with pytest.raises(ValidationError, match="tiled"):
        QwenImageLatentsToImageInvocation(id="d", latents={"latents_name": "x"}, vae={"vae": {"key": "k"}}, tiled=True)


def test_their_empty_values_are_accepted() -> None:
    node = _denoise(latents=None, denoise_mask=None, style_reference=None, shift=0.0, cfg_scale=[1.0] * 8)
    assert node.shift == 0.0 and node.transformer.loras == []
