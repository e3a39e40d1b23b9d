"""The family registry holds: every descriptor is consistent with itself, and the generic modules name no family
(they iterate the registry), so a new family is its folder, its node module and one line in registry.py.

Generic is every module under invokeai/ but a family's own (its folder under invokeai/backend/families/, its node
module) and the few in NAMES_FAMILIES, each with its reason."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

from invokeai.backend.families import FAMILIES, Family, config_variant, family_for_pipeline, get_family

REPO = Path(__file__).resolve().parents[3]
FAMILY_DIRS = sorted(path.parent for path in (REPO / "invokeai/backend/families").glob("*/descriptor.py"))
# Modules outside the family folders that must name families, each with why.
NAMES_FAMILIES = {
    "invokeai/backend/families/registry.py": "the registry: it imports each family's descriptor, one line a family",
    "invokeai/app/invokeai_taxonomy.py": "InvokeAI's own model vocabulary, some of whose values begin with a family's "
    "name (sdxl-refiner, flux_redux); the families' own bases come from their descriptors",
    "invokeai/app/nodes/metadata.py": "core_metadata's generation_mode takes InvokeAI's values (sdxl_txt2img, "
    "flux_img2img, ...) as its clients send them",
    "invokeai/app/nodes/sd_invocations.py": "InvokeAI's SD node types: its denoise_latents, l2i, i2l and noise take "
    "SD-1's and SDXL's models alike, and its SDXL graphs use them with sdxl_model_loader and sdxl_compel_prompt",
}


def node_module_path(family: Family) -> Path:
    return REPO / (family.node_module.replace(".", "/") + ".py")


def generic_modules() -> list[Path]:
    """Every module of the package but a family's own: its folder, its node module, and the allow-list."""
    own = {node_module_path(family) for family in FAMILIES} | {REPO / path for path in NAMES_FAMILIES}
    return [
        path
        for path in sorted((REPO / "invokeai").rglob("*.py"))
        if path not in own and not any(folder in path.parents for folder in FAMILY_DIRS)
    ]


def _family_words() -> re.Pattern[str]:
    """Every registered family's name and its folder's name, as words (sd-1, sd1, sd_1 ...)."""
    words = set()
    for family in FAMILIES:
        for name in (family.name, family.node_module.rsplit(".", 1)[-1]):
            words.add(re.escape(name).replace("\\-", "[-_]?").replace("_", "[-_]?"))
    words |= {"sdxl", "flux", "krea[-_]?2", "sd[-_]?1"}  # the families this server is built for, registered or not
    return re.compile(r"(?<![a-z0-9])(" + "|".join(sorted(words)) + r")(?![0-9])", re.I)


def mentions(path: Path, pattern: re.Pattern[str]) -> list[str]:
    """Family names in code: identifiers, attributes, imports, arguments and string literals (not docstrings or
    comments, which may say which families a generic rule was written for)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        texts: list[str] = []
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            texts.append(node.value)
        elif isinstance(node, ast.Name):
            texts.append(node.id)
        elif isinstance(node, ast.Attribute):
            texts.append(node.attr)
        elif isinstance(node, ast.alias):
            texts += [node.name, node.asname or ""]
        elif isinstance(node, ast.ImportFrom):
            texts.append(node.module or "")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            texts.append(node.name)
        elif isinstance(node, ast.arg):
            texts.append(node.arg)
        elif isinstance(node, ast.keyword):
            texts.append(node.arg or "")
        found += [f"{path.name}:{getattr(node, 'lineno', '?')} {text!r}" for text in texts if pattern.search(text)]
    return found


def test_generic_modules_name_no_family() -> None:
    pattern = _family_words()
    hits = [hit for path in generic_modules() for hit in mentions(path, pattern)]
    assert hits == []


def test_the_scan_covers_the_generic_code() -> None:
    scanned = {path.relative_to(REPO).as_posix() for path in generic_modules()}
    assert len(scanned) > 100
    for module in (
        "invokeai/backend/models/probe.py",
        "invokeai/backend/cache/working_memory.py",
        "invokeai/app/config/settings.py",
        "invokeai/app/nodes/__init__.py",
        "invokeai/backend/families/family.py",
        "invokeai/backend/families/unsupported.py",
    ):
        assert module in scanned
    for family in FAMILIES:
        assert node_module_path(family).relative_to(REPO).as_posix() not in scanned
    assert not any(
        path.startswith(f"invokeai/backend/families/{folder.name}/") for folder in FAMILY_DIRS for path in scanned
    )
    # The allow-list names files that exist, each with a reason.
    for path, reason in NAMES_FAMILIES.items():
        assert (REPO / path).is_file() and reason


def test_the_scan_finds_a_family_name_where_one_is_written(tmp_path: Path) -> None:
    # The scan must be able to fail: each way a name can be written in code is caught, a docstring is not.
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""Written for sd-1 and krea2."""\n'
        "from invokeai.backend.families.sd1 import layout\n"
        "import invokeai.backend.families.krea2 as k\n"
        'TABLE = {"sd-1": 1}\n'
        "def load_flux(sdxl_config): return layout.FLUX\n"
        "call(krea2=1)\n"
    )
    hits = mentions(sample, _family_words())
    lines = sorted({int(hit.split(":")[1].split()[0]) for hit in hits})
    assert lines == [2, 3, 4, 5, 6]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_a_descriptor_is_consistent(family: Family) -> None:
    assert get_family(family.name) is family
    assert set(family.module_components) <= set(family.components)
    # Every operation runs a module; every module has an operation, an estimator and a calibration run for it.
    assert set(family.operations.values()) == set(family.module_components)
    assert set(family.estimators) == set(family.operations) == set(family.runs)
    for pipeline in family.pipeline_classes:
        assert family_for_pipeline(pipeline) is family
    for variant in family.config_variants:
        assert variant.family == family.name and config_variant(variant.name) is variant
        assert (variant.path / "model_index.json").is_file() or any(variant.path.iterdir()), variant.path
    for rule in family.files:
        assert set(rule.components) <= set(family.components) and rule.container in ("safetensors", "gguf")
        assert family.config_variants, f"{family.name}: a single file needs a shipped config"
    assert family.scheduler_names and family.constants.size_multiple % family.constants.latent_scale == 0
    nodes = importlib.import_module(family.node_module)
    assert nodes.__name__.startswith("invokeai.app.nodes.")


