"""Whether a value of an output's type may flow into an input's type along an edge."""

from __future__ import annotations

import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

_UNION_ORIGINS = (Union, types.UnionType)


def _unwrap(tp: Any) -> Any:
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _members(tp: Any) -> list[Any]:
    """A union's members (None left out: whether None may flow is the node's own validation's business)."""
    tp = _unwrap(tp)
    if get_origin(tp) in _UNION_ORIGINS:
        return [member for arg in get_args(tp) for member in _members(arg)]
    return [] if tp is type(None) else [tp]


def _member_fits(source: Any, destination: Any) -> bool:
    if destination is Any or source is Any or source == destination:
        return True
    if get_origin(source) is Literal:
        values = get_args(source)
        if get_origin(destination) is Literal:
            return set(values) <= set(get_args(destination))
        return all(can_connect(type(value), destination) for value in values)
    # bool is an int subclass in Python, but a flag feeding a number is far more likely a wiring mistake.
    if source is bool:
        return destination is bool
    if source is int and destination is float:
        return True
    source_origin, destination_origin = get_origin(source), get_origin(destination)
    if source_origin is not None or destination_origin is not None:
        if source_origin != destination_origin:
            return False
        source_args, destination_args = get_args(source), get_args(destination)
        if len(source_args) != len(destination_args):
            return False
        return all(can_connect(s, d) for s, d in zip(source_args, destination_args, strict=True))
    return isinstance(source, type) and isinstance(destination, type) and issubclass(source, destination)


def can_connect(source: Any, destination: Any) -> bool:
    """True if every value an output of type `source` may hold is acceptable to an input of type `destination`:
    the same type, int into float, a subclass into its base, anything into Any."""
    if _unwrap(destination) is Any or _unwrap(source) is Any:
        return True
    destinations = _members(destination)
    sources = _members(source)
    if not sources:
        return False
    return all(any(_member_fits(s, d) for d in destinations) for s in sources)


def type_name(tp: Any) -> str:
    tp = _unwrap(tp)
    if isinstance(tp, type) and get_origin(tp) is None:
        return tp.__name__
    return str(tp).replace("typing.", "")


def union_members(tp: Any) -> list[Any]:
    """The types a value of `tp` may have: a union's members (None left out), or `tp` itself."""
    return _members(tp)


def list_item_types(tp: Any) -> list[Any] | None:
    """The item types of the lists `tp` admits (Any where it admits anything); None if it admits no list."""
    if _unwrap(tp) is Any:
        return [Any]
    items: list[Any] = []
    for member in _members(tp):
        if member is Any:
            items.append(Any)
        elif get_origin(member) is list:
            args = get_args(member)
            items.extend(union_members(args[0]) if args else [Any])
    return items or None
