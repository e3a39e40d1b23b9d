"""The web UI in Chromium against a real invokeai-web with the demo models: generate on every family, recall an
image's settings, cancel, retry, delete, install a model, the attention panel, the token prompt and a server restart.

The tests share one server and run in this order; the last two restart it."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect
from ui_support import (
    DOC_IMAGES,
    DOC_SHOTS,
    PAGES,
    QUEUE,
    WATCH_PROGRESS,
    api,
    expect_in_gallery,
    gallery_images,
    image_names,
    invoke,
    open_page,
    select_model,
    set_number,
    shot,
    wait_for,
)
from web_server import WebServer

from invokeai.backend.families import FAMILIES

# Each registered family's first pipeline demo, which the server installs on its first start.
FAMILY_MODELS = [next(demo.name for demo in family.demos if demo.type == "main") for family in FAMILIES]
TOKEN = "ui-test-token"
# Long enough on a demo model to be caught running (a step takes a few ms), short enough to finish if not cut.
LONG_STEPS = 400


def _running_item(base: str, token: str = "") -> int:
    item = api(base, f"{QUEUE}/status", token)["queue"]["item_id"]
    return int(item) if item is not None else 0


def _progress_bar(page: Page):  # type: ignore[no-untyped-def]
    return page.get_by_role("progressbar").first


def test_the_page_is_the_ui(ui_server: WebServer, page: Page) -> None:
    page.goto(ui_server.base + "/")
    expect(page).to_have_title(re.compile("InvokeAI"))
    navigation = page.get_by_role("navigation")
    for name in PAGES:
        expect(navigation.get_by_role("link", name=re.compile(rf"^{name}\b"))).to_be_visible()
    for role, name in [("combobox", "Model"), ("textbox", "Prompt"), ("textbox", "Negative prompt")]:
        expect(page.get_by_role(role, name=name, exact=True)).to_be_visible()  # type: ignore[arg-type]
    for name in ("Width", "Height", "Steps", "Seed", "Images"):
        expect(page.get_by_role("spinbutton", name=name, exact=True)).to_be_visible()
    expect(page.get_by_role("combobox", name="Scheduler", exact=True)).to_be_visible()
    shot(page, "generate")


@pytest.mark.parametrize("model", FAMILY_MODELS)
def test_generate_on_each_family(ui_server: WebServer, page: Page, model: str) -> None:
    page.goto(ui_server.base + "/")
    name = invoke(page, model, f"a lighthouse at dusk, {model}", steps=20)
    record = api(ui_server.base, f"/api/v1/images/i/{name}")
    assert record["width"] > 0
    expect_in_gallery(page, ui_server.base)
    shot(page, f"gallery-after-{model}")


def test_open_an_image_and_recall_its_settings(ui_server: WebServer, page: Page) -> None:
    page.goto(ui_server.base + "/")
    prompt = "a red fox in fresh snow, recalled"
    invoke(page, "demo-sdxl", prompt, steps=7)
    page.reload()
    assert page.get_by_role("textbox", name="Prompt", exact=True).input_value() != prompt
    select_model(page, "demo-sd1")
    open_page(page, "Gallery")
    gallery_images(page).first.click()
    dialog = page.get_by_role("dialog")
    expect(dialog.get_by_role("link", name="Download")).to_be_visible()
    expect(dialog.get_by_role("button", name="Delete")).to_be_visible()
    shot(page, "gallery-full-view")
    dialog.get_by_role("button", name="Use these settings").click()
    expect(page.get_by_role("textbox", name="Prompt", exact=True)).to_have_value(prompt)
    expect(page.get_by_role("spinbutton", name="Steps", exact=True)).to_have_value("7")
    model = page.get_by_role("combobox", name="Model", exact=True)
    assert model.evaluate("select => select.selectedOptions[0].textContent.trim()") == "demo-sdxl"


def test_cancel_a_running_item(ui_server: WebServer, page: Page) -> None:
    page.goto(ui_server.base + "/")
    select_model(page, "demo-sd1")
    set_number(page, "Steps", LONG_STEPS)
    set_number(page, "Images", 1)
    page.get_by_role("textbox", name="Prompt", exact=True).fill("a very long walk")
    page.get_by_role("button", name="Invoke", exact=True).click()
    expect(_progress_bar(page)).to_be_visible()
    item = wait_for("an item running", lambda: _running_item(ui_server.base))
    shot(page, "generate-running", doc="progress")
    page.get_by_role("button", name="Cancel", exact=True).click()
    wait_for("the item canceled", lambda: api(ui_server.base, f"{QUEUE}/i/{item}")["status"] == "canceled", 30)
    expect(_progress_bar(page)).to_be_hidden()


def test_retry_a_canceled_item(ui_server: WebServer, page: Page) -> None:
    # An item canceled before it starts: invoked while the processor is paused, then canceled over the API.
    httpx.put(ui_server.base + f"{QUEUE}/processor/pause").raise_for_status()
    try:
        page.goto(ui_server.base + "/")
        select_model(page, "demo-sd1")
        set_number(page, "Steps", 4)
        set_number(page, "Images", 1)
        page.get_by_role("textbox", name="Prompt", exact=True).fill("a lighthouse, canceled and retried")
        page.get_by_role("button", name="Invoke", exact=True).click()
        [item] = wait_for(
            "the item pending",
            lambda: [i["item_id"] for i in api(ui_server.base, f"{QUEUE}/list?status=pending&limit=500")["items"]],
        )
        httpx.put(ui_server.base + f"{QUEUE}/i/{item}/cancel").raise_for_status()
    finally:
        httpx.put(ui_server.base + f"{QUEUE}/processor/resume").raise_for_status()
    open_page(page, "Queue")
    page.get_by_role("button", name=f"Retry item {item}", exact=True).click()

    def retried() -> int | None:
        items = api(ui_server.base, f"{QUEUE}/list?limit=500")["items"]
        return next((int(i["item_id"]) for i in items if i["retried_from_item_id"] == item), None)

    again = wait_for("the item enqueued again", retried, 30)
    # It runs to its end, so that the tests after it find that every item ran on the one worker.
    status = wait_for(
        "the retried item to end",
        lambda: (s := api(ui_server.base, f"{QUEUE}/i/{again}")["status"]) in ("completed", "failed") and s,
        120,
    )
    assert status == "completed"
    assert api(ui_server.base, f"{QUEUE}/i/{item}")["status"] == "canceled"  # the original stays as it was


def test_the_queue_page_shows_the_workers_and_where_each_item_ran(ui_server: WebServer, page: Page) -> None:
    page.goto(ui_server.base + "/")
    open_page(page, "Queue")
    [worker] = api(ui_server.base, "/api/v1/app/devices")["workers"]
    listed = page.get_by_role("list", name="Workers").get_by_role("listitem")
    expect(listed).to_have_count(1)
    expect(listed.first).to_contain_text(worker["name"])
    expect(listed.first).to_contain_text(f"{worker['items_completed']} completed")
    # The items of the tests before ran on this server's one worker: the column names it, not the host and pid
    # (an item canceled before any worker took it has no worker, and an empty cell).
    table = page.locator("table.queue-table")
    column = [cell.strip() for cell in table.locator("tbody tr td:nth-child(6)").all_inner_texts()]
    assert column and {cell for cell in column if cell} == {worker["name"]}, column


def test_delete_an_image(ui_server: WebServer, page: Page) -> None:
    page.goto(ui_server.base + "/")
    before = image_names(ui_server.base)
    open_page(page, "Gallery")
    expect(gallery_images(page)).to_have_count(len(before))
    gallery_images(page).first.click()
    page.get_by_role("dialog").get_by_role("button", name="Delete").click()
    expect(gallery_images(page)).to_have_count(len(before) - 1)
    after = image_names(ui_server.base)
    assert after == before[1:], "the newest image, the first shown, is the one deleted"


def test_install_a_model_from_a_path(ui_server: WebServer, page: Page, tmp_path: Path) -> None:
    source = tmp_path / "ui-installed-sd1"
    shutil.copytree(ui_server.root / "invokeai" / "models" / "sd-1" / "demo-sd1", source)
    page.goto(ui_server.base + "/")
    open_page(page, "Models")
    page.get_by_role("textbox", name="Model path", exact=True).fill(str(source))
    page.get_by_role("button", name="Install", exact=True).click()
    wait_for(
        "the model installed",
        lambda: any(m["source"] == str(source) for m in api(ui_server.base, "/api/v2/models/")["models"]),
    )
    expect(page.get_by_text("ui-installed-sd1").first).to_be_visible()
    shot(page, "models")
    open_page(page, "Generate")
    expect(
        page.get_by_role("combobox", name="Model", exact=True).locator("option", has_text="ui-installed-sd1")
    ).to_have_count(1)


def test_the_attention_panel_counts_the_calls(ui_server: WebServer, page: Page) -> None:
    page.goto(ui_server.base + "/")
    invoke(page, "demo-sd1", "attention, counted", steps=4)  # its own calls, also when it runs alone (-k attention)
    counts = api(ui_server.base, "/api/v1/app/attention")["counts"]
    node_types = [node for node, kernels in counts.items() if sum(kernels.values()) > 0]
    assert "sd_denoise" in node_types, counts
    page.goto(ui_server.base + "/")
    open_page(page, "Attention")
    table = page.get_by_role("region", name="Attention").get_by_role("table").first
    expect(table).to_be_visible()
    for node in node_types:
        expect(
            table.get_by_role("row").filter(has_text=re.compile(re.escape(node).replace("_", "[_ ]")))
        ).not_to_have_count(0)
    numbers = [int(cell) for cell in re.findall(r"(?<![\w.])\d+(?![\w.])", table.inner_text().replace(",", ""))]
    assert max(numbers, default=0) > 0, table.inner_text()
    denoise_calls = sum(counts["sd_denoise"].values())
    assert denoise_calls in numbers, f"sd_denoise's {denoise_calls} calls not in {table.inner_text()!r}"
    shot(page, "attention")


def test_the_attention_panel_tells_the_order_and_why(ui_server: WebServer, page: Page) -> None:
    body = api(ui_server.base, "/api/v1/app/attention")
    assert body["order_reason"] and body["ranked_for"], body
    page.goto(ui_server.base + "/")
    open_page(page, "Attention")
    region = page.get_by_role("region", name="Attention")
    expect(region.get_by_label("Ranked for")).to_have_text(f"Ranked for {body['ranked_for']}")
    expect(region.get_by_label("Why this order")).to_have_text(f"Why: {body['order_reason']}")
    expect(region.get_by_role("list", name="Ranked kernel order").get_by_role("listitem")).to_have_count(
        len(body["order"])
    )


def test_screenshots_of_each_page(ui_server: WebServer, page: Page) -> None:
    """One screenshot per page, with the images the tests above made, and one at 390x844 (no sideways scrolling);
    docs/images/ has them (WRITE_DOC_SCREENSHOTS=1 rewrites them, and those of the running item and the token
    prompt taken above)."""
    page.goto(ui_server.base + "/")
    ready = {
        "Generate": lambda: expect(page.get_by_role("combobox", name="Model", exact=True)).to_be_visible(),
        "Queue": lambda: page.wait_for_timeout(1000),
        "Gallery": lambda: expect_in_gallery(page, ui_server.base),
        "Models": lambda: expect(page.get_by_role("textbox", name="Model path", exact=True)).to_be_visible(),
        "Attention": lambda: expect(page.get_by_role("region", name="Attention")).to_be_visible(),
    }
    for name in PAGES:
        open_page(page, name)
        ready[name]()
        shot(page, name.lower(), doc=name.lower())
    page.set_viewport_size({"width": 390, "height": 844})
    open_page(page, "Generate")
    ready["Generate"]()
    width, viewport = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width <= viewport, f"at 390x844 the page is {width} px wide"
    shot(page, "mobile-390x844", doc="mobile")
    missing = [name for name in DOC_SHOTS if not (DOC_IMAGES / f"ui-{name}.png").is_file()]
    assert not missing, f"docs/images lacks ui-<name>.png for {missing}: WRITE_DOC_SCREENSHOTS=1 writes them"


def test_with_a_token_the_page_asks_for_it_and_generates(ui_server: WebServer, page: Page) -> None:
    ui_server.restart(api_token=TOKEN)
    try:
        assert httpx.get(ui_server.base + "/api/v1/app/version").status_code == 401
        page.goto(ui_server.base + "/")
        dialog = page.get_by_role("dialog")
        token_box = dialog.get_by_label("API token", exact=True)
        expect(token_box).to_be_visible()
        assert token_box.get_attribute("type") == "password"
        shot(page, "token-prompt", doc="token")
        token_box.fill(TOKEN)
        dialog.get_by_role("button", name="Save").click()
        expect(token_box).to_be_hidden()
        invoke(page, "demo-flux", "a harbour in fog, with a token", steps=12, token=TOKEN)
        expect_in_gallery(page, ui_server.base, TOKEN)
        # Kept in the browser's storage: a reload does not ask again.
        page.reload()
        open_page(page, "Generate")
        expect(page.get_by_role("combobox", name="Model", exact=True)).to_be_visible()
        expect(page.get_by_label("API token", exact=True)).to_be_hidden()
    finally:
        ui_server.restart()


def test_the_page_recovers_from_a_server_restart(ui_server: WebServer, page: Page) -> None:
    page.goto(ui_server.base + "/")
    select_model(page, "demo-sd1")
    set_number(page, "Steps", LONG_STEPS)
    page.get_by_role("textbox", name="Prompt", exact=True).fill("interrupted by a restart")
    page.get_by_role("button", name="Invoke", exact=True).click()
    expect(_progress_bar(page)).to_be_visible()
    item = wait_for("an item running", lambda: _running_item(ui_server.base))
    # The event stream is open and sending progress when the server goes.
    ui_server.restart()
    assert api(ui_server.base, f"{QUEUE}/i/{item}")["status"] != "in_progress"
    # Re-read over REST: the interrupted item is not shown as running any more.
    expect(_progress_bar(page)).to_be_hidden(timeout=30_000)
    page.evaluate(WATCH_PROGRESS)
    name = invoke(page, "demo-krea2", "after the restart", steps=20)
    expect_in_gallery(page, ui_server.base)
    assert name in image_names(ui_server.base)
    shot(page, "after-restart")
