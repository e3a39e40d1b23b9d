"""InvokeAI 6.14.2's own release, for the tests that run its parts against this server: its built web UI and its
default workflows. Fetched at test time from PyPI (`pip download invokeai==6.14.2 --no-deps`) and unpacked to a
temporary folder; never committed, never shipped."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

RELEASE = "invokeai==6.14.2"
FRONTEND = "invokeai/frontend/web/dist/"
DEFAULT_WORKFLOWS = "invokeai/app/services/workflow_records/default_workflows/"


def unpack_release(folder: Path) -> Path:
    """Download the wheel into `folder` and unpack its web UI and default workflows there; the folder they are
    under (an `invokeai/` tree). The wheel is pure Python (13 MB) and nothing of it is installed or imported."""
    wheels = folder / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels), RELEASE],
        check=True,
        timeout=300,
    )
    [wheel] = wheels.glob("invokeai-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        wanted = [name for name in archive.namelist() if name.startswith((FRONTEND, DEFAULT_WORKFLOWS))]
        archive.extractall(folder, members=wanted)
    return folder


def frontend(release: Path) -> Path:
    return release / FRONTEND


def default_workflow(release: Path, name: str) -> Path:
    return release / DEFAULT_WORKFLOWS / f"{name}.json"
