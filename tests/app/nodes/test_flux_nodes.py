"""FLUX.1's nodes have InvokeAI 6.14.2's shapes: the inputs, defaults and outputs of flux_model_loader,
flux_text_encoder, flux_denoise, flux_vae_decode and flux_vae_encode, as a table written from InvokeAI's sources
(and checked against its OpenAPI document where the checkout has ../shared/reference); positive conditioning as one
field or a list of one (a collect node's output); inputs for features this server lacks refused naming them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from invokeai.app.nodes import Graph  # noqa: F401 - imports every family's node module
from invokeai.app.nodes.base import invocation_class
from invokeai.app.nodes.compat import can_connect
from invokeai.app.nodes.flux import FluxConditioningField, FluxDenoiseInvocation

REFERENCE = Path(__file__).resolve().parents[3].parent / "shared" / "reference" / "invokeai-6.14.2-openapi.json"
REQUIRED = object()  # an input InvokeAI has without a default (set, or fed by an edge)

# InvokeAI 6.14.2's inputs and their defaults (invokeai/app/invocations/flux_*.py), node by node.
INPUTS: dict[str, dict[str, Any]] = {
    "flux_model_loader": {
        "model": REQUIRED,
        "t5_encoder_model": None,
        "clip_embed_model": None,
        "vae_model": None,
    },
    "flux_text_encoder": {
        "clip": REQUIRED,
        "t5_encoder": REQUIRED,
        "t5_max_seq_len": REQUIRED,
        "prompt": REQUIRED,
        "mask": None,
    },
    "flux_denoise": {
        "latents": None,
        "noise": None,
        "denoise_mask": None,
        "denoising_start": 0.0,
        "denoising_end": 1.0,
        "add_noise": True,
        "transformer": REQUIRED,
        "control_lora": None,
        "positive_text_conditioning": REQUIRED,
        "negative_text_conditioning": None,
        "redux_conditioning": None,
        "fill_conditioning": None,
        "cfg_scale": 1.0,
        "cfg_scale_start_step": 0,
        "cfg_scale_end_step": -1,
        "width": 1024,
        "height": 1024,
        "num_steps": 4,
        "scheduler": "euler",
        "guidance": 4.0,
        "seed": 0,
        "control": None,
        "controlnet_vae": None,
        "ip_adapter": None,
        "kontext_conditioning": None,
        "dype_preset": "off",
        "dype_scale": None,
        "dype_exponent": None,
    },
    "flux_vae_decode": {"latents": REQUIRED, "vae": REQUIRED, "metadata": None, "board": None},
    "flux_vae_encode": {"image": REQUIRED, "vae": REQUIRED},
}
OUTPUTS = {
    "flux_model_loader": ("flux_model_loader_output", {"transformer", "clip", "t5_encoder", "vae", "max_seq_len"}),
    "flux_text_encoder": ("flux_conditioning_output", {"conditioning"}),
    "flux_denoise": ("latents_output", {"latents", "width", "height"}),
    "flux_vae_decode": ("image_output", {"image", "width", "height"}),
    "flux_vae_encode": ("latents_output", {"latents", "width", "height"}),
}
# This server's own additions (kept beside InvokeAI's inputs).
OWN = {"flux_text_encoder": {"prompt_2"}}
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
    ours = set(node.model_fields) - NODE_FIELDS - OWN.get(node_type, set())
    assert ours == set(INPUTS[node_type])
    assert {name: _default(node_type, name) for name in INPUTS[node_type]} == INPUTS[node_type]


@pytest.mark.parametrize("node_type", OUTPUTS)
def test_outputs_are_invokeais(node_type: str) -> None:
    output = invocation_class(node_type).output_class()  # type: ignore[union-attr]
    type_tag, fields = OUTPUTS[node_type]
    assert output.model_fields["type"].default == type_tag
    assert set(output.output_fields()) - {"type"} >= fields


@pytest.mark.skipif(not REFERENCE.exists(), reason="no ../shared/reference/invokeai-6.14.2-openapi.json here")
def test_the_table_is_invokeai_6_14_2s_openapi_document() -> None:
    schemas = json.loads(REFERENCE.read_text(encoding="utf-8"))["components"]["schemas"]
    names = {
        "flux_model_loader": "FluxModelLoaderInvocation",
        "flux_text_encoder": "FluxTextEncoderInvocation",
        "flux_denoise": "FluxDenoiseInvocation",
        "flux_vae_decode": "FluxVaeDecodeInvocation",
        "flux_vae_encode": "FluxVaeEncodeInvocation",
    }
    for node_type, name in names.items():
        properties = schemas[name]["properties"]
        # InvokeAI documents every input as optional (an edge may feed it): its default there is null or the value.
        documented = {k: v.get("default") for k, v in properties.items() if k not in NODE_FIELDS}
        table = {k: None if v is REQUIRED else v for k, v in INPUTS[node_type].items()}
        assert documented == table, node_type
    assert schemas["FluxDenoiseInvocation"]["properties"]["scheduler"]["enum"] == ["euler", "heun", "lcm"]


def _denoise(**fields: Any) -> FluxDenoiseInvocation:
    base = {
        "id": "d",
        "transformer": {"transformer": {"key": "k"}},
        "positive_text_conditioning": {"conditioning_name": "c"},
    }
    return FluxDenoiseInvocation.model_validate({**base, **fields})


def test_positive_conditioning_is_one_field_or_a_list_of_one() -> None:
    assert _denoise(positive_text_conditioning=[{"conditioning_name": "c"}]).positive_text_conditioning == [
        FluxConditioningField(conditioning_name="c")
    ]
    # A collect node's output (a list) and a text encoder's (one field) both connect.
    destination = FluxDenoiseInvocation.input_types()["positive_text_conditioning"]
    assert can_connect(list[FluxConditioningField], destination)
    assert can_connect(FluxConditioningField, destination)
    for value in ([], [{"conditioning_name": "a"}, {"conditioning_name": "b"}]):
        with pytest.raises(ValidationError, match="positive_text_conditioning"):
            _denoise(positive_text_conditioning=value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("control", [{"control_model": {"key": "x"}}]),
        ("ip_adapter", {"ip_adapter_model": {"key": "x"}}),
        ("redux_conditioning", [{"conditioning": {"tensor_name": "x"}}]),
        ("kontext_conditioning", {"image": {"image_name": "x"}}),
        ("fill_conditioning", {"image": {"image_name": "x"}}),
        ("control_lora", {"lora": {"key": "x"}}),
        ("denoise_mask", {"mask_name": "x"}),
        ("noise", {"latents_name": "x"}),
        ("dype_preset", "auto"),
        ("scheduler", "dpmpp_2m"),
    ],
)
def test_inputs_this_server_cannot_honour_are_refused_naming_them(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        _denoise(**{field: value})


def test_their_empty_values_and_the_frontends_dype_numbers_are_accepted() -> None:
    node = _denoise(control=None, ip_adapter=[], redux_conditioning=[], dype_preset="off", dype_scale=2.0)
    assert node.dype_scale == 2.0 and node.ip_adapter == []
