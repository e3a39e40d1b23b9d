"""A denoise node's conditioning input as InvokeAI types it: one conditioning or a list (what a collect node
gives; InvokeAI's regional prompting passes several). This server takes one: the validators refuse more, naming
why, and `single` gives the one."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import AfterValidator

T = TypeVar("T")


def _exactly_one(value: Any) -> Any:
    if isinstance(value, list) and len(value) != 1:
        raise ValueError(
            f"{len(value)} conditionings given; this server takes exactly one (regional prompts are not supported)"
        )
    return value


def _at_most_one(value: Any) -> Any:
    if isinstance(value, list) and len(value) > 1:
        raise ValueError(f"{len(value)} conditionings given; this server takes at most one")
    return value


ONE = AfterValidator(_exactly_one)  # a positive conditioning: one, or a list of one
AT_MOST_ONE = AfterValidator(_at_most_one)  # a negative conditioning: none, an empty list, one, or a list of one


def single(value: T | list[T] | None) -> T | None:
    """The one conditioning of a validated input (None for none or an empty list)."""
    if isinstance(value, list):
        return value[0] if value else None
    return value
