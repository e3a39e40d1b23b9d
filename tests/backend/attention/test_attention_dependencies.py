"""The attention package runs wherever torch does: it imports torch, the standard library, itself and the backend's
devices module only, and its face loads without torch, so the configuration can validate the setting torch-free."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[3] / "invokeai" / "backend" / "attention"
ALLOWED_INVOKEAI = ("invokeai.backend.attention", "invokeai.backend.devices")


def _imported_modules(source: str) -> set[str]:
    """Every module a source imports, by its full name: `from a.b import c` counts as a.b.c, since c may be a module
    (as `from invokeai.backend import devices` is)."""
    modules = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules |= {f"{node.module}.{alias.name}" for alias in node.names}
    return modules


def _not_allowed(module: str) -> bool:
    root = module.split(".")[0]
    if root == "invokeai":
        return not any(module == name or module.startswith(f"{name}.") for name in ALLOWED_INVOKEAI)
    return root not in {*sys.stdlib_module_names, "torch", "__future__"}


def test_every_module_imports_only_torch_the_stdlib_itself_and_devices() -> None:
    offenders = {}
    for path in sorted(PACKAGE.glob("*.py")):
        bad = sorted(module for module in _imported_modules(path.read_text()) if _not_allowed(module))
        if bad:
            offenders[path.name] = bad
    assert offenders == {}


def test_the_import_check_catches_what_it_must() -> None:
    source = (
        "import numpy\nfrom invokeai.backend import devices\nfrom invokeai.backend import cache\n"
        "from invokeai.app.config import get_config\nfrom torch.nn import functional\nimport os.path\n"
    )
    assert sorted(m for m in _imported_modules(source) if _not_allowed(m)) == [
        "invokeai.app.config.get_config",
        "invokeai.backend.cache",
        "numpy",
    ]


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_importing_it_pulls_in_no_server_or_model_library() -> None:
    code = (
        "import sys, invokeai.backend.attention as A\n"
        "A.install_attention\n"  # the whole package, torch included
        "heavy = ['diffusers', 'transformers', 'fastapi', 'pydantic', 'pydantic_settings', 'yaml', 'PIL',"
        " 'invokeai.app']\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    assert _run(code) == "[]"


def test_the_face_and_the_settings_load_without_torch() -> None:
    code = (
        "import sys\n"
        "import invokeai.backend.attention as A\n"
        "from invokeai.backend.attention.settings import ATTENTION_SETTINGS, check_setting\n"
        "check_setting('auto')\n"
        "assert A.ATTENTION_SETTINGS == ATTENTION_SETTINGS and 'ATTENTION_SETTINGS' in A.__all__\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    assert _run(code) == "[]"


def test_a_face_name_loads_its_module_on_first_use() -> None:
    code = "import sys, invokeai.backend.attention as A\nA.kernel_order('auto')\nprint('torch' in sys.modules)\n"
    assert _run(code) == "True"
