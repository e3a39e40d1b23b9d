"""Scheduler names through REST: sd_denoise takes every SD scheduler name, and an unknown one is a 422 naming the field
and listing every valid name, with nothing enqueued."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from api_support import QUEUE, MakeClient
from fastapi.testclient import TestClient

from invokeai.backend.families.sd_schedulers import SD_SCHEDULER_NAMES

EXAMPLE = Path(__file__).resolve().parents[3] / "docs" / "examples" / "sd_text_to_image.json"
ENQUEUE = f"{QUEUE}/enqueue_batch"


@pytest.fixture
def idle(make_client: MakeClient) -> TestClient:
    # Enqueued items are never run: these tests are about what the queue accepts.
    return make_client(run_processor=False)


def _with_scheduler(scheduler: str) -> dict[str, Any]:
    body = copy.deepcopy(json.loads(EXAMPLE.read_text(encoding="utf-8")))
    body["batch"]["graph"]["nodes"]["denoise"]["scheduler"] = scheduler
    return body


def test_an_unknown_scheduler_is_a_422_listing_the_valid_names(idle: TestClient) -> None:
    response = idle.post(ENQUEUE, json=_with_scheduler("no_such_scheduler"))
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"][-3:] == ["denoise", "sd_denoise", "scheduler"]
    assert error["input"] == "no_such_scheduler"
    missing = [name for name in SD_SCHEDULER_NAMES if f"'{name}'" not in error["msg"]]
    assert not missing, error["msg"]
    assert idle.get(f"{QUEUE}/list").json()["total"] == 0


@pytest.mark.parametrize("scheduler", ["euler_a", "dpmpp_2m_sde_k", "dpmpp_sde", "tcd"])
def test_sd_denoise_takes_the_new_names(idle: TestClient, scheduler: str) -> None:
    response = idle.post(ENQUEUE, json=_with_scheduler(scheduler))
    assert response.status_code == 200, response.text
    assert response.json()["batch"]["graph"]["nodes"]["denoise"]["scheduler"] == scheduler
    assert idle.get(f"{QUEUE}/list").json()["total"] == 1
