"""wait_until, for the API and queue tests' helpers. Importable by name from tests/app/*/: pytest (rootdir-relative
"prepend" import mode) puts tests/app on sys.path when it loads tests/app/conftest.py, before any test below it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    condition: Callable[[], Any], timeout: float = 10.0, what: str = "the condition", interval: float = 0.01
) -> Any:
    """The first truthy result of `condition()`, polled every `interval` s; AssertionError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
