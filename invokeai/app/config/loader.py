"""From command line, environment and invokeai.yaml to one checked InvokeAIAppConfig; the root's first start."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import EnvSettingsSource

from invokeai.app.config.cli import CliArgs
from invokeai.app.config.describe import env_var
from invokeai.app.config.errors import ConfigError, from_validation_error
from invokeai.app.config.settings import CONFIG_FILE_NAME, InvokeAIAppConfig, SettingsValues, default_root
from invokeai.app.config.yaml_file import SettingsFile, read_settings_file, rewrite_migrated, write_first_run_file


@dataclass(frozen=True)
class LoadResult:
    config: InvokeAIAppConfig
    migrated_from: int | None = None  # the schema_version the file was migrated from
    backup: Path | None = None  # the copy of the file as it was before the migration
    notes: list[str] = field(default_factory=list)  # what the migration changed, for the log


def _env_var_in_use(name: str) -> str:
    # pydantic-settings matches environment names case-insensitively (case_sensitive=False).
    wanted = env_var(name).lower()
    return next((key for key in os.environ if key.lower() == wanted), env_var(name))


def _checked(values: dict[str, Any], subject: Callable[[str], str]) -> tuple[dict[str, Any], list[str]]:
    """One source's values validated on their own (converted, e.g. "9090" -> 9090) and its problems."""
    try:
        return SettingsValues.model_validate(values).model_dump(exclude_unset=True), []
    except ValidationError as error:
        return {}, from_validation_error(error, subject).problems


def load_config(cli: CliArgs) -> LoadResult:
    """The effective settings. Raises ConfigError on any bad input; the user's file is then left untouched.

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

    from_file, file_problems = _checked(settings_file.values, lambda name: f"{path}: '{name}'")
    from_env, env_problems = _checked(
        EnvSettingsSource(InvokeAIAppConfig)(), lambda name: f"environment variable {_env_var_in_use(name)}"
    )
    from_cli, cli_problems = _checked(cli.overrides, lambda name: f"option --{name}")
    problems = file_problems + env_problems + cli_problems
    if problems:
        raise ConfigError(problems)
    config = InvokeAIAppConfig.located({**from_file, **from_env, **from_cli}, root, path)

    if settings_file.migrated_from is None:
        return LoadResult(config)
    backup = rewrite_migrated(settings_file)
    return LoadResult(config, settings_file.migrated_from, backup, settings_file.notes)


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
