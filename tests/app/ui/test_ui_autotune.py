"""The Attention page with `attention_autotune: on`: a generation on a demo model tunes its attention buckets, and
the page lists each bucket with the chosen kernel, as GET /api/v1/app/attention has them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect
from ui_support import api, invoke, open_page, shot
from web_server import WebServer


@pytest.fixture(scope="module")
def tuning_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebServer]:
    with WebServer.running(tmp_path_factory.mktemp("ui-autotune"), attention_autotune="on") as server:
        yield server


def _bucket_line(bucket: dict) -> str:  # type: ignore[type-arg]
    """The page's words for a bucket (Attention.tsx's bucketLine)."""
    heads = f"{bucket['heads']} heads" + (", grouped-query" if bucket["grouped"] else "")
    mask = {"none": "no mask", "causal": "causal"}.get(bucket["mask"], f"{bucket['mask']} mask")
    return (
        f"{bucket['device']} {bucket['dtype']}, head_dim {bucket['head_dim']}, {heads}, "
        f"query ≤{bucket['query_len']}, key ≤{bucket['key_len']}, {mask}"
    )


def test_the_attention_page_lists_the_tuned_kernels(tuning_server: WebServer, page: Page) -> None:
    page.goto(tuning_server.base + "/")
    invoke(page, "demo-sd1", "tuned attention", steps=2)
    body = api(tuning_server.base, "/api/v1/app/attention")
    assert body["autotune"] == "on" and body["tuned"], body
    assert all(choice["source"] == "measured" for choice in body["tuned"])
    page.goto(tuning_server.base + "/")
    open_page(page, "Attention")
    region = page.get_by_role("region", name="Attention")
    expect(region.get_by_label("attention_autotune")).to_contain_text("attention_autotune on:")
    table = region.get_by_role("table", name="Tuned kernels")
    expect(table.get_by_role("row")).to_have_count(len(body["tuned"]) + 1)
    for choice in body["tuned"]:
        row = table.get_by_role("row").filter(has_text=_bucket_line(choice["bucket"]))
        expect(row).to_have_count(1)
        expect(row.get_by_role("cell").first).to_have_text(choice["kernel"])
    shot(page, "attention-autotune")
