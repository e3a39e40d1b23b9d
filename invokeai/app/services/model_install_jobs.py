"""A model install as InvokeAI's clients follow it: a `ModelInstallJob` with a numeric id and a status, which
POST /api/v2/models/install answers with at once and GET install/{id} reports on while the server installs in the
background."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, Field

from invokeai.app.services.model_configs import ModelConfig, ModelRecordChanges


class InstallStatus(StrEnum):
    """InvokeAI's install states; a local install goes waiting -> running -> completed, error or cancelled."""

    WAITING = "waiting"
    DOWNLOADING = "downloading"
    DOWNLOADS_DONE = "downloads_done"
    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    ERROR = "error"
    CANCELLED = "cancelled"


TERMINAL = frozenset({InstallStatus.COMPLETED, InstallStatus.ERROR, InstallStatus.CANCELLED})


class LocalModelSource(BaseModel):
    """A file or folder on the server (InvokeAI's LocalModelSource; its other kinds, a URL and a Hugging Face repo,
    are not installed here yet)."""

    path: str = Field(description="Absolute path on the server.")
    inplace: bool | None = Field(default=False, description="Record the model where it is instead of copying it.")
    type: Literal["local"] = "local"


class ModelInstallJob(BaseModel):
    """One install, as InvokeAI reports it."""

    id: int = Field(description="Unique (in this server's run) id of the job.")
    status: InstallStatus = Field(default=InstallStatus.WAITING, description="Where the install is.")
    error_reason: str | None = Field(default=None, description="The exception's class name, on an error.")
    config_in: ModelRecordChanges = Field(
        default_factory=ModelRecordChanges, description="The record fields the request gave (name, description ...)."
    )
    config_out: ModelConfig | None = Field(default=None, description="The installed model's record, once completed.")
    inplace: bool = Field(default=False, description="Whether the model is recorded where it is (not copied).")
    source: LocalModelSource = Field(description="What is installed.")
    local_path: str = Field(description="Where the model's files are read from (the source path, for a local one).")
    bytes: int = Field(default=0, description="Bytes copied (or hashed, in place) so far.")
    total_bytes: int = Field(default=0, description="Bytes of the model's files (0 until probed).")
    source_metadata: None = Field(default=None, description="Always null (a local source has none).")
    download_parts: list[dict[str, int | str]] = Field(
        default_factory=list, description="Always empty (a local source downloads nothing)."
    )
    error: str | None = Field(default=None, description="On an error, what went wrong.")
    error_traceback: str | None = Field(default=None, description="On an error, the traceback.")
