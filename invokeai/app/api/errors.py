"""Service exceptions as HTTP answers, in FastAPI's own error shapes; every error body encodable."""

from __future__ import annotations

import math
import re
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.utils import is_body_allowed_for_status_code
from starlette.exceptions import HTTPException
from starlette.routing import compile_path

from invokeai.app.api.outage import install_outage_handler
from invokeai.app.services.batch import InvalidBatchError
from invokeai.app.services.boards import BoardNotFoundError, TooManyBoardsError
from invokeai.app.services.client_state import ClientStateFullError, ClientStateValueTooLargeError
from invokeai.app.services.images import ImageNotFoundError, ImageTooLargeError, UnsupportedImageError
from invokeai.app.services.model_install import (
    InstallJobsFullError,
    ModelSourceNotFoundError,
    ProbedFieldMismatchError,
    UnsupportedSourceError,
)
from invokeai.app.services.model_records import DuplicateModelNameError, InvalidModelNameError, ModelNotFoundError
from invokeai.app.services.session_queue import QueueFullError, QueueItemNotFoundError
from invokeai.app.services.workflows import WorkflowLibraryFullError, WorkflowNotFoundError
from invokeai.backend.models.errors import UnsupportedModelError


def _encodable(value: Any) -> Any:
    """`value` with what JSON text cannot carry spelled out: non-finite floats as their names, lone surrogates as
    backslash escapes."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(item) for item in value]
    return value


class ErrorResponse(JSONResponse):
    """A JSON error answer that can always be sent. Bodies are decoded strictly (json_body.py), so an error does
    not normally echo a value JSON cannot carry; should one get through anyway, the answer still goes out, with
    that value spelled out, instead of failing as a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except (ValueError, UnicodeEncodeError):
            return super().render(_encodable(content))


def _detail(status_code: int, message: str) -> JSONResponse:
    return ErrorResponse({"detail": message}, status_code=status_code)


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return ErrorResponse({"detail": jsonable_encoder(error.errors())}, status_code=422)


def _allowed_methods(app: FastAPI, path: str) -> str:
    """The methods the OpenAPI document lists for the paths `path` matches: a 405 names the same ones."""
    templates: list[tuple[re.Pattern[str], set[str]]] | None = getattr(app.state, "allowed_methods", None)
    if templates is None:
        templates = [
            (compile_path(template)[0], {method.upper() for method in operations})
            for template, operations in app.openapi()["paths"].items()
        ]
        app.state.allowed_methods = templates
    methods = set().union(*(allowed for regex, allowed in templates if regex.match(path)))
    return ", ".join(sorted(methods))


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    headers = dict(error.headers or {})
    if error.status_code == status.HTTP_405_METHOD_NOT_ALLOWED:
        # Starlette names the methods of the first route of the path, not of all its routes.
        headers["Allow"] = _allowed_methods(request.app, request.url.path)
    if not is_body_allowed_for_status_code(error.status_code):
        return Response(status_code=error.status_code, headers=headers)
    return ErrorResponse({"detail": error.detail}, status_code=error.status_code, headers=headers)


async def _invalid_batch(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, InvalidBatchError)
    # Shaped like FastAPI's RequestValidationError answer, so that clients handle both the same way.
    detail = [{"loc": ["body", "batch", *error.loc], "msg": error.message, "type": error.kind}]
    return ErrorResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _not_found(request: Request, error: Exception) -> JSONResponse:
    # KeyError's str() adds quotes; its argument is the message.
    return _detail(status.HTTP_404_NOT_FOUND, str(error.args[0]) if error.args else "not found")


async def _message_not_found(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_404_NOT_FOUND, str(error))


