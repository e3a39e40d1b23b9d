"""Model libraries' messages go through the server's log; the torchvision fallback notice of transformers does not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import logging
from invokeai.app.logging_setup import configure_logging, route_ml_library_logging
configure_logging("info")
route_ml_library_logging()
if {drop_filter}:
    logging.getLogger("transformers.utils.import_utils").filters.clear()
from diffusers import StableDiffusionPipeline  # imports CLIPImageProcessor, which has a torchvision fallback
logging.getLogger("transformers.utils.import_utils").warning("another import notice")
"""


def _stderrs() -> tuple[str, str]:
    """What a fresh process logs importing diffusers without the filter, and with it. The two run side by side: each
    spends seconds importing diffusers."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT.format(drop_filter=drop)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for drop in (True, False)
    ]
    stderrs = []
    for run in runs:
        _, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr
        stderrs.append(stderr)
    return stderrs[0], stderrs[1]


def test_the_torchvision_fallback_notice_is_not_logged_but_other_notices_are() -> None:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torchvision is installed: transformers has no fallback to announce")
    unfiltered, stderr = _stderrs()
    # Without the filter transformers logs it; a skip rather than a failure if a release stops doing so.
    if "requires torchvision" not in unfiltered:
        pytest.skip("this transformers no longer warns about the torchvision fallback: the filter can go")
    assert "requires torchvision" not in stderr
    assert "[WARNING] transformers.utils.import_utils: another import notice" in stderr
