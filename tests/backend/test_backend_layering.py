"""The backend never imports the app: data flows API -> services -> nodes -> backend. (A family descriptor names
its node module as a string, for the app to import; that is not an import.)"""

from __future__ import annotations

import ast
from pathlib import Path

BACKEND = Path(__file__).resolve().parents[2] / "invokeai" / "backend"


def test_no_backend_module_imports_the_app() -> None:
    files = sorted(BACKEND.rglob("*.py"))
    offenders = []
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] if node.level == 0 else []
            offenders += [f"{file.relative_to(BACKEND)}: {name}" for name in names if name.startswith("invokeai.app")]
    assert len(files) > 40 and offenders == []
