"""The model cache and its estimators belong to the backend: they never import the app."""

from __future__ import annotations

import ast
from pathlib import Path

CACHE = Path(__file__).resolve().parents[3] / "invokeai" / "backend" / "cache"


def test_backend_cache_does_not_import_the_app() -> None:
    files = sorted(CACHE.glob("*.py"))
    offenders = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            offenders += [f"{file.name}: {name}" for name in names if name.startswith("invokeai.app")]
    assert len(files) >= 6 and offenders == []
