"""The warm-up after a restart: the models of the last completed items, their classes imported before serving and
their components loaded into the RAM cache afterwards, within the cache's room, stopping at real work."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from model_test_support import installed

from invokeai.app.services.container import Services
from invokeai.app.services.model_records import ModelRecord
from invokeai.app.services.warm_up import WarmUp

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "sd_text_to_image.json"


def services_of(client: TestClient) -> Services:
    return client.app.state.services  # type: ignore[attr-defined,no-any-return]


def completed_item(client: TestClient, model_name: str) -> None:
    """An item of the SD example naming `model_name`, claimed and completed without running (the processor is
    idle): what the queue holds after a server generated with the model."""
    body = json.loads(EXAMPLE.read_text())
    for node in body["batch"]["graph"]["nodes"].values():
        node["model"] = {"name": model_name}
    assert client.post("/api/v1/queue/default/enqueue_batch", json=body).status_code == 200
    queue = services_of(client).queue
    item = queue.dequeue()
    assert item is not None and queue.complete(item.item_id, {})


@pytest.fixture
def sd1(client: TestClient, built_models: dict[str, Path]) -> ModelRecord:
    torch.set_num_threads(1)
    record = installed(client, built_models["demo-sd1"], inplace=True)
    return services_of(client).models.records.get(record["key"])


def warm_up_of(client: TestClient) -> WarmUp:
    # A warm-up of its own, so that the enqueues the test made before do not count as real work.
    services = services_of(client)
    return WarmUp(services.queue, [services.models], services.processor, services.events)


def module_keys(client: TestClient) -> list[str]:
    return [entry["key"] for entry in services_of(client).models.cache.stats()["resident"]]


def test_the_recent_models_are_the_last_completed_items_newest_first(
    client: TestClient, sd1: ModelRecord, built_models: dict[str, Path]
) -> None:
    installed(client, built_models["demo-krea2"], inplace=True)
    warm_up = warm_up_of(client)
    assert warm_up.recent_records() == []
    completed_item(client, "demo-sd1")
    completed_item(client, "demo-nothing")  # a model since deleted (or never installed): left out
    assert [r.name for r in warm_up.recent_records()] == ["demo-sd1"]
    assert services_of(client).queue.recent_models(10) == ["name:demo-nothing", "name:demo-sd1"]


def test_it_imports_before_serving_and_loads_every_component_afterwards(
    client: TestClient, sd1: ModelRecord, caplog: pytest.LogCaptureFixture
) -> None:
    completed_item(client, "demo-sd1")
    warm_up = warm_up_of(client)
    caplog.set_level(logging.INFO, logger="invokeai.app.services.warm_up")
    warm_up.prepare()
    assert any("imported the libraries of demo-sd1" in r.getMessage() for r in caplog.records)
    assert module_keys(client) == []  # prepare reads no weights
    warm_up.start()
    assert warm_up.wait(timeout=60)
    assert sorted(module_keys(client)) == sorted(f"{sd1.key}:{c}" for c in ("text_encoder", "unet", "vae"))
    # What a node asks for next comes from the cache: the same objects, no second read.
    models = services_of(client).models
    assert models.load(sd1, "unet") is models.load(sd1, "unet")


def test_it_evicts_nothing_for_a_guess(
    client: TestClient, sd1: ModelRecord, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    completed_item(client, "demo-sd1")
    cache = services_of(client).models.cache
    monkeypatch.setattr(cache, "max_cache_ram_bytes", 1)  # no room for any module
    caplog.set_level(logging.INFO, logger="invokeai.app.services.warm_up")
    warm_up = warm_up_of(client)
    warm_up.prepare()
    warm_up.start()
    assert warm_up.wait(timeout=60)
    assert module_keys(client) == [] and cache.stats()["misses"] == 0
    assert any("left out (no room in the model cache" in r.getMessage() for r in caplog.records)


def test_real_work_stops_it(client: TestClient, sd1: ModelRecord, caplog: pytest.LogCaptureFixture) -> None:
    completed_item(client, "demo-sd1")
    warm_up = warm_up_of(client)
    warm_up.prepare()
    caplog.set_level(logging.INFO, logger="invokeai.app.services.warm_up")
    # An enqueue after the warm-up was built: the item's node loads what it needs, the warm-up loads nothing more.
    body = json.loads(EXAMPLE.read_text())
    assert client.post("/api/v1/queue/default/enqueue_batch", json=body).status_code == 200
    warm_up.start()
    assert warm_up.wait(timeout=60)
    assert module_keys(client) == []
    assert any("stopped for real work" in r.getMessage() for r in caplog.records)


def test_a_server_that_never_generated_imports_for_every_family_and_loads_nothing(
    client: TestClient, sd1: ModelRecord, built_models: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    installed(client, built_models["demo-krea2"], inplace=True)
    installed(client, built_models["demo-krea2-gguf"], inplace=True)
    warm_up = warm_up_of(client)
    assert [r.name for r in warm_up.installed_families()] == ["demo-krea2", "demo-sd1"]
    caplog.set_level(logging.INFO, logger="invokeai.app.services.warm_up")
    warm_up.prepare()
    assert any("libraries of demo-krea2, demo-sd1" in r.getMessage() for r in caplog.records)
    warm_up.start()
    assert not warm_up.running and module_keys(client) == []


def test_a_server_without_models_warms_nothing(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="invokeai.app.services.warm_up")
    warm_up = warm_up_of(client)
    warm_up.prepare()
    warm_up.start()
    assert not warm_up.running and not caplog.records


def test_tokenizers_and_schedulers_are_read_before_the_modules(
    client: TestClient, sd1: ModelRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    # They take milliseconds (the scheduler's first read imports the scheduler classes), so they are done before an
    # item that arrives early stops the warm-up; the modules follow in the family's order.
    completed_item(client, "demo-sd1")
    models = services_of(client).models
    order: list[str] = []
    preload = models.preload

    def recorded(record: ModelRecord, component: str) -> bool:
        order.append(component)
        return preload(record, component)

    monkeypatch.setattr(models, "preload", recorded)
    warm_up = warm_up_of(client)
    warm_up.prepare()
    warm_up.start()
    assert warm_up.wait(timeout=60)
    assert order == ["tokenizer", "scheduler", "text_encoder", "unet", "vae"]
