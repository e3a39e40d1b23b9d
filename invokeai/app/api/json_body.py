"""Request bodies as JSON that every later step can handle: the one place where a JSON body is decoded.

Python's json module takes `NaN`, `Infinity` and `-Infinity`, turns `1e999` into infinity, keeps lone surrogates
(`"\\ud800"`) in strings, and reads bytes as UTF-16 or UTF-32 when they look like it. pydantic then stores the
non-finite numbers as null, and a lone surrogate or a non-finite number in an error answer cannot be encoded at all
(a 500). So a body is decoded here, strictly, before any route sees it: UTF-8 only (RFC 8259 8.1), numbers finite,
strings whole Unicode. What is refused gets a 422 naming each place (FastAPI's `loc`: `["body", ...]`), or a 400
for a body that is not JSON text at all (not UTF-8, nested too deeply, an integer too long to convert).

Every API router uses `ApiRoute`, whose requests decode JSON this way (tests/app/api/test_request_bodies.py
checks that no route is left out).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request, Response, status
from fastapi.routing import APIRoute

# An escaped UTF-16 surrogate, the only way a lone surrogate gets into a string once the bytes are strict UTF-8
# (the decoder joins escaped pairs into one character). Seeing one is rare: only then are the strings searched.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# Python refuses to convert longer digit strings to int (sys.get_int_max_str_digits()); json reports it as a
# plain ValueError.
_INT_DIGITS_MESSAGE = "integer string conversion"

Loc = list[str | int]


class _NonFinite:
    """Stands in for a number JSON should not carry, so that its place in the body can be found and named."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class BodyRefused(HTTPException):
    """A body refused while it was decoded. An HTTPException, so that FastAPI passes it on unchanged (it turns
    any other exception raised while reading the body into a bare 400)."""


def _has_lone_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _printable(value: str) -> str:
    # The error answer names the string, so it must itself be encodable.
    return value.encode("utf-8", "backslashreplace").decode("utf-8")


def _errors(document: Any, check_strings: bool) -> list[dict[str, Any]]:
    """Each non-finite number and each string (or key) with a lone surrogate, with its place. Iterative: a body
    may nest as deeply as the decoder allows, deeper than Python's recursion limit leaves room for here."""
    errors: list[dict[str, Any]] = []
    stack: list[tuple[Any, Loc]] = [(document, ["body"])]
    while stack:
        value, loc = stack.pop()
        if isinstance(value, _NonFinite):
            errors.append(
                {
                    "loc": loc,
                    "msg": f"{value.text} is not a finite number: NaN, Infinity and numbers too large for a "
                    "64-bit float are refused, since JSON cannot give them back",
                    "type": "finite_number",
                    "input": value.text,
                }
            )
        elif isinstance(value, str):
            if check_strings and _has_lone_surrogate(value):
                errors.append(_surrogate_error(loc, value))
        elif isinstance(value, dict):
            for key, item in value.items():
                if check_strings and _has_lone_surrogate(key):
                    errors.append(_surrogate_error(loc, key, " (a key)"))
                    key = _printable(key)
                stack.append((item, [*loc, key]))
        elif isinstance(value, list):
            stack.extend((item, [*loc, index]) for index, item in enumerate(value))
    # The stack visits places in reverse; report them in the body's order.
    errors.reverse()
    return errors


def _surrogate_error(loc: Loc, value: str, what: str = "") -> dict[str, Any]:
    return {
        "loc": loc,
        "msg": f"the string{what} holds a lone UTF-16 surrogate (an unpaired \\ud800 to \\udfff escape), which is "
        "not a Unicode character",
        "type": "string_unicode",
        "input": _printable(value),
    }


def decode_json(body: bytes) -> Any:
    """The body's JSON value. Raises BodyRefused: 400 for bytes that are not JSON text this parser can read,
    422 (listing every place) for non-finite numbers and lone surrogates. Malformed JSON raises
    json.JSONDecodeError, which FastAPI answers with its own 422 (json_invalid, with the position)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise BodyRefused(
            status.HTTP_400_BAD_REQUEST,
            f"the body is not valid UTF-8 (byte {error.start}): JSON must be sent as UTF-8",
        ) from None
    refused = False

    def non_finite(literal: str) -> Any:
        nonlocal refused
        refused = True
        return _NonFinite(literal)

    def parse_float(literal: str) -> Any:
        number = float(literal)
        return number if math.isfinite(number) else non_finite(literal)

    try:
        document = json.loads(text, parse_constant=non_finite, parse_float=parse_float)
    except RecursionError:
        raise BodyRefused(
            status.HTTP_400_BAD_REQUEST,
            "the body nests arrays and objects deeper than the JSON parser allows (about 900 levels)",
        ) from None
    except json.JSONDecodeError:
        raise
    except ValueError as error:
        if _INT_DIGITS_MESSAGE not in str(error):
            raise
        raise BodyRefused(
            status.HTTP_400_BAD_REQUEST,
            "the body holds an integer of more than 4300 digits, more than the JSON parser converts",
        ) from None
    check_strings = _SURROGATE_ESCAPE.search(text) is not None
    if refused or check_strings:
        errors = _errors(document, check_strings)
        if errors:
            raise BodyRefused(status.HTTP_422_UNPROCESSABLE_CONTENT, errors)
    return document


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = decode_json(await self.body())
        return self._json


class ApiRoute(APIRoute):
    """The route class of every API router: its handler reads the request as a StrictJSONRequest."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict_handler(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict_handler
