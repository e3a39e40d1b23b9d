"""The commented invokeai.yaml written on first start and, with every setting, as invokeai.yaml.example."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

import yaml

from invokeai.app.config.describe import allowed_values, default_value, description, is_startup_only
from invokeai.app.config.migrations import CURRENT_SCHEMA_VERSION

HEADER = """\
# InvokeAI settings. Remove the '#' in front of a setting to change it.
# Every setting with its default and allowed values: docs/configuration.md in the InvokeAI sources.
# Environment variables (INVOKEAI_<SETTING>) and command-line options take precedence over this file.
# Relative paths resolve against the InvokeAI root folder.
# schema_version is managed by InvokeAI: an older file is migrated on start (the original kept as .bak).
"""


def _comment(text: str) -> list[str]:
    return textwrap.wrap(text, width=110, initial_indent="# ", subsequent_indent="# ")


def default_yaml(name: str) -> str:
    """A setting's default as it is written in YAML, e.g. `false` or `databases/invokeai.db`."""
    return yaml.safe_dump({name: default_value(name)}, default_flow_style=False).strip().removeprefix(f"{name}: ")


def render_entry(name: str) -> str:
    restart = " Startup-only: a change needs a restart." if is_startup_only(name) else ""
    lines = [
        *_comment(description(name)),
        *_comment(f"Allowed: {allowed_values(name)}.{restart}"),
        f"# {name}: {default_yaml(name)}",
    ]
    return "\n".join(lines)


def render_yaml(names: Iterable[str]) -> str:
    """A settings file that sets only schema_version and lists `names` commented out at their defaults."""
    entries = "\n\n".join(render_entry(name) for name in names)
    return f"{HEADER}\nschema_version: {CURRENT_SCHEMA_VERSION}\n\n{entries}\n"
