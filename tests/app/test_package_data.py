"""A wheel built from the checkout ships the web UI's build (no Node.js at run time: the page comes from the
installed package)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UI = REPO / "invokeai" / "app" / "web_ui"


def test_a_wheel_of_the_checkout_ships_the_web_ui(tmp_path: Path) -> None:
    # A copy: pip builds in the source tree, and the checkout must not get a build/ folder.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "invokeai", source / "invokeai", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), source],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr
    [wheel] = tmp_path.glob("invokeai-*.whl")
    members = set(zipfile.ZipFile(wheel).namelist())
    ui_files = sorted(path.relative_to(REPO).as_posix() for path in UI.rglob("*") if path.is_file())
    assert "invokeai/app/web_ui/index.html" in ui_files
    assert any(name.startswith("invokeai/app/web_ui/assets/") for name in ui_files)
    assert [name for name in ui_files if name not in members] == []
