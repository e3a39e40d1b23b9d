"""Validators for the inputs InvokeAI's nodes have for features this server lacks. Such an input is kept, so that
InvokeAI's graphs validate unchanged, but only its empty or default value is accepted: any other is refused at
validation, naming what is missing, rather than run without what the client asked for."""

from __future__ import annotations

from typing import Any

from pydantic import AfterValidator


def unsupported(what: str, allowed: str = "null") -> AfterValidator:
    """Null, or an empty list (what an empty collect gives), passes; any other value is refused. Pydantic's error
    names the node and the input."""

    def check(value: Any) -> Any:
        if value is not None and value != []:
            raise ValueError(f"{what} is not supported by this server yet; send {allowed}")
        return value

    return AfterValidator(check)


def only(expected: Any, what: str) -> AfterValidator:
    """The only supported value is InvokeAI's default (the others need a feature this server lacks)."""

    def check(value: Any) -> Any:
        if value != expected:
            raise ValueError(f"{what} is not supported by this server yet; send {expected!r}")
        return value

    return AfterValidator(check)
