"""InvokeAI 6.14.2's own web UI, its built frontend (invokeai/frontend/web/dist of its wheel, fetched from PyPI with
`pip download invokeai==6.14.2 --no-deps` at test time, tests/invokeai_release.py; never committed or shipped),
served by this server with `web_ui: invokeai:<folder>`, in Chromium: it starts with no uncaught page error, no
request outside 127.0.0.1 and no API call this server fails, and a user picks the demo SD-1 model, writes a prompt,
invokes, and sees the image in InvokeAI's gallery."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from invokeai_release import frontend
from playwright.sync_api import Page, Response, expect
from ui_support import shot
from web_server import WebServer

PROMPT = "a lighthouse on a rocky cliff at sunset"


@pytest.fixture(scope="module")
def invokeai_ui(tmp_path_factory: pytest.TempPathFactory, invokeai_release: Path) -> Iterator[WebServer]:
    root = tmp_path_factory.mktemp("invokeai-web-ui")
    with WebServer.running(root, web_ui=f"invokeai:{frontend(invokeai_release)}") as server:
        yield server


def _watch_api(page: Page) -> tuple[list[str], list[dict[str, Any]]]:
    """The API calls answered with an error, and the batches the page enqueued."""
    failed: list[str] = []
    batches: list[dict[str, Any]] = []

    def on_response(response: Response) -> None:
        if "/api/" in response.url and response.status >= 400:
            failed.append(f"{response.status} {response.request.method} {response.url}")

    page.on("response", on_response)
    page.on(
        "request",
        lambda request: (
            batches.append(json.loads(request.post_data or "{}")) if request.url.endswith("/enqueue_batch") else None
        ),
    )
    return failed, batches


def _pick_model(page: Page, name: str) -> None:
    # The launchpad's model picker: a button naming the selected model, which opens a searchable list.
    page.get_by_role("button", name="Close").first.click()  # InvokeAI's "What's new" popover
    picker = page.get_by_role("button", name=re.compile(r"^demo-")).first
    expect(picker).to_be_visible()
    picker.click()
    page.locator("p.picker-option:visible", has_text=re.compile(f"^{name}$")).first.click()
    expect(page.get_by_role("button", name=name, exact=True).first).to_be_visible()


def test_invokeai_web_ui_generates_an_image_into_its_gallery(invokeai_ui: WebServer, page: Page) -> None:
    failed, batches = _watch_api(page)
    page.goto(invokeai_ui.base + "/")
    expect(page.get_by_text("Generate images from text prompts.")).to_be_visible(timeout=60_000)
    shot(page, "invokeai-web-ui-start", doc="invokeai-start")
    _pick_model(page, "demo-sd1")
    page.locator("textarea").first.fill(PROMPT)
    # The demo model's images are noise at any size: the smallest InvokeAI's size inputs allow keeps it quick.
    for field in ("Width", "Height"):
        box = page.get_by_label(field, exact=True)
        box.fill("64")
        box.press("Tab")
        expect(box).to_have_value("64")
    page.locator("button:has-text('Invoke')").first.click()

    # The image is made and lands in the gallery (the uncategorized board), where InvokeAI's own server puts it.
    with httpx.Client(base_url=invokeai_ui.base) as client:
        images: list[dict[str, Any]] = []
        deadline = time.monotonic() + 120
        while not images and time.monotonic() < deadline:
            images = client.get("/api/v1/images/", params={"is_intermediate": "false"}).json()["items"]
            time.sleep(0.5)
        assert len(images) == 1, images
        name = images[0]["image_name"]
        expect(page.locator(f"[data-item-id='{name}'] img")).to_be_visible(timeout=30_000)
        shot(page, "invokeai-web-ui-generated", doc="invokeai-generated")
        metadata = client.get(f"/api/v1/images/i/{name}/metadata").json()
    [batch] = batches
    nodes = {node["type"] for node in batch["batch"]["graph"]["nodes"].values()}
    assert {"main_model_loader", "compel", "denoise_latents", "l2i"} <= nodes
    assert metadata["positive_prompt"] == PROMPT and metadata["model"]["name"] == "demo-sd1"
    assert not failed, failed
