"""Temporary files and folders in folders that several servers may share (outputs_dir, models_dir, docs/scale.md):
named with the host and the process that made them, so that a server starting up removes only what a dead process
left behind, never what another live server is writing at that moment."""

from __future__ import annotations

import os
import re
import socket
import time
import uuid
from pathlib import Path

# A temporary of another host that nothing has written for this long is left over: an image write takes
# milliseconds, and a model copy keeps writing into its staging folder.
STALE_AFTER_S = 3600.0

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# Greedy host: a host name may itself hold "-<digits>-"; the pid and the token are the last two fields.
_OWNED = re.compile(r"^(?P<host>.+)-(?P<pid>[0-9]+)-(?P<token>[^-]+)$")


def host_name() -> str:
    """This host as it appears in temporaries' names (and in messages about files this host cannot see)."""
    return socket.gethostname()


def _name_part(host: str) -> str:
    return _UNSAFE.sub("_", host) or "unknown"


def owner_tag() -> str:
    """`<host>-<pid>`: what a temporary's name says about who writes it. Computed at each call: a forked process
    has its own pid."""
    return f"{_name_part(host_name())}-{os.getpid()}"


def temporary_name(prefix: str, suffix: str = "") -> str:
    """A unique name for a temporary of this process: `<prefix><host>-<pid>-<random><suffix>`."""
    return f"{prefix}{owner_tag()}-{uuid.uuid4().hex}{suffix}"


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _last_write(path: Path) -> float:
    """The newest modification time of the file, or of the folder and anything in it."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for folder, _, files in os.walk(path):
            for name in (folder, *(os.path.join(folder, file) for file in files)):
                try:
                    newest = max(newest, os.lstat(name).st_mtime)
                except FileNotFoundError:
                    continue
    return newest


def is_leftover(path: Path, prefix: str, *, now: float | None = None, stale_after: float = STALE_AFTER_S) -> bool:
    """Whether the temporary at `path` (named `<prefix>...`) was left behind by a process that is gone: one of
    this host whose process no longer runs, or any whose files have not changed for `stale_after` seconds. A
    temporary of another host is never judged by its pid (that host's processes are not visible from here). A name
    without an owner was left by an older version, which does not run beside this one on a shared database: a
    leftover."""
    owned = _OWNED.match(path.name[len(prefix) :]) if path.name.startswith(prefix) else None
    if owned is None:
        return True
    if owned["host"] == _name_part(host_name()):
        pid = int(owned["pid"])
        if pid != os.getpid() and not _pid_alive(pid):
            return True
    try:
        age = (time.time() if now is None else now) - _last_write(path)
    except FileNotFoundError:
        return False  # gone meanwhile: nothing to remove
    return age > stale_after
