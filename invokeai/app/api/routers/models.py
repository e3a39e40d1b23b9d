"""/api/v2/models: list, read, rename or describe, delete and install models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, ConfigDict, Field, field_validator

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.model_records import MODEL_NAME_PATTERN, ModelFamily, ModelRecord

router = APIRouter(prefix="/models", tags=["models"], route_class=ApiRoute)

NOT_FOUND = {404: {"description": "No model with that key."}}
NAME_TAKEN = {409: {"description": "Another model has that name (names are unique, case-insensitively)."}}


class ModelRecordList(BaseModel):
    models: list[ModelRecord]


class ModelInstallRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    source: str = Field(
        description="Absolute path, on the server, of a diffusers pipeline folder or a single file (.safetensors or "
        ".gguf) of a family the server runs (GET /api/v1/app/families; the formats each takes: docs/families.md)."
    )
    inplace: bool = Field(
        False,
        description="Record the model where it is instead of copying it under models_dir; deleting the model then "
        "leaves its files alone.",
    )
    name: str | None = Field(
        None,
        description="Unique name; default: the folder's name or the file's name without its suffix.",
        pattern=MODEL_NAME_PATTERN,
    )
    description: str | None = Field(None, max_length=2000)

    @field_validator("source")
    @classmethod
    def _absolute(cls, value: str) -> str:
        # A relative path would resolve against wherever the server happened to start.
        if not Path(value).expanduser().is_absolute():
            raise ValueError("source must be an absolute path on the server")
        return value


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class ModelRecordChanges(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Not nullable: a model always has a name, so `"name": null` is refused (422), as the schema says. The default
    # only marks the field as left out; it is not a value, so the schema does not show it.
    name: str = Field(
        None,
        description="A new unique name (the files are not renamed).",
        pattern=MODEL_NAME_PATTERN,
        json_schema_extra=_no_default,
    )
    description: str | None = Field(None, max_length=2000, description="A new description; null removes it.")


@router.get("/", operation_id="list_models")
def list_models(
    services: AppServices,
    family: Annotated[ModelFamily | None, Query(description="Only models of this family.")] = None,
    type: Annotated[str | None, Query(description="Only models of this type (main, transformer, vae ...).")] = None,
) -> ModelRecordList:
    """Installed models, by name."""
    return ModelRecordList(models=services.models.records.list(family=family, type=type))


@router.get("/i/{key}", operation_id="get_model_record", responses=NOT_FOUND)
def get_model(key: str, services: AppServices) -> ModelRecord:
    return services.models.records.get(key)


@router.patch("/i/{key}", operation_id="update_model_record", responses={**NOT_FOUND, **NAME_TAKEN})
def update_model(key: str, changes: ModelRecordChanges, services: AppServices) -> ModelRecord:
    """Rename or describe a model; fields left out of the body keep their value."""
    return services.models.records.update(key, changes.model_dump(exclude_unset=True))


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
    },
)
def install_model(request: ModelInstallRequest, services: AppServices) -> ModelRecord:
    """Probe the source, copy it under models_dir/<family>/ (or record it in place), hash it (hash_models), and
    record it. Progress goes out as model_install_* events on every queue's event stream. A refused or failed
    install leaves no record and no files."""
    return services.installer.install(
        Path(request.source), inplace=request.inplace, name=request.name, description=request.description
    )
