"""Process-wide logging: one format for InvokeAI's and uvicorn's messages."""

from __future__ import annotations

import logging

LOG_FORMAT = "%(asctime)s [%(levelname)s] %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    # force=True replaces any handler a library installed on import. uvicorn is started with log_config=None,
    # so its loggers (uvicorn.error, uvicorn.access) have no handlers of their own and propagate to this one.
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, force=True)


_ML_LIBRARIES = ("transformers", "diffusers")


class _NoTorchvisionFallbackNotice(logging.Filter):
    """transformers warns, on importing the pipelines' image processors, that it falls back to their PIL versions
    without torchvision. The server never runs an image processor (the families it serves take text and latents), so
    the warning would only alarm an admin at every start."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "requires torchvision" not in record.getMessage()


def route_ml_library_logging() -> None:
    """transformers and diffusers print through stderr handlers of their own, and draw tqdm bars while saving or
    loading; send their messages through ours instead, so that every line of the server log has one format.

    Call it before the first model is built or loaded (it imports both libraries' logging modules, which takes
    seconds, so it is not part of configure_logging). Idempotent.
    """
    import importlib

    for library in _ML_LIBRARIES:
        library_logging = importlib.import_module(f"{library}.utils.logging")
        library_logging.disable_default_handler()
        library_logging.enable_propagation()
        library_logging.disable_progress_bar()
    # The GGUF writer logs every file it writes at INFO, including the staging paths of the demo build.
    logging.getLogger("gguf").setLevel(logging.WARNING)
    import_notices = logging.getLogger("transformers.utils.import_utils")
    if not any(isinstance(f, _NoTorchvisionFallbackNotice) for f in import_notices.filters):
        import_notices.addFilter(_NoTorchvisionFallbackNotice())
