"""Service exceptions as HTTP answers, in FastAPI's own error shapes."""

from __future__ import annotations

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse

from invokeai.app.services.batch import InvalidBatchError
from invokeai.app.services.images import ImageNotFoundError, ImageTooLargeError, UnsupportedImageError
from invokeai.app.services.model_install import ModelSourceNotFoundError
from invokeai.app.services.model_records import DuplicateModelNameError, InvalidModelNameError, ModelNotFoundError
from invokeai.app.services.session_queue import QueueFullError, QueueItemNotFoundError
from invokeai.backend.models.errors import UnsupportedModelError


def _detail(status_code: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status_code)


async def _invalid_batch(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, InvalidBatchError)
    # Shaped like FastAPI's RequestValidationError answer, so that clients handle both the same way.
    detail = [{"loc": ["body", "batch", *error.loc], "msg": error.message, "type": error.kind}]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _not_found(request: Request, error: Exception) -> JSONResponse:
    # KeyError's str() adds quotes; its argument is the message.
    return _detail(status.HTTP_404_NOT_FOUND, str(error.args[0]) if error.args else "not found")


async def _message_not_found(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_404_NOT_FOUND, str(error))


async def _invalid_model_name(request: Request, error: Exception) -> JSONResponse:
    detail = [{"loc": ["body", "name"], "msg": str(error), "type": "value_error"}]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _conflict(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_409_CONFLICT, str(error))


async def _queue_full(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_429_TOO_MANY_REQUESTS, str(error))


async def _too_large(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_413_CONTENT_TOO_LARGE, str(error))


async def _unsupported(request: Request, error: Exception) -> JSONResponse:
    return _detail(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, str(error))


def install_error_handlers(app: FastAPI) -> None:
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
