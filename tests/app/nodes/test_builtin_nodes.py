"""Each built-in node's invoke, with a real images service: values, pixels, sizes, and what is stored."""

from __future__ import annotations

import json

import pytest
from node_support import ContextFactory
from PIL import Image

from invokeai.app.nodes.base import CanceledError, ImageField
from invokeai.app.nodes.image import (
    BlankImageInvocation,
    ColorField,
    ImageBlendInvocation,
    ImageOutput,
    ImageResizeInvocation,
    ResampleMode,
)
from invokeai.app.nodes.primitives import (
    BooleanInvocation,
    FloatInvocation,
    IntegerInvocation,
    RandomIntInvocation,
    StringInvocation,
)
from invokeai.app.services.images import GRAPH_KEY, METADATA_KEY, ImageService


def _store(images: ImageService, image: Image.Image) -> ImageField:
    return ImageField(image_name=images.save(image).image_name)


def test_primitives_return_their_value(make_context: ContextFactory) -> None:
    context = make_context()
    assert IntegerInvocation(id="n", value=-4).invoke(context).value == -4
    assert FloatInvocation(id="n", value=0.25).invoke(context).value == 0.25
    assert StringInvocation(id="n", value="héllo").invoke(context).value == "héllo"
    assert BooleanInvocation(id="n", value=True).invoke(context).value is True
    assert IntegerInvocation(id="n").invoke(context).type == "integer_output"


def test_rand_int_is_seeded_and_in_range(make_context: ContextFactory) -> None:
    context = make_context()
    values = [RandomIntInvocation(id="n", low=10, high=20, seed=seed).invoke(context).value for seed in range(50)]
    assert all(10 <= value < 20 for value in values)
    assert len(set(values)) > 3
    again = [RandomIntInvocation(id="n", low=10, high=20, seed=seed).invoke(context).value for seed in range(50)]
    assert again == values
    assert RandomIntInvocation(id="n", low=3, high=4, seed=9).invoke(context).value == 3


def test_rand_int_refuses_an_empty_range() -> None:
    with pytest.raises(ValueError, match=r"high \(5\) must be greater than low \(5\)"):
        RandomIntInvocation(id="n", low=5, high=5)


def test_blank_image_has_its_size_and_color(make_context: ContextFactory, images: ImageService) -> None:
    output = BlankImageInvocation(id="a", width=48, height=32, color="#ff0000").invoke(make_context("a", "blank_image"))
    assert isinstance(output, ImageOutput)
    assert (output.width, output.height) == (48, 32)
    image = images.get_pil(output.image.image_name)
    assert image.size == (48, 32)
    assert image.mode == "RGB"
    assert image.getextrema() == ((255, 255), (0, 0), (0, 0))


def test_blank_image_with_alpha(make_context: ContextFactory, images: ImageService) -> None:
    color = ColorField(r=0, g=128, b=255, a=64)
    output = BlankImageInvocation(id="a", width=3, height=2, mode="RGBA", color=color).invoke(make_context())
    image = images.get_pil(output.image.image_name)
    assert image.mode == "RGBA"
    assert image.getpixel((2, 1)) == (0, 128, 255, 64)


def test_blank_image_rgb_drops_alpha_as_invokeai_does(make_context: ContextFactory, images: ImageService) -> None:
    # InvokeAI's default mode is RGB whatever the color's alpha; a "#rrggbbaa" string is read into the ColorField.
    output = BlankImageInvocation(id="a", width=3, height=2, color="#0080FF40").invoke(make_context())
    image = images.get_pil(output.image.image_name)
    assert image.mode == "RGB"
    assert image.getpixel((2, 1)) == (0, 128, 255)


def test_blank_image_records_the_node_and_graph(make_context: ContextFactory, images: ImageService) -> None:
    graph = {"id": "g9", "nodes": {"a": {"id": "a", "type": "blank_image"}}, "edges": []}
    output = BlankImageInvocation(id="a", width=4, height=4).invoke(make_context("a", "blank_image", graph))
    record = images.get_record(output.image.image_name)
    assert (record.origin, record.session_id, record.node_id) == ("generated", "session-1", "a")
    with Image.open(images.full_path(record.image_name)) as png:
        assert json.loads(png.text[GRAPH_KEY]) == graph
        # No settings were given (no core_metadata): InvokeAI's metadata chunk is left out, as InvokeAI does.
        assert METADATA_KEY not in png.text
    assert images.get_metadata(record.image_name) is None


