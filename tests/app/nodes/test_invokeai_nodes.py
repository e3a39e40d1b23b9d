"""InvokeAI's node types that its linear SD-1 and SDXL graphs use: the same names, inputs, defaults and outputs as
InvokeAI 6.14.2's (the table below is read from its invokeai/app/invocations sources), and InvokeAI's `collect`:
several edges into `item`, the collected values in order, and InvokeAI's type rules for what goes in and out."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from node_support import ContextFactory

from invokeai.app.nodes.base import BaseInvocationOutput, invocation_class
from invokeai.app.nodes.graph import Graph, GraphValidationError, validate_graph

REQUIRED = object()

# node type -> (its inputs and their defaults, REQUIRED where it has none; its output type and output fields), as
# InvokeAI 6.14.2 declares them.
INVOKEAI_NODES: dict[str, tuple[dict[str, Any], str, set[str]]] = {
    "main_model_loader": ({"model": REQUIRED}, "model_loader_output", {"unet", "clip", "vae"}),
    "sdxl_model_loader": ({"model": REQUIRED}, "sdxl_model_loader_output", {"unet", "clip", "clip2", "vae"}),
    "vae_loader": ({"vae_model": REQUIRED}, "vae_output", {"vae"}),
    "clip_skip": ({"clip": REQUIRED, "skipped_layers": 0}, "clip_skip_output", {"clip"}),
    "compel": ({"prompt": "", "clip": REQUIRED, "mask": None}, "conditioning_output", {"conditioning"}),
    "sdxl_compel_prompt": (
        {
            "prompt": "",
            "style": "",
            "original_width": 1024,
            "original_height": 1024,
            "crop_top": 0,
            "crop_left": 0,
            "target_width": 1024,
            "target_height": 1024,
            "clip": REQUIRED,
            "clip2": REQUIRED,
            "mask": None,
        },
        "conditioning_output",
        {"conditioning"},
    ),
    "collect": ({"item": None, "collection": []}, "collect_output", {"collection"}),
    "noise": (
        {"noise_type": "SD", "seed": 0, "width": 512, "height": 512, "use_cpu": True},
        "noise_output",
        {"noise", "width", "height"},
    ),
    "denoise_latents": (
        {
            "positive_conditioning": REQUIRED,
            "negative_conditioning": REQUIRED,
            "noise": None,
            "steps": 10,
            "cfg_scale": 7.5,
            "denoising_start": 0.0,
            "denoising_end": 1.0,
            "scheduler": "euler",
            "unet": REQUIRED,
            "control": None,
            "ip_adapter": None,
            "t2i_adapter": None,
            "cfg_rescale_multiplier": 0,
            "hidiffusion": False,
            "hidiffusion_raunet": True,
            "hidiffusion_window_attn": True,
            "hidiffusion_t1_ratio": 0.4,
            "hidiffusion_t2_ratio": 0.0,
            "latents": None,
            "denoise_mask": None,
        },
        "latents_output",
        {"latents", "width", "height"},
    ),
    "l2i": (
        {
            "board": None,
            "metadata": None,
            "latents": REQUIRED,
            "vae": REQUIRED,
            "tiled": False,
            "tile_size": 0,
            "fp32": False,
        },
        "image_output",
        {"image", "width", "height"},
    ),
    "i2l": (
        {
            "image": REQUIRED,
            "vae": REQUIRED,
            "tiled": False,
            "tile_size": 0,
            "fp32": False,
            "color_compensation": "None",
        },
        "latents_output",
        {"latents", "width", "height"},
    ),
    "img_resize": (
        {"board": None, "metadata": None, "image": REQUIRED, "width": 512, "height": 512, "resample_mode": "bicubic"},
        "image_output",
        {"image", "width", "height"},
    ),
    "integer": ({"value": 0}, "integer_output", {"value"}),
    "string": ({"value": ""}, "string_output", {"value"}),
    "rand_int": ({"low": 0, "high": 2147483647}, "integer_output", {"value"}),
}

CORE_METADATA_FIELDS = (
    "generation_mode positive_prompt negative_prompt width height seed rand_device cfg_scale cfg_rescale_multiplier "
    "steps scheduler seamless_x seamless_y clip_skip model controlnets ipAdapters t2iAdapters loras strength "
    "init_image vae qwen3_encoder mistral_encoder ideogram4_caption hrf_enabled hrf_method hrf_strength "
    "positive_style_prompt negative_style_prompt refiner_model refiner_cfg_scale refiner_steps refiner_scheduler "
    "refiner_positive_aesthetic_score refiner_negative_aesthetic_score refiner_start"
).split()

# InvokeAI declares these never cached (use_cache=False on the node type).
NOT_CACHED = {"collect", "rand_int"}


@pytest.mark.parametrize("node_type", sorted(INVOKEAI_NODES))
def test_each_node_has_invokeais_inputs_defaults_and_outputs(node_type: str) -> None:
    inputs, output_type, outputs = INVOKEAI_NODES[node_type]
    cls = invocation_class(node_type)
    assert cls is not None, node_type
    specs = cls.input_specs()
    assert set(inputs) <= set(specs), set(inputs) - set(specs)
    for name, default in inputs.items():
        if default is REQUIRED:
            assert specs[name].required, name
        else:
            assert not specs[name].required, name
            assert cls.model_fields[name].get_default(call_default_factory=True) == default, name
    output = cls.output_class()
    assert output.model_fields["type"].default == output_type
    assert set(output.output_fields()) == outputs
    assert cls.model_fields["use_cache"].default is (node_type not in NOT_CACHED)


def test_core_metadata_has_invokeais_fields_all_optional_and_keeps_extra_ones(make_context: ContextFactory) -> None:
    cls = invocation_class("core_metadata")
    assert cls is not None
    specs = cls.input_specs()
    assert set(CORE_METADATA_FIELDS) <= set(specs)
    assert not any(spec.required for spec in specs.values())
    node = cls.model_validate(
        {"id": "m", "type": "core_metadata", "seed": 7, "model": {"key": "k", "name": "n"}, "ref_images": [1]}
    )
    metadata = node.invoke(make_context("m", "core_metadata")).metadata.root  # type: ignore[attr-defined]
    assert {k: v for k, v in metadata.items() if k != "app_version"} == {
        "seed": 7,
        "model": {"key": "k", "name": "n"},
        "ref_images": [1],
    }


def test_clip_skip_adds_its_layers_to_the_clips(make_context: ContextFactory) -> None:
    cls = invocation_class("clip_skip")
    model = {"key": "k"}
    clip = {"tokenizer": model, "text_encoder": model, "skipped_layers": 1, "loras": []}
    node = cls.model_validate({"id": "c", "type": "clip_skip", "clip": clip, "skipped_layers": 2})  # type: ignore[union-attr]
    assert node.invoke(make_context("c", "clip_skip")).clip.skipped_layers == 3  # type: ignore[attr-defined]


def test_noise_wraps_seeds_into_its_range_as_invokeai_does() -> None:
    cls = invocation_class("noise")
    assert cls.model_validate({"id": "n", "type": "noise", "seed": 2**32 + 5}).seed == 5  # type: ignore[union-attr,attr-defined]
    assert cls.model_validate({"id": "n", "type": "noise", "seed": -1}).seed == 2**32 - 1  # type: ignore[union-attr,attr-defined]


# --- collect ---------------------------------------------------------------------------------------------------


def edge(source: str, destination: str) -> dict[str, Any]:
    (source_node, source_field), (destination_node, destination_field) = (
        source.split("."),
        destination.split("."),
    )
    return {
        "source": {"node_id": source_node, "field": source_field},
        "destination": {"node_id": destination_node, "field": destination_field},
    }


def graph(nodes: dict[str, dict[str, Any]], edges: list[dict[str, Any]]) -> Graph:
    return Graph.model_validate({"nodes": {k: {"id": k, **v} for k, v in nodes.items()}, "edges": edges})


RunGraph = Callable[[Graph], dict[str, BaseInvocationOutput]]


def test_collect_takes_several_items_in_the_order_of_their_source_ids(run_graph: RunGraph) -> None:
    g = graph(
        {
            "c": {"type": "integer", "value": 3},
            "a": {"type": "integer", "value": 1},
            "b": {"type": "integer", "value": 2},
            "collect": {"type": "collect"},
        },
        [edge("c.value", "collect.item"), edge("a.value", "collect.item"), edge("b.value", "collect.item")],
    )
    assert run_graph(g)["collect"].collection == [1, 2, 3]  # type: ignore[attr-defined]


def test_a_collected_collection_comes_before_the_items(run_graph: RunGraph) -> None:
    g = graph(
        {
            "x": {"type": "integer", "value": 9},
            "first": {"type": "collect"},
            "y": {"type": "integer", "value": 1},
            "second": {"type": "collect"},
        },
        [edge("x.value", "first.item"), edge("first.collection", "second.collection"), edge("y.value", "second.item")],
    )
    assert run_graph(g)["second"].collection == [9, 1]  # type: ignore[attr-defined]


def test_only_collects_item_takes_several_edges() -> None:
    g = graph(
        {"a": {"type": "integer"}, "b": {"type": "integer"}, "f": {"type": "float"}},
        [edge("a.value", "f.value"), edge("b.value", "f.value")],
    )
    with pytest.raises(GraphValidationError, match="an input takes at most one edge"):
        validate_graph(g)


@pytest.mark.parametrize(
    ("nodes", "edges", "message"),
    [
        ({"collect": {"type": "collect"}}, [], "a collect node needs at least one edge into 'item' or 'collection'"),
        (
            {"i": {"type": "integer"}, "s": {"type": "string"}, "collect": {"type": "collect"}},
            [edge("i.value", "collect.item"), edge("s.value", "collect.item")],
            "its items must be of one type; its edges bring int, str",
        ),
        (
            {"i": {"type": "integer"}, "collect": {"type": "collect"}, "f": {"type": "float"}},
            [edge("i.value", "collect.item"), edge("collect.collection", "f.value")],
            "does not fit input type float",
        ),
        (
            {
                "i": {"type": "integer"},
                "collect": {"type": "collect"},
                "m": {"type": "core_metadata"},
            },
            [edge("i.value", "collect.item"), edge("collect.collection", "m.loras")],
            "node 'collect' collects int, which input 'loras'",
        ),
    ],
)
def test_collect_is_checked_as_invokeai_checks_it(
    nodes: dict[str, dict[str, Any]], edges: list[dict[str, Any]], message: str
) -> None:
    with pytest.raises(GraphValidationError, match=message):
        validate_graph(graph(nodes, edges))


def test_a_stored_collect_reads_back_as_it_was_sent() -> None:
    g = graph({"i": {"type": "integer"}, "collect": {"type": "collect"}}, [edge("i.value", "collect.item")])
    again = Graph.model_validate(g.model_dump(mode="json"))
    validate_graph(again)
    assert not {"item", "collection"} & again.nodes["collect"].model_fields_set
