"""Configuration errors as short messages that name where the value came from, the value and what is allowed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from invokeai.app.config.describe import SETTINGS, allowed_values, is_enumerated, is_secret
from invokeai.app.config.settings import REASONED_ERROR


class ConfigError(Exception):
    """Bad configuration input. Each problem is one line for the user, e.g.
    "/home/me/invokeai/invokeai.yaml: 'attention_backend' is 'fast'; allowed: auto, sage, ...".
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def show_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()  # as YAML writes it: `port: true` is reported as true, not True
    return "empty" if value is None else repr(value)


def bad_value(subject: str, name: str, value: Any) -> str:
    """One problem line; `subject` says where the value came from ("file: 'port'", "option --port")."""
    wanted = ("allowed: " if is_enumerated(name) else "expected ") + allowed_values(name)
    shown = "(hidden: a secret setting)" if is_secret(name) else show_value(value)
    return f"{subject} is {shown}; {wanted}"


def problems_by_setting(error: ValidationError, subject: Callable[[str], str]) -> dict[str, str]:
    """One problem line per invalid setting (its first error); `subject(name)` names the source of that setting."""
    problems: dict[str, str] = {}
    for detail in error.errors():
        name = str(detail["loc"][0]) if detail["loc"] else ""
        if name in problems:
            continue
        if name in SETTINGS and detail["type"] == REASONED_ERROR:
            problems[name] = f"{subject(name)} is {show_value(detail['input'])}; {detail['msg']}"
        elif name in SETTINGS:
            problems[name] = bad_value(subject(name), name, detail["input"])
        else:
            # Unknown keys are rejected before validation, so this is a safety net, not a user-facing path.
            problems[name] = f"{subject(name)}: {detail['msg']}"
    return problems
