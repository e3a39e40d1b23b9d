"""/api/v1/app: facts about the running server (version, effective settings, attention kernels, workers)."""

from __future__ import annotations

import os
import socket
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, Field

from invokeai.app.api.dependencies import AppServices, Config
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.config.describe import secret_settings, startup_only_settings
from invokeai.app.services.session_processor import WorkerInfo
from invokeai.app.version import app_version
from invokeai.backend.attention import AttentionStats, attention_stats

router = APIRouter(prefix="/app", tags=["app"], route_class=ApiRoute)


class AppVersion(BaseModel):
    version: str = Field(description="The installed InvokeAI version.")


class AppConfig(BaseModel):
    root: str = Field(description="The root folder; relative path settings resolve against it.")
    config_file: str | None = Field(description="The settings file that was read, or written on first start.")
    config: dict[str, Any] = Field(
        description="Every setting's effective value (command line, environment, file, default), except the "
        "secret ones (api_token)."
    )
    startup_only: list[str] = Field(description="The settings that take effect only at the next start.")


@router.get("/version", operation_id="app_version")
def get_version() -> AppVersion:
    return AppVersion(version=app_version())


@router.get("/config", operation_id="app_config")
def get_config(config: Config) -> AppConfig:
    return AppConfig(
        root=str(config.root),
        config_file=str(config.config_file) if config.config_file else None,
        config=config.model_dump(mode="json", exclude=secret_settings()),
        startup_only=startup_only_settings(),
    )


@router.get("/attention", operation_id="app_attention")
def get_attention() -> AttentionStats:
    """The attention package's record, field for field (docs/attention.md)."""
    return attention_stats()


class ServerIdentity(BaseModel):
    host: str = Field(description="The host name this server runs on.")
    pid: int = Field(description="The server's process id.")


class DevicesInfo(BaseModel):
    server: ServerIdentity = Field(description="Which server process answers (a queue item's `worker` names it).")
    workers: list[WorkerInfo] = Field(description="One session worker per generation device, in setting order.")


@router.get("/devices", operation_id="app_devices")
def get_devices(services: AppServices) -> DevicesInfo:
    """The session workers (generation_devices): each one's device, whether it is busy, its current item, the
    items it completed and the models in the shared RAM cache with whether its device holds them."""
    return DevicesInfo(
        server=ServerIdentity(host=socket.gethostname(), pid=os.getpid()), workers=services.processor.workers()
    )
