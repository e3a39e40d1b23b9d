"""FLUX.1's nodes behave as InvokeAI 6.14.2's (their shapes are checked with every node type InvokeAI also has, in
test_invokeai_node_shapes.py): positive conditioning as one field or a list of one (a collect node's output); inputs
for features this server lacks refused naming them."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from invokeai.app.nodes import Graph  # noqa: F401 - imports every family's node module
from invokeai.app.nodes.compat import can_connect
from invokeai.app.nodes.flux import FluxConditioningField, FluxDenoiseInvocation


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
