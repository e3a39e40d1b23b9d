"""Shared by the model tests: what the session's demo build fixture returns (a uniquely named module, since test
folders have no __init__.py and every conftest.py is named alike)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DemoBuild:
    root: Path
    seconds: float

    @property
    def sd1(self) -> Path:
        return self.root / "demo-sd1"

    @property
    def krea2(self) -> Path:
        return self.root / "demo-krea2"

    @property
    def gguf(self) -> Path:
        return self.root / "demo-krea2-gguf.gguf"
