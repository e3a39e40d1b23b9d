"""The import graph around the families: no family folder imports another family's (what two families share lives
in a family-neutral module, named for what it holds), and no generic module that a family imports reads the
registry back (families stand above the generic code; the registry, which imports every family, above them)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
PACKAGE = REPO / "invokeai"
FAMILIES_PACKAGE = "invokeai.backend.families"
FAMILY_DIRS = sorted(path.parent for path in (PACKAGE / "backend/families").glob("*/descriptor.py"))


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str) -> Path | None:
    base = REPO / name.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def imports(path: Path, name: str | None = None) -> set[str]:
    """Every module an `import` or `from ... import` names anywhere in the file (module level or in a function),
    relative imports resolved (against `name`, the module's dotted name: by default from its path); `from package
    import name` names `package.name` too when that is a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    name = name or module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names if module_path(f"{module}.{alias.name}")}
    return found


def family_of(module: str) -> str | None:
    for folder in FAMILY_DIRS:
        name = module_name(folder / "__init__.py")
        if module == name or module.startswith(name + "."):
            return folder.name
    return None


def test_the_family_folders_are_found() -> None:
    assert {folder.name for folder in FAMILY_DIRS} >= {"sd1", "sdxl", "flux", "krea2"}


@pytest.mark.parametrize("folder", FAMILY_DIRS, ids=lambda folder: folder.name)
def test_a_family_folder_imports_no_other_family(folder: Path) -> None:
    crossings = [
        f"{path.relative_to(REPO)} imports {module}"
        for path in sorted(folder.rglob("*.py"))
        for module in sorted(imports(path))
        if family_of(module) not in (None, folder.name)
    ]
    assert crossings == []


def family_facing_modules() -> set[str]:
    """The modules outside invokeai/backend/families that family code imports, directly or through each other, and
    the families package's own shared modules (family.py, sd_schedulers.py ...) with theirs."""
    families_dir = PACKAGE / "backend/families"
    sources = [path for folder in FAMILY_DIRS for path in folder.rglob("*.py")]
    sources += [path for path in families_dir.glob("*.py") if path.name not in ("__init__.py", "registry.py")]
    seen: set[str] = set()
    todo = [module for path in sources for module in imports(path)]
    while todo:
        module = todo.pop()
        if module in seen or not module.startswith("invokeai.") or module.startswith(FAMILIES_PACKAGE):
            continue
        seen.add(module)
        path = module_path(module)
        if path is not None:
            todo += imports(path)
    return seen


def test_family_facing_modules_are_found() -> None:
    modules = family_facing_modules()
    for expected in (
        "invokeai.backend.cache.estimate",
        "invokeai.backend.cache.clip_unet_vae",
        "invokeai.backend.models.config_variants",
        "invokeai.backend.models.original_sd_layout",
    ):
        assert expected in modules


def test_no_module_a_family_imports_imports_the_families_back() -> None:
    # At any level: an import inside a function is still a dependency of the module on the registry.
    back = {
        module: sorted(name for name in imports(path) if name.startswith(FAMILIES_PACKAGE))
        for module in sorted(family_facing_modules())
        if (path := module_path(module)) is not None
    }
    assert {module: names for module, names in back.items() if names} == {}


def test_the_check_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "def f():\n    from invokeai.backend.families import get_family\n    from ..families import registry\n"
    )
    found = imports(sample, "invokeai.backend.cache.sample")
    assert {"invokeai.backend.families", "invokeai.backend.families.registry"} <= found


def test_importing_a_family_facing_module_leaves_the_registry_out() -> None:
    # The same, as Python sees it: each module imported alone in a fresh interpreter.
    modules = sorted(module for module in family_facing_modules() if module_path(module) is not None)
    script = (
        "import importlib, json, sys\n"
        "loaded = {}\n"
        "for name in sys.argv[1:]:\n"
        "    before = set(sys.modules)\n"
        "    importlib.import_module(name)\n"
        f"    loaded[name] = sorted(m for m in set(sys.modules) - before if m.startswith({FAMILIES_PACKAGE!r}))\n"
        "print(json.dumps(loaded))\n"
    )
    # One interpreter per module would take minutes (torch); modules that import nothing of the families may share
    # one, and any that does shows up under its own name, since it is imported before the ones after it.
    result = subprocess.run([sys.executable, "-c", script, *modules], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr

    loaded = json.loads(result.stdout.splitlines()[-1])
    assert {name: found for name, found in loaded.items() if found} == {}


@pytest.fixture(scope="module")
def descriptor_imports() -> dict[str, list[str]]:
    """For each family: the modules of the families package that importing its descriptor loaded. One interpreter
    for all of them (one each would cost a torch import per family): after each descriptor, the family modules it
    loaded are dropped from sys.modules again, so the next descriptor finds none of them already imported."""
    names = [f"{FAMILIES_PACKAGE}.{folder.name}.descriptor" for folder in FAMILY_DIRS]
    script = (
        "import importlib, json, sys\n"
        f"prefix = {FAMILIES_PACKAGE!r} + '.'\n"
        "loaded = {}\n"
        "for name in sys.argv[1:]:\n"
        "    before = set(sys.modules)\n"
        "    importlib.import_module(name)\n"
        "    new = sorted(m for m in set(sys.modules) - before if m.startswith(prefix))\n"
        "    loaded[name] = sorted(m for m in sys.modules if m.startswith(prefix))\n"
        "    for module in new:\n"
        "        del sys.modules[module]\n"
        "print(json.dumps(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("folder", FAMILY_DIRS, ids=lambda p: p.name)
def test_a_familys_descriptor_imports_neither_the_registry_nor_another_family(
    folder: Path, descriptor_imports: dict[str, list[str]]
) -> None:
    # The package's __init__ reads the registry lazily: a family importing `families.family` does not run it.
    loaded = descriptor_imports[f"{FAMILIES_PACKAGE}.{folder.name}.descriptor"]
    others = {f"{FAMILIES_PACKAGE}.registry"} | {f"{FAMILIES_PACKAGE}.{d.name}" for d in FAMILY_DIRS if d != folder}
    assert f"{FAMILIES_PACKAGE}.{folder.name}.descriptor" in loaded
    assert [m for m in loaded if m in others or m.rsplit(".", 1)[0] in others] == []