def test_names_are_unique_across_families() -> None:
    names = [family.name for family in FAMILIES]
    variants = [variant.name for family in FAMILIES for variant in family.config_variants]
    demos = [demo.name for family in FAMILIES for demo in family.demos]
    pipelines = [name for family in FAMILIES for name in family.pipeline_classes]
    for listed in (names, variants, demos, pipelines):
        assert len(listed) == len(set(listed)), listed


def test_an_unknown_family_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(KeyError, match="no model family 'sd-3'; known: " + ", ".join(f.name for f in FAMILIES)):
        get_family("sd-3")
    assert family_for_pipeline("StableDiffusion3Pipeline") is None


# Tests that may still hold a fixed list of demo names, each with why (none do).
LISTS_DEMOS: dict[str, str] = {}


def demo_name_lists(path: Path) -> list[tuple[int, list[str]]]:
    """(line, names) of each list, tuple and set literal holding three or more demo model names (`demo-*`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            names = [
                element.value
                for element in node.elts
                if isinstance(element, ast.Constant) and isinstance(element.value, str)
                if element.value.startswith("demo-")
            ]
            if len(names) >= 3:
                found.append((node.lineno, names))
    return found


def test_no_test_holds_a_fixed_list_of_demo_names() -> None:
    # Tests iterate FAMILIES and family.demos, so a new family's demo models are tested without editing them.
    assert all((REPO / path).is_file() and reason for path, reason in LISTS_DEMOS.items())
    hits = [
        f"{path.relative_to(REPO)}:{line} {names}"
        for path in sorted((REPO / "tests").rglob("*.py"))
        if path.relative_to(REPO).as_posix() not in LISTS_DEMOS
        for line, names in demo_name_lists(path)
    ]
    assert hits == []


def test_the_demo_list_check_can_fail(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        'A = ["demo-a", "demo-b", "demo-c"]\nB = ("demo-a", "demo-b")\nC = {"demo-a", "x", "demo-b", "demo-c"}\n'
    )
    assert [line for line, _ in demo_name_lists(sample)] == [1, 3]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_docs_families_md_has_a_row_per_family(family: Family) -> None:
    # docs/families.md's table is the one place the families and their demo models are listed by hand (README,
    # docs/api.md and the settings point at it and at GET /api/v1/app/families): it must stay true.
    text = (REPO / "docs" / "families.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith(f"| `{family.name}` |")]
    assert len(rows) == 1, f"docs/families.md has no table row for {family.name}"
    row = rows[0]
    assert f"`{family.node_module.replace('.', '/')}.py`" in row
    for demo in family.demos:
        assert f"`{demo.name}`" in row
    for variant in family.config_variants:
        assert f"`{variant.name}`" in row
