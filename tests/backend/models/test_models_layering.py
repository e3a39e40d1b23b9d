"""The backend never imports the app: data flows API -> services -> nodes -> backend."""

from __future__ import annotations

import ast
from pathlib import Path

BACKEND = Path(__file__).resolve().parents[3] / "invokeai" / "backend"


def test_backend_models_and_devices_do_not_import_the_app() -> None:
    files = [*(BACKEND / "models").rglob("*.py"), BACKEND / "devices.py"]
    offenders = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
            offenders += [f"{file.name}: {name}" for name in names if name.startswith("invokeai.app")]
    assert len(files) > 10 and offenders == []
