"""Reading invokeai.yaml (syntax, known keys, schema migration) and writing it (first start, after migration).

Reading never writes: a migrated file is rewritten only by `rewrite_migrated`, which the loader calls after
every source has been validated, so a failed start leaves the user's file as it was.
"""

from __future__ import annotations

import difflib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from invokeai.app.config.describe import SETTINGS, is_common
from invokeai.app.config.errors import ConfigError
from invokeai.app.config.migrations import CURRENT_SCHEMA_VERSION, MigrationError, migrate
from invokeai.app.config.template import HEADER, render_yaml

VERSION_KEY = "schema_version"


@dataclass(frozen=True)
class SettingsFile:
    path: Path
    values: dict[str, Any]  # current-schema settings, without schema_version
    migrated_from: int | None = None
    notes: list[str] = field(default_factory=list)
    # Keys that are not settings -> their problem line. They are reported with the invalid values of the known
    # keys, so that one run lists every problem of the file.
    unknown: dict[str, str] = field(default_factory=dict)
    keys: tuple[str, ...] = ()  # every key of the (migrated) file in its order, for listing problems in file order


def _syntax_problem(path: Path, error: yaml.YAMLError) -> str:
    mark = getattr(error, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    what = getattr(error, "problem", None) or str(error)
    return f"{path}: YAML syntax error{where}: {what}"


def _unknown_key_problem(path: Path, key: object) -> str:
    close = difflib.get_close_matches(str(key), [*SETTINGS, VERSION_KEY], n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known settings: {', '.join(SETTINGS)}"
    return f"{path}: unknown setting '{key}' ({hint})"


def _schema_version(path: Path, data: dict[Any, Any]) -> int:
    # A file without schema_version was written by hand for this version; only InvokeAI writes the key.
    version = data.get(VERSION_KEY, CURRENT_SCHEMA_VERSION)
    problem = f"{path}: '{VERSION_KEY}' is {version!r}; expected an integer from 1 to {CURRENT_SCHEMA_VERSION}"
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ConfigError([problem])
    if version > CURRENT_SCHEMA_VERSION:
        raise ConfigError([f"{problem} (the file was written by a newer InvokeAI)"])
    return version


def read_settings_file(path: Path) -> SettingsFile:
    """The file's settings, migrated to the current schema in memory, and its unknown keys. Raises ConfigError
    where the file cannot be read as settings at all (syntax, not a mapping, schema_version, migration)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError([_syntax_problem(path, error)]) from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError([f"{path}: cannot read the file: {error}"]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected 'setting: value' lines, found a YAML {type(data).__name__}"])

    version = _schema_version(path, data)
    values = {key: value for key, value in data.items() if key != VERSION_KEY}
    try:
        values, notes = migrate(values, version)
    except MigrationError as error:
        raise ConfigError([f"{path}: {error}"]) from None

    return SettingsFile(
        path,
        {key: value for key, value in values.items() if key in SETTINGS},
        version if version < CURRENT_SCHEMA_VERSION else None,
        notes,
        unknown={str(key): _unknown_key_problem(path, key) for key in values if key not in SETTINGS},
        keys=tuple(str(key) for key in values),
    )


def _write_atomically(path: Path, text: str) -> None:
    # A crash mid-write must not leave half a settings file behind.
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def _free_backup_path(path: Path) -> Path:
    candidate = path.with_name(path.name + ".bak")
    number = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.bak.{number}")
        number += 1
    return candidate


def rewrite_migrated(settings_file: SettingsFile) -> Path:
    """Back the file up (invokeai.yaml.bak, or .bak.N if taken) and write its migrated values; returns the backup."""
    path = settings_file.path
    backup = _free_backup_path(path)
    try:
        shutil.copy2(path, backup)
        # safe_dump writes an empty mapping as "{}", which cannot follow the schema_version line.
        values = settings_file.values
        body = yaml.safe_dump(values, default_flow_style=False, sort_keys=False) if values else ""
        note = f"# Migrated from schema_version {settings_file.migrated_from}; the original is {backup.name}.\n"
        _write_atomically(path, f"{HEADER}{note}\n{VERSION_KEY}: {CURRENT_SCHEMA_VERSION}\n{body}")
    except OSError as error:
        raise ConfigError([f"{path}: cannot write the migrated file: {error}"]) from None
    return backup


def write_first_run_file(path: Path) -> None:
    """The commented settings file a new root starts with: schema_version and the commonly edited settings."""
    _write_atomically(path, render_yaml(name for name in SETTINGS if is_common(name)))
