"""Helpers for the model tests (importable by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from httpx import Response

MODELS = "/api/v2/models"
TERMINAL = ("completed", "error", "cancelled")


def models_dir_files(client: TestClient) -> list[str]:
    """Everything under models_dir (staging folders included), relative to it."""
    root = client.app.state.config.models_path  # type: ignore[attr-defined]
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def install(client: TestClient, source: Path | str, *, inplace: bool = False, **config: Any) -> Response:
    """POST install?source=...: the job (201), or the refusal."""
    params = {"source": str(source), "inplace": str(inplace).lower()}
    return client.post(f"{MODELS}/install", params=params, json=config)


def wait_job(client: TestClient, job_id: int, timeout: float = 60.0) -> dict[str, Any]:
    """The job once it is completed, failed or cancelled."""
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(f"{MODELS}/install/{job_id}").json()
        if job["status"] in TERMINAL or time.monotonic() > deadline:
            return job
        time.sleep(0.02)


def installed(client: TestClient, source: Path | str, *, inplace: bool = False, **config: Any) -> dict[str, Any]:
    """Install and wait: the model's record (the job's config_out)."""
    response = install(client, source, inplace=inplace, **config)
    assert response.status_code == 201, response.text
    job = wait_job(client, response.json()["id"])
    assert job["status"] == "completed", job
    return job["config_out"]
