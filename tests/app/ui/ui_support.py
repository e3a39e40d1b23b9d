"""What the browser tests share: the page's controls by the roles and names the UI promises, the server's own
answers (to check the page against), and screenshots."""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Locator, Page, expect

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[3]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
DOC_IMAGES = REPO / "docs" / "images"
PAGES = ("Generate", "Queue", "Gallery", "Models", "Attention")
# What docs/ui.md shows besides the pages: the running item, the token prompt, the narrow layout.
DOC_SHOTS = (*(name.lower() for name in PAGES), "progress", "token", "mobile")
QUEUE = "/api/v1/queue/default"
# Records every value the progress bar takes, in the page, as the DOM changes: a demo model's step takes a few ms,
# too fast to catch by asking from here.
WATCH_PROGRESS = """() => {
  window.__progress = [];
  const record = () => {
    for (const bar of document.querySelectorAll('[role=progressbar], progress')) {
      const value = Number(bar.getAttribute('aria-valuenow') ?? bar.value);
      if (!Number.isNaN(value)) window.__progress.push(value);
    }
  };
  window.__progressObserver?.disconnect();
  window.__progressObserver = new MutationObserver(record);
  window.__progressObserver.observe(document.body, {subtree: true, childList: true, attributes: true,
                                                    characterData: true});
}"""


def shot(page: Page, name: str, *, doc: str = "") -> Path:
    """A screenshot under test-artifacts/screenshots/; with `doc`, also docs/images/ui-<doc>.png (for docs/ui.md)
    when WRITE_DOC_SCREENSHOTS=1: otherwise every test run would change committed files."""
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if doc and os.environ.get("WRITE_DOC_SCREENSHOTS") == "1":
        DOC_IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOC_IMAGES / f"ui-{doc}.png")
    return path


def wait_for(what: str, condition: Callable[[], Any], within: float = 60) -> Any:
    deadline = time.monotonic() + within
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        time.sleep(0.1)


def api(base: str, path: str, token: str = "") -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    response = httpx.get(base + path, headers=headers, timeout=30)
    response.raise_for_status()
    return response.json()


def image_names(base: str, token: str = "") -> list[str]:
    return [image["image_name"] for image in api(base, "/api/v1/images/?limit=100", token)["items"]]


def open_page(page: Page, name: str) -> None:
    page.get_by_role("navigation").get_by_role("link", name=re.compile(rf"^{name}\b")).click()


def gallery_images(page: Page) -> Locator:
    return page.get_by_role("region", name="Gallery").locator("img")


def select_model(page: Page, name: str) -> None:
    page.get_by_role("combobox", name="Model", exact=True).select_option(label=name)


def set_number(page: Page, label: str, value: int) -> None:
    field = page.get_by_role("spinbutton", name=label, exact=True)
    field.fill(str(value))
    field.blur()


def invoke(page: Page, model: str, prompt: str, *, steps: int | None = None, token: str = "") -> str:
    """Generate one image on the Generate page with `model`, see the progress bar move, and return the new image's
    name once the server has it."""
    base = re.match(r"https?://[^/]+", page.url).group(0)  # type: ignore[union-attr]
    before = set(image_names(base, token))
    open_page(page, "Generate")
    select_model(page, model)
    if steps is not None:
        set_number(page, "Steps", steps)
    set_number(page, "Images", 1)
    page.get_by_role("textbox", name="Prompt", exact=True).fill(prompt)
    page.evaluate(WATCH_PROGRESS)
    page.get_by_role("button", name="Invoke", exact=True).click()
    [name] = wait_for(f"a new image from {model}", lambda: set(image_names(base, token)) - before)
    seen = wait_for("the progress bar seen", lambda: page.evaluate("() => window.__progress"), within=10)
    page.evaluate("() => window.__progressObserver.disconnect()")
    assert len(set(seen)) >= 2, f"the progress bar did not move: {sorted(set(seen))}"
    return str(name)


def expect_in_gallery(page: Page, base: str, token: str = "") -> None:
    """The Gallery page shows as many images as the server has (the tests make fewer than one page), all loaded."""
    open_page(page, "Gallery")
    total = len(image_names(base, token))
    images = gallery_images(page)
    expect(images).to_have_count(total)
    wait_for(
        "every gallery image loaded",
        lambda: images.evaluate_all("all => all.every(i => i.complete && i.naturalWidth > 0)"),
        within=20,
    )
