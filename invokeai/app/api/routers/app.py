"""/api/v1/app: facts about the running server (version, effective settings, dependencies, attention kernels, workers,
the model families it runs), its log level and its invocation cache."""

from __future__ import annotations

import logging
import os
import socket
from enum import IntEnum
from importlib.metadata import distributions
from typing import Annotated, Any, Literal

import torch
from fastapi import APIRouter, Body
from pydantic import BaseModel, Field

from invokeai.app.api.dependencies import AppServices, Config
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.config.describe import secret_settings, startup_only_settings
from invokeai.app.nodes.base import invocation_class
from invokeai.app.services.invocation_cache import InvocationCacheStatus
from invokeai.app.services.session_processor import WorkerInfo
from invokeai.app.version import app_version
from invokeai.backend.attention import AttentionStats, attention_stats
from invokeai.backend.devices import available_devices
from invokeai.backend.families import FAMILIES, Family

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


@router.get("/patchmatch_status", operation_id="get_patchmatch_status")
def get_patchmatch_status() -> bool:
    """Whether PatchMatch infill is available, as InvokeAI's web UI asks: this server has no infill nodes."""
    return False


class InvokeAIAppConfigWithSetFields(BaseModel):
    """InvokeAI's runtime_config answer. The settings are this server's (configuration.md), not InvokeAI's."""

    set_fields: list[str] = Field(
        description="The settings given by the command line, the environment or the settings file (not defaults)."
    )
    config: dict[str, Any] = Field(description="Every setting's effective value, except the secret ones (api_token).")


@router.get("/runtime_config", operation_id="get_runtime_config")
def get_runtime_config(config: Config) -> InvokeAIAppConfigWithSetFields:
    return InvokeAIAppConfigWithSetFields(
        set_fields=sorted(config.model_fields_set),
        config=config.model_dump(mode="json", exclude=secret_settings()),
    )


@router.get("/app_deps", operation_id="get_app_deps")
def get_app_deps() -> dict[str, str]:
    """The version of every installed Python distribution (torch, diffusers, transformers, ...) and CUDA's ("N/A"
    without it), by name, as InvokeAI lists them."""
    versions = {dist.metadata["Name"]: dist.version for dist in distributions() if dist.metadata["Name"]}
    versions["CUDA"] = torch.version.cuda or "N/A"
    return dict(sorted(versions.items(), key=lambda item: item[0].lower()))


class LogLevel(IntEnum):
    """InvokeAI's log levels: Python's numbers."""

    NotSet = logging.NOTSET
    Debug = logging.DEBUG
    Info = logging.INFO
    Warning = logging.WARNING
    Error = logging.ERROR
    Critical = logging.CRITICAL


def _server_log_level() -> LogLevel:
    # The root logger's: log_level sets it at start (logging_setup), and every logger of the server passes through
    # it. A level set by other means in between is shown as the level below it.
    level = logging.getLogger().level
    return max((known for known in LogLevel if known <= level), default=LogLevel.NotSet)


@router.get("/logging", operation_id="get_log_level")
def get_log_level() -> LogLevel:
    """The server's log level, as a number (10 debug, 20 info, 30 warning, 40 error, 50 critical)."""
    return _server_log_level()


@router.post("/logging", operation_id="set_log_level")
def set_log_level(
    level: Annotated[LogLevel, Body(description="The new level: 0, 10, 20, 30, 40 or 50 (a bare number).")],
) -> LogLevel:
    """Change the server's log level until it stops (the log_level setting is read again at the next start)."""
    logging.getLogger().setLevel(level)
    return _server_log_level()


@router.get("/invocation_cache/status", operation_id="get_invocation_cache_status")
def get_invocation_cache_status(services: AppServices) -> InvocationCacheStatus:
    """The invocation cache's size, hits and misses (since the start or the last clear), and whether it is used."""
    return services.invocation_cache.status()


@router.delete("/invocation_cache", operation_id="clear_invocation_cache")
def clear_invocation_cache(services: AppServices) -> None:
    """Drop every cached node output, and reset the hits and misses."""
    services.invocation_cache.clear()


@router.put("/invocation_cache/enable", operation_id="enable_invocation_cache")
def enable_invocation_cache(services: AppServices) -> None:
    """Use the cache again (no effect with node_cache_size 0)."""
    services.invocation_cache.enable()


@router.put("/invocation_cache/disable", operation_id="disable_invocation_cache")
def disable_invocation_cache(services: AppServices) -> None:
    """Run every node; what the cache holds stays for a later enable."""
    services.invocation_cache.disable()


class GenerationDeviceOption(BaseModel):
    device: str = Field(description="The device as generation_devices names it: cuda:0, mps, xpu:0 or cpu.")
    name: str = Field(description="The device's name, for people.")


