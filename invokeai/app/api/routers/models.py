"""/api/v2/models: list, find, read, change and delete models; install them as jobs; scan a folder for them. The
records, filters, jobs and answers are InvokeAI 6.14.2's (docs/api.md lists what differs)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Query, status
from pydantic import BaseModel, Field

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.invokeai_taxonomy import BaseModelType, ModelFormat, ModelType
from invokeai.app.services.model_configs import ModelConfig, ModelRecordChanges, configs, matching, model_config
from invokeai.app.services.model_install import (
    MAX_JOBS,
    InstallJobNotFoundError,
    ProbedFieldMismatchError,
    check_source,
)
from invokeai.app.services.model_install_jobs import ModelInstallJob
from invokeai.app.services.model_records import ModelFamily

router = APIRouter(prefix="/models", tags=["models"], route_class=ApiRoute)

NOT_FOUND = {404: {"description": "No model with that key."}}
NAME_TAKEN = {409: {"description": "Another model has that name (names are unique, case-insensitively)."}}
# What scan_folder walks at most: a folder with more entries under it is refused rather than walked for minutes.
MAX_SCAN_ENTRIES = 100_000
MAX_SCAN_DEPTH = 16
# What scan_folder lists: what install takes (pipeline folders, safetensors and GGUF files).
_MODEL_SUFFIXES = (".safetensors", ".gguf")
_MAX_FILTER_VALUES = 64


class ModelsList(BaseModel):
    models: list[ModelConfig]


class FoundModel(BaseModel):
    path: str = Field(description="Path of a model folder or file found.")
    is_installed: bool = Field(description="Whether a model record has that path.")


@router.get("/", operation_id="list_model_records")
def list_models(
    services: AppServices,
    base_models: Annotated[
        list[BaseModelType] | None,  # type: ignore[valid-type]
        Query(description="Only models of these bases (any of them).", max_length=_MAX_FILTER_VALUES),
    ] = None,
    model_type: Annotated[ModelType | None, Query(description="Only models of this type.")] = None,  # type: ignore[valid-type]
    model_name: Annotated[str | None, Query(description="Only the model of this exact name.", max_length=200)] = None,
    model_format: Annotated[ModelFormat | None, Query(description="Only models of this format.")] = None,  # type: ignore[valid-type]
    family: Annotated[ModelFamily | None, Query(description="Only models of this family (this server's own).")] = None,  # type: ignore[valid-type]
) -> ModelsList:
    """Installed models, by name; the filters given all apply."""
    records = matching(
        services.models.records.list(family=family),
        base_models=base_models,
        model_type=model_type,
        model_name=model_name,
        model_format=model_format,
    )
    return ModelsList(models=configs(records))


@router.get(
    "/get_by_attrs",
    operation_id="get_model_records_by_attrs",
    responses={404: {"description": "No model has that name, type and base."}},
)
def get_model_by_attrs(
    services: AppServices,
    name: Annotated[str, Query(description="The model's name.", max_length=200)],
    type: Annotated[ModelType, Query(description="The model's type.")],  # type: ignore[valid-type]
    base: Annotated[BaseModelType, Query(description="The model's base.")],  # type: ignore[valid-type]
) -> ModelConfig:
    """The model of that name, type and base."""
    found = matching(services.models.records.list(), base_models=[base], model_type=type, model_name=name)
    if not found:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no model named {name!r} of type {type!r} and base {base!r}")
    return model_config(found[0])


@router.get(
    "/scan_folder",
    operation_id="scan_for_models",
    responses={
        400: {"description": "The path is not a folder this server can scan, or has too much under it."},
        422: {"description": "scan_path is missing or not an absolute path."},
    },
)
def scan_for_models(
    services: AppServices,
    scan_path: Annotated[str, Query(description="Absolute path of a folder on the server.", max_length=4096)],
) -> list[FoundModel]:
    """The models under the folder that install could take (pipeline folders with a model_index.json, .safetensors
    and .gguf files; not probed), each saying whether a record has its path. Hidden folders are skipped and links are
    not followed."""
    root = check_source(scan_path)
    if not root.is_dir():
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"the search path {scan_path!r} could not be scanned")
    installed = {_resolved(record.path) for record in services.models.records.list()}
    return [FoundModel(path=str(path), is_installed=_resolved(str(path)) in installed) for path in _scan(root)]


def _resolved(path: str) -> str:
    return str(Path(path).resolve())


def _scan(root: Path) -> list[Path]:
    found: list[Path] = []
    seen = 0
    for folder, dirs, files in os.walk(root):
        here = Path(folder)
        seen += len(dirs) + len(files)
        if seen > MAX_SCAN_ENTRIES:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                f"more than {MAX_SCAN_ENTRIES} entries under {str(root)!r}: scan a folder with fewer",
            )
        if "model_index.json" in files:
            found.append(here)
            dirs.clear()  # a pipeline's component folders are part of it
            continue
        depth = len(here.relative_to(root).parts)
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < MAX_SCAN_DEPTH else []
        found += [here / f for f in sorted(files) if f.lower().endswith(_MODEL_SUFFIXES) and not f.startswith(".")]
    return found


@router.get("/missing", operation_id="list_missing_models")
def list_missing_models(services: AppServices) -> ModelsList:
    """Installed models whose files this server cannot see (deleted or moved behind its back, or a folder another
    host of a shared database has and this one does not mount): InvokeAI's web UI keeps them out of its pickers."""
    records = [record for record in services.models.records.list() if not Path(record.path).exists()]
    return ModelsList(models=configs(records))


