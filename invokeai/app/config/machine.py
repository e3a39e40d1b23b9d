"""Settings that are valid as values but wrong for this machine: a device it lacks, a db_path that cannot hold a
database, a database_url whose server does not answer. Checked at startup, before the server is built, so that
they stop the start with exit code 2 and one line each, as bad values do, rather than with a traceback from inside
the server's startup."""

from __future__ import annotations

import os
import sqlite3
from contextlib import closing
from pathlib import Path

from invokeai.app.config.errors import ConfigError
from invokeai.app.config.loader import LoadResult


def _subject(loaded: LoadResult, name: str) -> str:
    return loaded.sources.get(name, f"'{name}' (its default)")


def device_problem(setting: str) -> str | None:
    """Why the device setting names no device of this machine, or None."""
    # torch takes seconds to import: only a start that got this far pays for it (not --help, not a bad value).
    from invokeai.backend.devices import choose_device

    try:
        choose_device(setting)
    except ValueError as error:
        return str(error)
    return None


def generation_devices_problem(setting: str | list[str], device_setting: str) -> str | None:
    """Why generation_devices names a device this machine lacks (e.g. cuda:3 on a two-GPU machine), or None."""
    from invokeai.backend.devices import choose_generation_devices

    try:
        choose_generation_devices(setting, device_setting)
    except ValueError as error:
        return str(error)
    return None


def database_problem(path: Path) -> str | None:
    """Why `path` cannot hold the SQLite database, or None. Creates its folder (and an empty database file) where
    they are missing, as the server would a moment later."""
    try:
        folder = next(candidate for candidate in path.parents if candidate.exists())
        if not folder.is_dir():
            return f"{folder} is a file, not a folder"
        if path.is_dir():
            return f"{path} is a folder, not a file"
        path.parent.mkdir(parents=True, exist_ok=True)
        # Reading the schema reads the header: a file that is not a database fails here, not in a migration.
        with closing(sqlite3.connect(path)) as connection:
            connection.execute("PRAGMA schema_version")
        # WAL mode writes <db>-wal and <db>-shm beside the file, so the folder must be writable as well.
        if not os.access(path, os.W_OK) or not os.access(path.parent, os.W_OK):
            return f"{path} or its folder is not writable"
    except sqlite3.Error as error:
        return f"{path} cannot be opened as a SQLite database ({error})"
    except OSError as error:
        return f"{path} cannot hold a database ({error})"
    return None


def postgres_problem(url: str) -> str | None:
    """Why the PostgreSQL server of `url` cannot be used (naming host, port and database, never the password)."""
    from invokeai.app.services.postgres import DatabaseUnreachableError, DatabaseUrlError, check_reachable

    try:
        check_reachable(url)
    except (DatabaseUnreachableError, DatabaseUrlError) as error:
        return str(error)
    return None


def check_machine(loaded: LoadResult) -> None:
    """Raises ConfigError with a line for each setting that this machine cannot honour."""
    config = loaded.config
    problems = []
    if (why := device_problem(config.device)) is not None:
        problems.append(f"{_subject(loaded, 'device')} is {config.device!r}; {why}")
    if config.generation_devices != "auto" and (
        why := generation_devices_problem(config.generation_devices, config.device)
    ):
        problems.append(f"{_subject(loaded, 'generation_devices')} is {config.generation_devices!r}; {why}")
    if config.database_url:
        if (why := postgres_problem(config.database_url)) is not None:
            problems.append(f"{_subject(loaded, 'database_url')}: {why}")
    elif not config.use_memory_db and (why := database_problem(config.db_file)) is not None:
        problems.append(f"{_subject(loaded, 'db_path')} is {str(config.db_path)!r}; {why}")
    web_ui = config.web_ui_dir
    if web_ui is not None and not (web_ui / "index.html").is_file():
        problems.append(
            f"{_subject(loaded, 'web_ui')} is {config.web_ui!r}; {web_ui} has no index.html: name the folder of a "
            "built frontend (InvokeAI's wheel has it at invokeai/frontend/web/dist), or set builtin"
        )
    if problems:
        raise ConfigError(problems)
