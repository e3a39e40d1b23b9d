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


def _stderr(drop_filter: bool) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    script = SCRIPT.format(drop_filter=drop_filter)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_the_torchvision_fallback_notice_is_not_logged_but_other_notices_are() -> None:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("torchvision is installed: transformers has no fallback to announce")
    # Without the filter transformers logs it; a skip rather than a failure if a release stops doing so.
    if "requires torchvision" not in _stderr(drop_filter=True):
        pytest.skip("this transformers no longer warns about the torchvision fallback: the filter can go")
    stderr = _stderr(drop_filter=False)
    assert "requires torchvision" not in stderr
    assert "[WARNING] transformers.utils.import_utils: another import notice" in stderr
