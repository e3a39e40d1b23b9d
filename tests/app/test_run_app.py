"""`invokeai-web --help`, and the startup order: attention kernels installed before model libraries load."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

Run = Callable[..., subprocess.CompletedProcess[str]]

# Runs run_app.main with the attention install and uvicorn replaced by recorders.
STARTUP_PROBE = """
import json, sys
import invokeai.backend.attention as attention
import invokeai.app.run_app as run_app

calls = []
tuning = []
def install(setting, device=None, **options):
    calls.append(["install", setting, device, sorted(m for m in ("diffusers", "transformers") if m in sys.modules)])
    tuning.append({name: str(value) for name, value in options.items()})
attention.install_attention = install
run_app.serve = lambda app, host, port, on_exit=None: calls.append(["serve", type(app).__name__, host, port])
code = run_app.main(["--root", sys.argv[1], "--port", "0"])
print(json.dumps({"code": code, "calls": calls, "tuning": tuning}))
"""


def test_help_documents_the_options(run_invokeai_web: Run) -> None:
    result = run_invokeai_web("--help")
    assert result.returncode == 0
    for option in ("--root", "--config", "--host", "--port", "INVOKEAI_ROOT", "docs/configuration.md"):
        assert option in result.stdout


def _startup(tmp_path: Path, child_env: Callable[..., dict[str, str]], **env: str) -> subprocess.CompletedProcess[str]:
    """run_app.main under STARTUP_PROBE with these environment variables; it must exit 0."""
    result = subprocess.run(
        [sys.executable, "-c", STARTUP_PROBE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(**env),
    )
    assert result.returncode == 0, result.stderr
    return result


def test_attention_is_installed_first_with_the_configured_setting(
    tmp_path: Path, child_env: Callable[..., dict[str, str]]
) -> None:
    result = _startup(tmp_path, child_env, INVOKEAI_ATTENTION_BACKEND="efficient", INVOKEAI_DEVICE="cpu")
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["code"] == 0
    assert report["calls"] == [["install", "efficient", "cpu", []], ["serve", "FastAPI", "127.0.0.1", 0]]
    assert report["tuning"] == [{"autotune": "False", "autotune_file": str(tmp_path / "attention_autotune.json")}]


def test_attention_autotune_is_passed_to_the_install_with_the_file_under_the_root(
    tmp_path: Path, child_env: Callable[..., dict[str, str]]
) -> None:
    result = _startup(tmp_path, child_env, INVOKEAI_ATTENTION_AUTOTUNE="on", INVOKEAI_DEVICE="cpu")
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["tuning"] == [{"autotune": "True", "autotune_file": str(tmp_path / "attention_autotune.json")}]


def test_an_unknown_environment_variable_is_a_startup_warning(
    tmp_path: Path, child_env: Callable[..., dict[str, str]]
) -> None:
    result = _startup(tmp_path, child_env, INVOKEAI_ATENTION_BACKEND="efficient", INVOKEAI_DEVICE="cpu")
    warnings = [line for line in result.stderr.splitlines() if "[WARNING]" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        "[WARNING] invokeai.app.run_app: environment variable INVOKEAI_ATENTION_BACKEND is not a setting, so it is "
        "ignored (did you mean INVOKEAI_ATTENTION_BACKEND, setting 'attention_backend'?)"
    ), result.stderr
    report = json.loads(result.stdout.splitlines()[-1])
    assert report["calls"][0][:3] == ["install", "auto", "cpu"]  # the misspelt variable changed nothing
