"""Helpers for the model tests (importable by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

MODELS = "/api/v2/models"


def models_dir_files(client: TestClient) -> list[str]:
    """Everything under models_dir (staging folders included), relative to it."""
    root = client.app.state.config.models_path  # type: ignore[attr-defined]
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []


def install(client: TestClient, source: Path | str, **body: Any) -> Any:
    return client.post(f"{MODELS}/install", json={"source": str(source), **body})