def test_image_resize(make_context: ContextFactory, images: ImageService) -> None:
    source = Image.new("RGB", (40, 20), (10, 200, 30))
    source.paste((250, 250, 250), (0, 0, 20, 20))
    node = ImageResizeInvocation(
        id="r", image=_store(images, source), width=4, height=2, resample_mode=ResampleMode.NEAREST
    )
    output = node.invoke(make_context())
    assert (output.width, output.height) == (4, 2)
    resized = images.get_pil(output.image.image_name)
    assert resized.size == (4, 2)
    assert resized.getpixel((0, 0)) == (250, 250, 250)
    assert resized.getpixel((3, 1)) == (10, 200, 30)
    assert output.image.image_name != node.image.image_name


def test_image_blend_mixes_by_alpha_and_resizes_b(make_context: ContextFactory, images: ImageService) -> None:
    a = _store(images, Image.new("RGB", (6, 4), (200, 0, 100)))
    b = _store(images, Image.new("RGB", (3, 2), (0, 100, 100)))
    output = ImageBlendInvocation(id="m", image_a=a, image_b=b, alpha=0.25).invoke(make_context())
    blended = images.get_pil(output.image.image_name)
    assert blended.size == (6, 4)
    assert (output.width, output.height) == (6, 4)
    assert blended.getpixel((5, 3)) == (150, 25, 100)
    for alpha, expected in ((0.0, (200, 0, 100)), (1.0, (0, 100, 100))):
        output = ImageBlendInvocation(id="m", image_a=a, image_b=b, alpha=alpha).invoke(make_context())
        assert images.get_pil(output.image.image_name).getpixel((0, 0)) == expected


def test_image_blend_keeps_transparency(make_context: ContextFactory, images: ImageService) -> None:
    a = _store(images, Image.new("RGB", (2, 2), (100, 100, 100)))
    b = _store(images, Image.new("RGBA", (2, 2), (0, 0, 0, 0)))
    output = ImageBlendInvocation(id="m", image_a=a, image_b=b, alpha=0.5).invoke(make_context())
    blended = images.get_pil(output.image.image_name)
    assert blended.mode == "RGBA"
    assert blended.getpixel((0, 0)) == (50, 50, 50, 127)  # 127.5, truncated by Pillow


def test_image_nodes_stop_when_canceled(make_context: ContextFactory, images: ImageService) -> None:
    factory = make_context
    factory.canceled = True
    with pytest.raises(CanceledError):
        BlankImageInvocation(id="a", width=4, height=4).invoke(factory())
    node = ImageResizeInvocation(id="r", image=_store(images, Image.new("RGB", (4, 4))), width=2, height=2)
    with pytest.raises(CanceledError):
        node.invoke(factory())
    # Only the image stored above as the resize's input; the canceled nodes stored nothing.
    assert images.list()[1] == 1


def test_context_progress_reports_and_checks_cancel(make_context: ContextFactory) -> None:
    context = make_context()
    preview = Image.new("RGB", (2, 2))
    context.progress(1, 3, lambda: preview)
    context.progress(2, 3)
    assert make_context.progress == [(1, 3, preview), (2, 3, None)]
    make_context.canceled = True
    with pytest.raises(CanceledError, match="'n'"):
        context.progress(3, 3)
    assert len(make_context.progress) == 2


def test_a_graph_like_the_acceptance_check(run_graph, images: ImageService) -> None:  # type: ignore[no-untyped-def]
    from invokeai.app.nodes.graph import Graph, validate_graph

    graph = Graph.model_validate(
        {
            "id": "g1",
            "nodes": {
                "a": {"id": "a", "type": "blank_image", "width": 48, "height": 32, "color": "#ff0000"},
                "b": {"id": "b", "type": "image_resize", "width": 24, "height": 16},
            },
            "edges": [
                {"source": {"node_id": "a", "field": "image"}, "destination": {"node_id": "b", "field": "image"}}
            ],
        }
    )
    validate_graph(graph)
    outputs = run_graph(graph)
    resized = images.get_pil(outputs["b"].image.image_name)  # type: ignore[attr-defined]
    assert resized.size == (24, 16)
    assert resized.getpixel((12, 8)) == (255, 0, 0)
    assert images.list()[1] == 2
