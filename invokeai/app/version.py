"""The installed InvokeAI version."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import invokeai


def app_version() -> str:
    try:
        return version("invokeai")
    except PackageNotFoundError:
        # Running from a source tree that was never pip-installed.
        return invokeai.__version__