@router.get("/generation_device_options", operation_id="get_generation_device_options")
def get_generation_device_options() -> list[GenerationDeviceOption]:
    """The devices this machine could generate on, for the generation_devices setting (InvokeAI's web UI lists
    them in its settings)."""
    return [GenerationDeviceOption(device=device, name=name) for device, name in available_devices()]


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


class FamilyNodes(BaseModel):
    text_encoder: str = Field(description="The node that encodes a prompt into conditioning.")
    denoise: str = Field(description="The node that denoises latents.")
    decode: str = Field(description="The node that decodes latents into an image.")
    encode: str | None = Field(description="The node that encodes an image into latents (image-to-image); null: none.")
    loader: str | None = Field(
        description="The model loader node whose outputs feed the other nodes; null: each node names the model "
        "itself in its `model` input."
    )


class LoaderLink(BaseModel):
    output: str = Field(description="The loader node's output field.")
    input: str = Field(description="The input field of the node it feeds.")


class FamilyGuidance(BaseModel):
    field: str = Field(description="The denoise node's guidance input.")
    label: str = Field(description="What to call it.")
    off: float = Field(description="The value at which guidance is off (and no negative prompt is used).")


class FamilyDefaults(BaseModel):
    width: int
    height: int
    steps: int
    guidance: float


class FamilyInfo(BaseModel):
    """What a client needs to build one family's generation graphs; every value comes from the family's descriptor
    and its nodes' schemas."""

    name: str = Field(description="The family, as model records name it (`family`).")
    label: str = Field(description="The family's name for people.")
    nodes: FamilyNodes
    loader_links: dict[str, list[LoaderLink]] = Field(
        description="With a loader: per node role (text_encoder, denoise, decode, encode), the loader outputs that "
        "feed it."
    )
    conditioning_field: str = Field(description="The denoise input the prompt's conditioning goes to.")
    negative: Literal["always", "when_given", "never"] = Field(
        description="When a negative prompt's encoder is wired in: always (unless guidance is off), only when a "
        "negative prompt is given, or never (the family takes none)."
    )
    second_prompt_label: str | None = Field(
        description="The text encoder takes a second prompt (`prompt_2`) under this name; null: it takes none."
    )
    steps_field: str = Field(description="The denoise input of the number of steps (steps, or InvokeAI's num_steps).")
    guidance: FamilyGuidance
    size_multiple: int = Field(description="Width and height must be multiples of this.")
    defaults: FamilyDefaults = Field(description="The denoise node's defaults.")
    image_to_image: bool = Field(description="Whether the family's nodes run image-to-image.")
    strength_field: Literal["denoising_strength", "denoising_start"] = Field(
        description="The denoise input of image-to-image: denoising_strength (how much of the schedule runs) or "
        "denoising_start (where it starts: 1 - strength)."
    )
    demos: list[str] = Field(description="The names of the family's demo models.")


def _default(node_type: str, field: str) -> Any:
    node = invocation_class(node_type)
    info = node.model_fields.get(field) if node is not None else None
    if info is None:
        raise LookupError(f"node type {node_type!r} has no input {field!r}")
    return info.default


def family_info(family: Family) -> FamilyInfo:
    graph = family.graph
    denoise = invocation_class(graph.denoise)
    return FamilyInfo(
        name=family.name,
        label=family.title,
        nodes=FamilyNodes(
            text_encoder=graph.text_encoder,
            denoise=graph.denoise,
            decode=graph.decode,
            encode=graph.encode,
            loader=graph.loader,
        ),
        loader_links={
            role: [LoaderLink(output=out, input=into) for out, into in links]
            for role, links in graph.loader_links.items()
        },
        conditioning_field=graph.conditioning_field,
        negative=graph.negative,
        second_prompt_label=graph.second_prompt_label,
        steps_field=graph.steps_field,
        guidance=FamilyGuidance(field=graph.guidance_field, label=graph.guidance_label, off=graph.guidance_off),
        size_multiple=family.constants.size_multiple,
        defaults=FamilyDefaults(
            width=_default(graph.denoise, "width"),
            height=_default(graph.denoise, "height"),
            steps=_default(graph.denoise, graph.steps_field),
            guidance=_default(graph.denoise, graph.guidance_field),
        ),
        image_to_image=graph.encode is not None and denoise is not None and "latents" in denoise.model_fields,
        strength_field=graph.strength_field,
        demos=[demo.name for demo in family.demos],
    )


@router.get("/families", operation_id="app_families")
def get_families() -> list[FamilyInfo]:
    """The model families this server runs, in the registry's order, with what a client needs to build their
    generation graphs (docs/families.md)."""
    return [family_info(family) for family in FAMILIES]
