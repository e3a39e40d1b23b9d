"""The web UI knows no model family of its own: the picker's groups, labels and controls, and the graphs it
enqueues, come from GET /api/v1/app/families. Checked on the server's real families, and on an answer the test
rewrites (the real families in reverse order, plus a loader-style family the server does not have), whose graphs
are caught at the enqueue and never run."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo
from playwright.sync_api import Page, Route, expect
from ui_support import api, gallery_images, image_names, open_page, select_model, set_number, wait_for
from web_server import WebServer

ENQUEUE = "**/api/v1/queue/default/enqueue_batch"
# A family the server does not run, shaped like InvokeAI's Z-Image: one loader node feeds every other node.
LOADER_FAMILY: dict[str, Any] = {
    "name": "ui-test-loader-family",
    "label": "Loader family (from the test)",
    "nodes": {
        "text_encoder": "ui_test_text_encoder",
        "denoise": "ui_test_denoise",
        "decode": "ui_test_l2i",
        "encode": "ui_test_i2l",
        "loader": "ui_test_model_loader",
    },
    "loader_links": {
        "text_encoder": [{"output": "qwen3_encoder", "input": "qwen3_encoder"}],
        "denoise": [{"output": "transformer", "input": "transformer"}],
        "decode": [{"output": "vae", "input": "vae"}],
        "encode": [{"output": "vae", "input": "vae"}],
    },
    "conditioning_field": "positive_conditioning",
    "negative": "always",
    "second_prompt_label": None,
    "guidance": {"field": "guidance_scale", "label": "Guidance scale", "off": 1},
    "size_multiple": 16,
    "defaults": {"width": 1024, "height": 1024, "steps": 8, "guidance": 1.0},
    "image_to_image": True,
    "strength_field": "denoising_start",
    "demos": [],
}
LOADER_MODEL = "ui-test-loader-model"


def _picker_groups(page: Page) -> list[str]:
    select = page.get_by_role("combobox", name="Model", exact=True)
    expect(select.locator("optgroup").first).to_be_attached()
    return list(select.locator("optgroup").evaluate_all("groups => groups.map(g => g.label)"))


def _edges(graph: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    return {
        (e["source"]["node_id"], e["source"]["field"], e["destination"]["node_id"], e["destination"]["field"])
        for e in graph["edges"]
    }


def _expected_shape(entry: dict[str, Any], *, negative: bool, image: bool) -> tuple[dict[str, str], set[tuple]]:
    """The node types by id and the edges the entry prescribes (prompt -> encoder -> denoise -> decode, image ->
    encode -> denoise; with a loader, its outputs into every other node by role)."""
    nodes = entry["nodes"]
    types = {"positive": nodes["text_encoder"], "denoise": nodes["denoise"], "decode": nodes["decode"]}
    edges = {
        ("positive", "conditioning", "denoise", entry["conditioning_field"]),
        ("denoise", "latents", "decode", "latents"),
    }
    if negative:
        types["negative"] = nodes["text_encoder"]
        edges.add(("negative", "conditioning", "denoise", "negative_conditioning"))
    if image:
        types["encode"] = nodes["encode"]
        edges.add(("encode", "latents", "denoise", "latents"))
    roles = {"positive": "text_encoder", "negative": "text_encoder", "denoise": "denoise", "decode": "decode"}
    roles["encode"] = "encode"
    if nodes["loader"]:
        for node_id in list(types):
            for link in entry["loader_links"].get(roles[node_id], []):
                edges.add(("loader", link["output"], node_id, link["input"]))
        types["loader"] = nodes["loader"]
    return types, edges


def check_graph(graph: dict[str, Any], entry: dict[str, Any], model: str, *, negative: bool, image: bool) -> None:
    types, edges = _expected_shape(entry, negative=negative, image=image)
    assert {node_id: node["type"] for node_id, node in graph["nodes"].items()} == types
    assert _edges(graph) == edges
    if entry["nodes"]["loader"]:
        assert graph["nodes"]["loader"]["model"] == {"name": model}
        with_model = [node_id for node_id, node in graph["nodes"].items() if node_id != "loader" and "model" in node]
        assert not with_model, f"with a loader only the loader names the model: {with_model}"
    else:
        assert graph["nodes"]["denoise"]["model"] == {"name": model}
        assert all("model" in node for node in graph["nodes"].values())
    assert entry["guidance"]["field"] in graph["nodes"]["denoise"]
    assert entry.get("steps_field", "steps") in graph["nodes"]["denoise"]  # FLUX.1's is InvokeAI's num_steps


def _catch_enqueues(page: Page) -> list[dict[str, Any]]:
    """The batches the page enqueues, answered with an error instead of run."""
    caught: list[dict[str, Any]] = []

    def catch(route: Route) -> None:
        caught.append(route.request.post_data_json)
        route.fulfill(status=418, json={"detail": "caught by the test"})

    page.route(ENQUEUE, catch)
    return caught


def _upload(page: Page, base: str, path: Path) -> str:
    path.write_bytes(_png())
    before = set(image_names(base))
    page.get_by_label("Upload source image", exact=True).set_input_files(str(path))
    expect(page.get_by_role("button", name="Clear source image")).to_be_visible()
    [uploaded] = wait_for("the upload", lambda: set(image_names(base)) - before)
    return str(uploaded)


def _node_schema(schemas: dict[str, Any], node_type: str) -> dict[str, Any]:
    [schema] = [s for s in schemas.values() if s.get("properties", {}).get("type", {}).get("const") == node_type]
    return dict(schema["properties"])


def test_each_real_familys_graph_is_built_from_its_entry(ui_server: WebServer, page: Page, tmp_path: Path) -> None:
    families = api(ui_server.base, "/api/v1/app/families")
    models = api(ui_server.base, "/api/v2/models/")["models"]
    schemas = api(ui_server.base, "/openapi.json")["components"]["schemas"]
    caught = _catch_enqueues(page)
    page.goto(ui_server.base + "/")
    # Every family has a demo model, so every family is a group, in the endpoint's order.
    assert _picker_groups(page) == [f["label"] for f in families]
    for entry in families:
        model = next(m["name"] for m in models if m["family"] == entry["name"] and m["pipeline"])
        page.reload()
        select_model(page, model)
        guidance = page.get_by_role("spinbutton", name=entry["guidance"]["label"], exact=True)
        expect(guidance).to_have_value(f"{entry['defaults']['guidance']:g}")
        if entry["second_prompt_label"] is None:
            expect(page.locator("#gen-prompt2")).to_have_count(0)
        else:
            second = page.get_by_role("textbox", name=f"{entry['second_prompt_label']} (optional)", exact=True)
            second.fill("the second prompt")
        # A negative prompt is wired in when one is given, except where the family takes none, or where it guides
        # only above `off` and its default guidance is off (Z-Image Turbo's CFG 1).
        negative = entry["negative"] == "when_given" or (
            entry["negative"] == "always" and entry["defaults"]["guidance"] > entry["guidance"]["off"]
        )
        negative_box = page.get_by_role("textbox", name="Negative prompt", exact=True)
        if entry["negative"] == "never":
            expect(negative_box).to_be_disabled()
        else:
            negative_box.fill("blurry")
        set_number(page, "Images", 1)
        page.get_by_role("textbox", name="Prompt", exact=True).fill(f"graph of {entry['name']}")
        page.get_by_role("button", name="Invoke", exact=True).click()
        wait_for(f"the enqueue for {entry['name']}", lambda: caught, within=20)
        graph = caught.pop()["batch"]["graph"]
        check_graph(graph, entry, model, negative=negative, image=False)
        positive = graph["nodes"]["positive"]
        assert positive["prompt"] == f"graph of {entry['name']}"
        assert positive.get("prompt_2") == ("the second prompt" if entry["second_prompt_label"] else None)
        # A scheduler goes in only where the denoise node's schema has one.
        denoise_fields = _node_schema(schemas, entry["nodes"]["denoise"])
        assert ("scheduler" in graph["nodes"]["denoise"]) == ("scheduler" in denoise_fields), entry["name"]

        legend = page.locator("fieldset.i2i legend")
        if not entry["image_to_image"]:
            expect(page.get_by_label("Upload source image", exact=True)).to_be_disabled()
            expect(legend).to_contain_text(f"not available for {entry['label']}")
            continue
        uploaded = _upload(page, ui_server.base, tmp_path / f"{entry['name']}.png")
        page.get_by_role("button", name="Invoke", exact=True).click()
        wait_for(f"the image-to-image enqueue for {entry['name']}", lambda: caught, within=20)
        graph = caught.pop()["batch"]["graph"]
        check_graph(graph, entry, model, negative=negative, image=True)
        assert graph["nodes"]["encode"]["image"] == {"image_name": uploaded}
        encode_fields = _node_schema(schemas, entry["nodes"]["encode"])
        assert ("seed" in graph["nodes"]["encode"]) == ("seed" in encode_fields), entry["name"]
        strength = graph["nodes"]["denoise"][entry["strength_field"]]
        assert strength == pytest.approx(0.6 if entry["strength_field"] == "denoising_strength" else 0.4)


def _png(metadata: dict[str, Any] | None = None) -> bytes:
    info = PngInfo()
    if metadata is not None:
        info.add_text("invokeai_metadata", json.dumps(metadata))
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (40, 90, 160)).save(out, format="PNG", pnginfo=info)
    return out.getvalue()


def test_the_families_come_from_the_endpoint(ui_server: WebServer, page: Page, tmp_path: Path) -> None:
    """The answer rewritten: the picker follows its order and labels, and a loader family the UI cannot know of
    gets its graphs (text and image to image), and its settings read back from an image's metadata."""
    real = api(ui_server.base, "/api/v1/app/families")
    answer = [*reversed(real), LOADER_FAMILY]
    models = api(ui_server.base, "/api/v2/models/")
    template = next(m for m in models["models"] if m["pipeline"])
    fake = {**template, "key": "ui-test-loader-key", "name": LOADER_MODEL, "family": LOADER_FAMILY["name"]}
    # A model of a family the answer does not list is not offered.
    stray = {**template, "key": "ui-test-stray-key", "name": "ui-test-stray-model", "family": "ui-test-unlisted"}
    # Nor is a lone part of a listed family (a text encoder or VAE file): graphs name it beside a model.
    part = {**fake, "key": "ui-test-part-key", "name": "ui-test-vae-file", "type": "vae", "format": "checkpoint"}
    caught = _catch_enqueues(page)
    page.route("**/api/v1/app/families", lambda route: route.fulfill(json=answer))
    listed = {**models, "models": [*models["models"], fake, stray, part]}
    page.route("**/api/v2/models/", lambda route: route.fulfill(json=listed))
    page.goto(ui_server.base + "/")
    assert _picker_groups(page) == [f["label"] for f in answer]
    picker = page.get_by_role("combobox", name="Model", exact=True)
    expect(picker.locator("option", has_text="ui-test-stray-model")).to_have_count(0)
    expect(picker.locator("option", has_text="ui-test-vae-file")).to_have_count(0)
    group = picker.locator(f"optgroup[label='{LOADER_FAMILY['label']}'] option")
    expect(group).to_have_text([LOADER_MODEL])

    # Text to image at guidance off: no negative encoder; the loader feeds every node.
    select_model(page, LOADER_MODEL)
    expect(page.get_by_role("spinbutton", name="Guidance scale", exact=True)).to_have_value("1")
    expect(page.locator("#gen-prompt2")).to_have_count(0)
    expect(page.get_by_role("combobox", name="Scheduler", exact=True)).to_be_disabled()
    set_number(page, "Images", 1)
    page.get_by_role("textbox", name="Prompt", exact=True).fill("a loader family's picture")
    page.get_by_role("textbox", name="Negative prompt", exact=True).fill("fog")
    page.get_by_role("button", name="Invoke", exact=True).click()
    wait_for("the text-to-image enqueue caught", lambda: caught, within=20)
    graph = caught[-1]["batch"]["graph"]
    check_graph(graph, LOADER_FAMILY, LOADER_MODEL, negative=False, image=False)
    assert graph["nodes"]["denoise"]["guidance_scale"] == 1
    assert "scheduler" not in graph["nodes"]["denoise"]

    # Image to image with guidance on: the negative encoder, the encode node, denoising_start = 1 - strength.
    uploaded = _upload(page, ui_server.base, tmp_path / "source.png")
    set_number(page, "Guidance scale", 4)
    set_number(page, "Images", 2)
    page.get_by_role("button", name="Invoke", exact=True).click()
    wait_for("the image-to-image enqueue caught", lambda: len(caught) == 2, within=20)
    batch = caught[-1]["batch"]
    graph = batch["graph"]
    check_graph(graph, LOADER_FAMILY, LOADER_MODEL, negative=True, image=True)
    denoise = graph["nodes"]["denoise"]
    assert denoise["guidance_scale"] == 4
    assert denoise["denoising_start"] == pytest.approx(0.4)
    assert "denoising_strength" not in denoise
    assert graph["nodes"]["encode"]["image"] == {"image_name": uploaded}
    assert "seed" not in graph["nodes"]["encode"], "the encode node has no seed input in any schema"
    assert graph["nodes"]["negative"]["prompt"] == "fog"
    [[seeds]] = batch["data"]
    assert (seeds["node_path"], seeds["field_name"], len(seeds["items"])) == ("denoise", "seed", 2)

    # "Use these settings" on an image made by that graph (its PNG's metadata, served by the test).
    metadata = {"graph": {**graph, "nodes": {**graph["nodes"], "denoise": {**denoise, "steps": 11, "seed": 1234}}}}
    page.route(
        f"**/api/v1/images/i/{uploaded}/full",
        lambda route: route.fulfill(body=_png(metadata), content_type="image/png"),
    )
    page.get_by_role("textbox", name="Prompt", exact=True).fill("something else")
    select_model(page, template["name"])
    open_page(page, "Gallery")
    gallery_images(page).first.click()
    page.get_by_role("dialog").get_by_role("button", name="Use these settings").click()
    expect(page.get_by_role("textbox", name="Prompt", exact=True)).to_have_value("a loader family's picture")
    expect(page.get_by_role("textbox", name="Negative prompt", exact=True)).to_have_value("fog")
    expect(page.get_by_role("spinbutton", name="Steps", exact=True)).to_have_value("11")
    expect(page.get_by_role("spinbutton", name="Seed", exact=True)).to_have_value("1234")
    expect(page.get_by_role("spinbutton", name="Guidance scale", exact=True)).to_have_value("4")
    expect(page.get_by_text("Strength 0.60")).to_be_visible()
    assert picker.evaluate("select => select.selectedOptions[0].textContent.trim()") == LOADER_MODEL
