"""invokeai.yaml.example and docs/configuration.md are generated from the settings class and must be current."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from invokeai.app.config.describe import SETTINGS, env_var, is_startup_only
from invokeai.app.config.generate import GENERATED_FILES, GENERATOR, render_docs, render_example

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("relative", sorted(GENERATED_FILES))
def test_committed_file_is_current(relative: str) -> None:
    committed = REPO / relative
    assert committed.exists(), f"{relative} is missing: run python {GENERATOR}"
    assert committed.read_text(encoding="utf-8") == GENERATED_FILES[relative](), f"stale: run python {GENERATOR}"


def test_docs_cover_every_setting() -> None:
    docs = render_docs()
    for name, field in SETTINGS.items():
        section = docs.split(f"### `{name}`\n", 1)[1].split("\n### ", 1)[0]
        assert field.description and field.description in section
        assert f"`{env_var(name)}`" in section
        assert f"| Startup-only | {'yes' if is_startup_only(name) else 'no'}" in section
        assert "| Default |" in section and "| Allowed |" in section and "| Type |" in section


def test_example_lists_every_setting_at_its_default() -> None:
    example = render_example()
    uncommented = "\n".join(
        line.removeprefix("# ") for line in example.splitlines() if line.startswith(("# ", "schema"))
    )
    values = {}
    for line in uncommented.splitlines():
        if line.split(":")[0] in SETTINGS:
            values.update(yaml.safe_load(line))
    defaults = {name: field.default for name, field in SETTINGS.items()}
    assert {name: str(value) for name, value in values.items()} == {name: str(v) for name, v in defaults.items()}
