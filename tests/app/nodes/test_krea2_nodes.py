"""Krea-2's nodes have InvokeAI 6.14.2's shapes: the inputs, defaults and outputs of krea2_model_loader,
krea2_text_encoder, krea2_denoise and qwen_image_l2i (InvokeAI's buildKrea2Graph decodes Krea-2 latents with it), as
a table written from InvokeAI's sources (and checked against its OpenAPI document where the checkout has
../shared/reference); positive conditioning as one field or a list of one (a collect node's output); InvokeAI's
cfg_scale turned into Krea2Pipeline's guidance per step; inputs for features this server lacks refused naming them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from invokeai.app.nodes import Graph  # noqa: F401 - imports every family's node module
from invokeai.app.nodes.base import invocation_class
from invokeai.app.nodes.compat import can_connect
from invokeai.app.nodes.krea2 import (
    Krea2ConditioningField,
    Krea2DenoiseInvocation,
    Krea2TextEncoderInvocation,
    QwenImageLatentsToImageInvocation,
)

REFERENCE = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "invokeai-6.14.2-openapi.json"
REQUIRED = object()  # an input InvokeAI has without a default (set, or fed by an edge)

# InvokeAI 6.14.2's inputs and their defaults (invokeai/app/invocations/krea2_*.py, qwen_image_latents_to_image.py).
INPUTS: dict[str, dict[str, Any]] = {
    "krea2_model_loader": {"model": REQUIRED, "vae_model": None, "qwen3_vl_encoder_model": None},
    "krea2_text_encoder": {"prompt": REQUIRED, "mask": None, "qwen3_vl_encoder": REQUIRED},
    "krea2_denoise": {
        "board": None,
        "metadata": None,
        "latents": None,
        "denoise_mask": None,
        "denoising_start": 0.0,
        "denoising_end": 1.0,
        "transformer": REQUIRED,
        "positive_conditioning": REQUIRED,
        "negative_conditioning": None,
        "cfg_scale": 1.0,
        "width": 1024,
        "height": 1024,
        "steps": 8,
        "seed": 0,
        "shift": None,
        "style_reference": None,
        "style_reference_conditioning": None,
    },
    "qwen_image_l2i": {
        "board": None,
        "metadata": None,
        "latents": REQUIRED,
        "vae": REQUIRED,
        "tiled": False,
        "tile_size": 0,
    },
}
OUTPUTS = {
    "krea2_model_loader": ("krea2_model_loader_output", {"transformer", "qwen3_vl_encoder", "vae"}),
    "krea2_text_encoder": ("krea2_conditioning_output", {"conditioning"}),
    "krea2_denoise": ("latents_output", {"latents", "width", "height"}),
    "qwen_image_l2i": ("image_output", {"image", "width", "height"}),
}
SCHEMAS = {
    "krea2_model_loader": "Krea2ModelLoaderInvocation",
    "krea2_text_encoder": "Krea2TextEncoderInvocation",
    "krea2_denoise": "Krea2DenoiseInvocation",
    "qwen_image_l2i": "QwenImageLatentsToImageInvocation",
}
NODE_FIELDS = {"id", "type", "is_intermediate", "use_cache"}


def _default(node_type: str, name: str) -> Any:
    node = invocation_class(node_type)
    assert node is not None, node_type
    spec = node.input_specs()[name]
    return REQUIRED if spec.required else node.model_fields[name].default


@pytest.mark.parametrize("node_type", INPUTS)
def test_inputs_and_defaults_are_invokeais(node_type: str) -> None:
    node = invocation_class(node_type)
    assert node is not None
    assert set(node.model_fields) - NODE_FIELDS == set(INPUTS[node_type])
    assert {name: _default(node_type, name) for name in INPUTS[node_type]} == INPUTS[node_type]


@pytest.mark.parametrize("node_type", OUTPUTS)
def test_outputs_are_invokeais(node_type: str) -> None:
    output = invocation_class(node_type).output_class()  # type: ignore[union-attr]
    type_tag, fields = OUTPUTS[node_type]
    assert output.model_fields["type"].default == type_tag
    assert set(output.output_fields()) - {"type"} >= fields


def test_the_old_decode_node_is_gone() -> None:
    # InvokeAI has no krea2_vae_decode: its graphs decode with qwen_image_l2i.
    assert invocation_class("krea2_vae_decode") is None


@pytest.mark.skipif(not REFERENCE.exists(), reason="no ../shared/reference/invokeai-6.14.2-openapi.json here")
def test_the_table_is_invokeai_6_14_2s_openapi_document() -> None:
    schemas = json.loads(REFERENCE.read_text(encoding="utf-8"))["components"]["schemas"]
    for node_type, name in SCHEMAS.items():
        properties = schemas[name]["properties"]
        # InvokeAI documents every input as optional (an edge may feed it): its default there is null or the value.
        documented = {k: v.get("default") for k, v in properties.items() if k not in NODE_FIELDS}
        table = {k: None if v is REQUIRED else v for k, v in INPUTS[node_type].items()}
        assert documented == table, node_type
    loader_output = schemas["Krea2ModelLoaderOutput"]["properties"]
    assert set(loader_output) - {"type"} == set(OUTPUTS["krea2_model_loader"][1])
    assert set(schemas["Krea2ConditioningField"]["properties"]) == set(Krea2ConditioningField.model_fields)


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
