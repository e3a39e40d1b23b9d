"""The family-neutral node templates: written once, used by every family whose nodes take a model input, never
registered themselves, and each family's size inputs carry its multiple."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from invokeai.app.nodes import Graph  # noqa: F401 - imports every family's node module
from invokeai.app.nodes.base import invocation_class, invocation_classes
from invokeai.app.nodes.family_nodes import DenoiseInputs, FamilyNode, ImageToImageInputs, VaeDecodeNode, VaeEncodeNode
from invokeai.backend.families import FAMILIES, Family

MODEL_FAMILIES = [f for f in FAMILIES if f.graph.loader is None]


def test_no_template_is_a_node() -> None:
    registered = set(invocation_classes())
    for template in (FamilyNode, DenoiseInputs, ImageToImageInputs, VaeDecodeNode, VaeEncodeNode):
        assert template not in registered


@pytest.mark.parametrize("family", MODEL_FAMILIES, ids=lambda f: f.name)
def test_a_familys_vae_and_denoise_nodes_are_the_templates(family: Family) -> None:
    decode, denoise = invocation_class(family.graph.decode), invocation_class(family.graph.denoise)
    assert issubclass(decode, VaeDecodeNode) and decode.family is family
    assert issubclass(denoise, DenoiseInputs) and denoise.family is family
    if family.graph.encode:
        encode = invocation_class(family.graph.encode)
        assert issubclass(encode, VaeEncodeNode) and encode.family is family
        assert issubclass(denoise, ImageToImageInputs)


@pytest.mark.parametrize("family", MODEL_FAMILIES, ids=lambda f: f.name)
def test_sizes_off_the_familys_multiple_are_refused_naming_it(family: Family) -> None:
    denoise = invocation_class(family.graph.denoise)
    multiple = family.constants.size_multiple
    fields = {"id": "d", "model": {"name": "m"}, "width": 4 * multiple, "height": 4 * multiple}
    conditioning = {"conditioning_name": "c"}
    fields[family.graph.conditioning_field] = conditioning
    denoise.model_validate(fields)
    with pytest.raises(ValidationError, match=rf"height\n  Input should be a multiple of {multiple}"):
        denoise.model_validate({**fields, "height": 4 * multiple + multiple // 2})
    with pytest.raises(ValidationError, match=rf"width\n  Input should be greater than or equal to {multiple}"):
        denoise.model_validate({**fields, "width": 0})


def test_invokeai_handles_refuse_what_this_server_does_not_do_yet_naming_it() -> None:
    from invokeai.app.nodes.model_fields import TransformerField, VAEField

    assert TransformerField(transformer={"name": "m"}, loras=[]).loras == []
    with pytest.raises(ValidationError, match="LoRAs are not supported by this server yet"):
        TransformerField(transformer={"name": "m"}, loras=[{"lora": {"name": "l"}, "weight": 0.75}])
    with pytest.raises(ValidationError, match="seamless tiling axes are not supported by this server yet"):
        VAEField(vae={"name": "m"}, seamless_axes=["x"])
