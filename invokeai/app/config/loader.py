"""From command line, environment and invokeai.yaml to one checked InvokeAIAppConfig; the root's first start."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource

from invokeai.app.config.cli import CliArgs
from invokeai.app.config.describe import SETTINGS, env_var
from invokeai.app.config.errors import ConfigError, problems_by_setting
from invokeai.app.config.settings import (
    CONFIG_FILE_NAME,
    ENV_PREFIX,
    ROOT_ENV_VAR,
    InvokeAIAppConfig,
    SettingsValues,
    default_root,
)
from invokeai.app.config.yaml_file import SettingsFile, read_settings_file, rewrite_migrated, write_first_run_file


@dataclass(frozen=True)
class LoadResult:
    config: InvokeAIAppConfig
    migrated_from: int | None = None  # the schema_version the file was migrated from
    backup: Path | None = None  # the copy of the file as it was before the migration
    notes: list[str] = field(default_factory=list)  # what the migration changed, for the log
    # Setting -> where its effective value came from, as problem lines name it; settings at their default are absent.
    sources: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # for the log: INVOKEAI_* variables that are not settings


def _env_var_in_use(name: str) -> str:
    # pydantic-settings matches environment names case-insensitively (case_sensitive=False).
    wanted = env_var(name).lower()
    return next((key for key in os.environ if key.lower() == wanted), env_var(name))


def _checked(values: dict[str, Any], subject: Callable[[str], str]) -> tuple[dict[str, Any], dict[str, str]]:
    """One source's values validated on their own (converted, e.g. "9090" -> 9090) and its problems by setting."""
    try:
        return SettingsValues.model_validate(values).model_dump(exclude_unset=True), {}
    except ValidationError as error:
        return {}, problems_by_setting(error, subject)


def unknown_env_var_warning(key: str) -> str:
    close = difflib.get_close_matches(key[len(ENV_PREFIX) :].lower(), SETTINGS, n=1)
    hint = f"did you mean {env_var(close[0])}, setting '{close[0]}'?" if close else "see docs/configuration.md"
    return f"environment variable {key} is not a setting, so it is ignored ({hint})"


def _unknown_env_vars() -> list[str]:
    """A warning for each INVOKEAI_* variable that is not a setting: a misspelt one would otherwise be ignored
    without a word. Not an error, since variables outlive the settings they were meant for."""
    known = {env_var(name).lower() for name in SETTINGS} | {ROOT_ENV_VAR.lower()}
    return [
        unknown_env_var_warning(key)
        for key in sorted(os.environ)
        if key.upper().startswith(ENV_PREFIX) and key.lower() not in known
    ]


def load_config(cli: CliArgs) -> LoadResult:
    """The effective settings. Raises ConfigError on any bad input, with every problem of every source; the
    user's file is then left untouched.

    Each source is validated on its own, so every problem names its own source, even a bad file value that the
    environment or the command line would override. A file with an older schema_version is rewritten in the
    current schema (after a .bak copy) only once every source is valid.
    """
    root = cli.root.expanduser().resolve() if cli.root else default_root()
    path = cli.config.expanduser().resolve() if cli.config else root / CONFIG_FILE_NAME
    if path.exists():
        settings_file = read_settings_file(path)
    elif cli.config:
        raise ConfigError([f"{path}: no such file (given with --config)"])
    else:
        settings_file = SettingsFile(path, {})

    def in_file(name: str) -> str:
        return f"{path}: '{name}'"

    def in_env(name: str) -> str:
        return f"environment variable {_env_var_in_use(name)}"

    def in_cli(name: str) -> str:
        return f"option --{name}"

    from_file, file_problems = _checked(settings_file.values, in_file)
    from_env, env_problems = _checked(EnvSettingsSource(InvokeAIAppConfig)(), in_env)
    from_cli, cli_problems = _checked(cli.overrides, in_cli)
    in_file_order = sorted(
        {**settings_file.unknown, **file_problems}.items(), key=lambda k: _position(settings_file, k[0])
    )
    problems = [line for _, line in in_file_order] + [*env_problems.values(), *cli_problems.values()]
    if problems:
        raise ConfigError(problems)
    config = InvokeAIAppConfig.located({**from_file, **from_env, **from_cli}, root, path)
    sources = {
        **{name: in_file(name) for name in from_file},
        **{name: in_env(name) for name in from_env},
        **{name: in_cli(name) for name in from_cli},
    }
    if config.database_url and config.use_memory_db:
        raise ConfigError(
            [
                f"{sources.get('database_url', 'database_url')} and {sources.get('use_memory_db', 'use_memory_db')} "
                "are both set; use one: database_url keeps the database in PostgreSQL, use_memory_db in memory"
            ]
        )
    warnings = _unknown_env_vars()

    if settings_file.migrated_from is None:
        return LoadResult(config, sources=sources, warnings=warnings)
    backup = rewrite_migrated(settings_file)
    return LoadResult(config, settings_file.migrated_from, backup, settings_file.notes, sources, warnings)


def _position(settings_file: SettingsFile, key: str) -> int:
    return settings_file.keys.index(key) if key in settings_file.keys else len(settings_file.keys)


def init_root(config: InvokeAIAppConfig) -> bool:
    """Create the root folder and a commented settings file where they are missing; True if the file was new."""
    try:
        config.root.mkdir(parents=True, exist_ok=True)
        if config.config_file is None or config.config_file.exists():
            return False
        write_first_run_file(config.config_file)
    except OSError as error:
        raise ConfigError([f"{config.root}: cannot create the InvokeAI root: {error}"]) from None
    return True