async def _invalid_model_name(request: Request, error: Exception) -> JSONResponse:
    detail = [{"loc": ["body", "name"], "msg": str(error), "type": "value_error"}]
    return ErrorResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _unsupported_source(request: Request, error: Exception) -> JSONResponse:
    detail = [{"loc": ["query", "source"], "msg": str(error), "type": "value_error"}]
    return ErrorResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _probed_field_mismatch(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, ProbedFieldMismatchError)
    detail = [{"loc": ["body", text.split(" ", 1)[0]], "msg": text, "type": "value_error"} for text in error.mismatches]
    return ErrorResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _conflict(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_409_CONFLICT, str(error))


async def _queue_full(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_429_TOO_MANY_REQUESTS, str(error))


async def _too_large(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_413_CONTENT_TOO_LARGE, str(error))


async def _unsupported(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, str(error))


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(InvalidBatchError, _invalid_batch)
    app.add_exception_handler(QueueItemNotFoundError, _not_found)
    app.add_exception_handler(ImageNotFoundError, _not_found)
    app.add_exception_handler(QueueFullError, _queue_full)
    app.add_exception_handler(ImageTooLargeError, _too_large)
    app.add_exception_handler(UnsupportedImageError, _unsupported)
    app.add_exception_handler(ModelNotFoundError, _not_found)
    app.add_exception_handler(ModelSourceNotFoundError, _message_not_found)
    # The request is well formed; what its source points at is not a model this server reads.
    app.add_exception_handler(UnsupportedModelError, _unsupported)
    app.add_exception_handler(DuplicateModelNameError, _conflict)
    app.add_exception_handler(InvalidModelNameError, _invalid_model_name)
    # Boards, client state and the workflow library.
    for not_found in (BoardNotFoundError, WorkflowNotFoundError):
        app.add_exception_handler(not_found, _message_not_found)
    for full in (TooManyBoardsError, ClientStateFullError, WorkflowLibraryFullError):
        app.add_exception_handler(full, _conflict)
    app.add_exception_handler(ClientStateValueTooLargeError, _too_large)
    app.add_exception_handler(UnsupportedSourceError, _unsupported_source)
    app.add_exception_handler(ProbedFieldMismatchError, _probed_field_mismatch)
    app.add_exception_handler(InstallJobsFullError, _queue_full)
    install_outage_handler(app)


# What the request body's own parsing can answer, for every operation that takes a body; the routes declare the
# rest. The texts say what docs/api.md says.
_BODY_ERRORS: dict[str, dict[str, str]] = {
    "application/json": {
        "400": "The body is not JSON text the server can read: not UTF-8, arrays and objects nested more than "
        "about 900 levels deep, or an integer of more than 4300 digits.",
    },
    "multipart/form-data": {
        "400": "The multipart body is malformed (no boundary, a part without a name, broken framing), has more "
        "than 1000 fields or files, or a part other than a file of more than 1 MB.",
    },
}
_TOO_LARGE = "The body is larger than max_upload_mb plus 1 MB (refused while it arrives)."
_NOT_AN_OPERATION = (
    "Besides the statuses each operation lists: 404 for a path that is not here, 405 for a method a path does "
    "not have (its `Allow` header names the methods listed here for that path), and 503 with `Retry-After` from "
    "an operation that needs the database while it cannot be reached."
)


def add_body_errors(document: dict[str, Any]) -> None:
    """List, on every operation with a body, the 400 and 413 that reading it can answer, and say in the
    description what no operation answers (404 and 405 for paths and methods that are not here, 503 in an
    outage)."""
    document["info"]["description"] = _NOT_AN_OPERATION
    for operations in document["paths"].values():
        for operation in operations.values():
            body = operation.get("requestBody")
            if body is None:
                continue
            responses = operation["responses"]
            for media_type in body["content"]:
                for code, description in _BODY_ERRORS[media_type].items():
                    responses.setdefault(code, {"description": description})
            responses.setdefault("413", {"description": _TOO_LARGE})
            # In numeric order, as the routes' own statuses are.
            operation["responses"] = dict(sorted(responses.items()))
