"""Run a function in a forked child process and return its JSON-able result, for the calibration scripts that
measure a peak (RSS) from a fresh copy of an already-importing parent. Standard library only: gpu_check.sh runs
these scripts on a machine with torch and nothing else of the server's.

The scripts are run as `python scripts/NAME.py`, so this folder is sys.path[0] and they import it as `_forked`.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from typing import Any


def in_forked_child(function: Callable[..., Any], *args: Any, what: str, setup: Callable[[], Any] | None = None) -> Any:
    """`function(*args)` in a forked child (after `setup()` there, when given), its result sent back as JSON; a
    child that fails prints its traceback and raises RuntimeError here, naming `what`."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.close(read_end)
            if setup is not None:
                setup()
            with os.fdopen(write_end, "w") as pipe:
                json.dump(function(*args), pipe)
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise RuntimeError(f"child for {what} failed (wait status {status})")
    return json.loads(data)
