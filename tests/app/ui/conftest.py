"""The browser tests' fixtures: a real `invokeai-web` on a fresh root with the demo models (one per module, which
a test may restart, with or without api_token), Debian's Chromium through Playwright, and screenshots of each page
and of every failure under test-artifacts/screenshots/."""

from __future__ import annotations

import re
from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import (
    Browser,
    BrowserContext,
    ConsoleMessage,
    Page,
    Playwright,
    Request,
    sync_playwright,
)
from ui_support import CHROMIUM, SCREENSHOTS, shot
from web_server import WebServer


@pytest.fixture(scope="module")
def ui_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with WebServer.running(tmp_path_factory.mktemp("ui-server")) as server:
        yield server


@pytest.fixture(scope="session")
def playwright() -> Iterator[Playwright]:
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="session")
def browser(playwright: Playwright) -> Iterator[Browser]:
    # CI installs Debian's Chromium (.ci/run); Playwright's own browser download cannot work here.
    if not CHROMIUM.exists():
        pytest.fail(f"the browser tests need Debian's Chromium at {CHROMIUM}: apt-get install chromium")
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
    yield browser
    browser.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    report = yield
    # The page fixture reads this at teardown, to keep a screenshot of a failure.
    setattr(item, f"report_{report.when}", report)
    return report


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """A fresh browser profile (no stored token) at 1280x800, dark; a request outside 127.0.0.1 fails the test: the
    page must work without any outside network."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme="dark")
    outside: list[str] = []

    # Watched, not routed: Playwright's routing holds back a streamed answer, and the event stream is one.
    def only_local(request: Request) -> None:
        url = httpx.URL(request.url)
        if url.scheme in ("http", "https", "ws", "wss") and url.host not in ("127.0.0.1", "localhost"):
            outside.append(request.url)

    context.on("request", only_local)
    context.set_default_timeout(20_000)
    yield context
    context.close()
    assert not outside, f"the page asked for outside addresses: {outside[:5]}"


def csp_violation(message: ConsoleMessage) -> str | None:
    """The text of a Content-Security-Policy violation that Chromium logged, or None: the page (or a worker of it)
    tried something the server's policy forbids (security_headers.py), which then did not happen."""
    return message.text if "Content Security Policy" in message.text else None


@pytest.fixture
def page(context: BrowserContext, request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page that fails the test on an uncaught error or a CSP violation."""
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.extend(filter(None, [csp_violation(message)])))
    # The UI asks confirm() before deleting; a user would say yes.
    page.on("dialog", lambda dialog: dialog.accept())
    yield page
    report = getattr(request.node, "report_call", None)
    if report is not None and report.failed:
        name = re.sub(r"[^\w.-]+", "_", request.node.name)
        shot(page, f"failed-{name}")
    page.close()
    assert not errors, f"uncaught errors or CSP violations on the page: {errors[:3]}"


@pytest.fixture(scope="session", autouse=True)
def screenshots_folder() -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