@router.get("/i/{key}", operation_id="get_model_record", responses=NOT_FOUND)
def get_model(key: str, services: AppServices) -> ModelConfig:
    return model_config(services.models.records.get(key))


@router.patch(
    "/i/{key}",
    operation_id="update_model_record",
    responses={**NOT_FOUND, **NAME_TAKEN, 422: {"description": "A field is invalid, or differs from the files'."}},
)
def update_model(key: str, changes: ModelRecordChanges, services: AppServices) -> ModelConfig:
    """Rename or describe a model, or set its trigger phrases or default settings; fields left out keep their value.
    base, type, format, variant and prediction_type are what the files say: given, they must be the same."""
    current = model_config(services.models.records.get(key))
    mismatches = changes.mismatches(current)
    if mismatches:
        raise ProbedFieldMismatchError(mismatches)
    return model_config(services.models.records.update(key, changes.stored()))


@router.delete("/i/{key}", operation_id="delete_model", status_code=status.HTTP_204_NO_CONTENT, responses=NOT_FOUND)
def delete_model(key: str, services: AppServices) -> None:
    """Delete the record, and the files of a model that was copied under models_dir (not of one installed in place)."""
    services.installer.delete(key)


@router.post(
    "/install",
    operation_id="install_model",
    status_code=status.HTTP_201_CREATED,
    responses={
        404: {"description": "The source path does not exist."},
        409: NAME_TAKEN[409],
        415: {"description": "The source is not a model this server can use; `detail` says why."},
        422: {
            "description": "The source is not an absolute path (URLs and repo ids are not installed yet), or the "
            "body gives a bad field or one that differs from the files'."
        },
        429: {"description": f"Too many installs are waiting or running (at most {MAX_JOBS})."},
    },
)
def install_model(
    services: AppServices,
    source: Annotated[
        str,
        Query(
            description="Absolute path, on the server, of a diffusers pipeline folder or a single file (.safetensors "
            "or .gguf) of a family the server runs (GET /api/v1/app/families; the formats each takes: "
            "docs/families.md). URLs and Hugging Face repo ids are not installed yet.",
            min_length=1,
            max_length=4096,
        ),
    ],
    inplace: Annotated[
        bool,
        Query(
            description="Record the model where it is instead of copying it under models_dir; deleting the model "
            "then leaves its files alone."
        ),
    ] = False,
    access_token: Annotated[
        str | None, Query(description="For remote sources (not installed yet); unused for a path.", max_length=4096)
    ] = None,
    config: Annotated[
        ModelRecordChanges | None,
        Body(description="Record fields to set: name (default: the folder's or file's name), description ..."),
    ] = None,
) -> ModelInstallJob:
    """Check and probe the source, then install it in the background: copied under models_dir/<family>/ (or recorded
    in place), hashed (hash_models) and recorded. Answers at once with the job (waiting); GET install/{id} follows
    it, and model_install_* events report it on every queue's event stream. What cannot be installed is refused
    here, before any job; a failed or cancelled job leaves no record and no files."""
    return services.installer.submit(source, inplace=inplace, config=config)


@router.get("/install", operation_id="list_model_installs")
def list_model_installs(services: AppServices) -> list[ModelInstallJob]:
    """This server's install jobs since it started, oldest first: the unfinished ones and the latest finished ones."""
    return services.installer.list_jobs()


@router.get("/install/{id}", operation_id="get_model_install_job", responses={404: {"description": "No such job."}})
def get_model_install_job(id: int, services: AppServices) -> ModelInstallJob:
    try:
        return services.installer.get_job(id)
    except InstallJobNotFoundError as error:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(error.args[0])) from None


@router.delete(
    "/install/{id}",
    operation_id="cancel_model_install_job",
    status_code=status.HTTP_201_CREATED,
    responses={
        201: {"description": "The job is cancelled (at once if waiting, at its next chunk if running)."},
        415: {"description": "No such job (InvokeAI's status for it)."},
    },
)
def cancel_model_install_job(id: int, services: AppServices) -> None:
    """Cancel a waiting or running install; a finished job is left as it is."""
    try:
        services.installer.cancel_job(id)
    except InstallJobNotFoundError as error:
        raise HTTPException(status.HTTP_415_UNSUPPORTED_MEDIA_TYPE, str(error.args[0])) from None
