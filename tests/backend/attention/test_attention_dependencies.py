"""The attention package runs wherever torch does: it imports torch and the standard library only."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "invokeai" / "backend" / "attention"


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0] if node.module.split(".")[0] != "invokeai" else node.module)
    return roots


def test_every_module_imports_only_torch_the_stdlib_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"torch", "__future__"}
    offenders = {}
    for path in sorted(PACKAGE.glob("*.py")):
        bad = {
            root
            for root in _imported_roots(path)
            if root not in allowed and not root.startswith("invokeai.backend.attention")
        }
        if bad:
            offenders[path.name] = sorted(bad)
    assert offenders == {}


def test_importing_it_pulls_in_no_server_or_model_library() -> None:
    code = (
        "import sys, invokeai.backend.attention\n"
        "heavy = ['diffusers', 'transformers', 'fastapi', 'pydantic', 'pydantic_settings', 'yaml', 'PIL',"
        " 'invokeai.app']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
