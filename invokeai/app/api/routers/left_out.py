"""What this server leaves out of InvokeAI's API (docs/api.md, "Against InvokeAI's API"), where InvokeAI's web UI
reads it at start: style presets, system prompts, videos and model relationships. Each read answers InvokeAI's
shape with nothing in it, which is the truth here, so the UI starts; nothing can be made or changed through them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field, StringConstraints

from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.pagination import OffsetPaginatedResults

router = APIRouter(route_class=ApiRoute)


# The shapes of what the lists would hold, as InvokeAI's, so that its clients' types read the (empty) answers.
class PresetData(BaseModel):
    positive_prompt: str
    negative_prompt: str


class StylePresetRecordWithImage(BaseModel):
    name: str
    preset_data: PresetData
    type: Literal["user", "default"]
    id: str
    user_id: str
    image: str | None


class SystemPromptRecordDTO(BaseModel):
    name: str
    content: str
    id: str
    user_id: str
    is_public: bool
    created_at: str
    updated_at: str


@router.get("/style_presets/", operation_id="list_style_presets", tags=["style_presets"])
def list_style_presets() -> list[StylePresetRecordWithImage]:
    """InvokeAI's style presets: this server has none."""
    return []


@router.get("/system_prompts/", operation_id="list_system_prompts", tags=["system_prompts"])
def list_system_prompts() -> list[SystemPromptRecordDTO]:
    """InvokeAI's system prompts (for its prompt expansion): this server has none."""
    return []


@router.get("/videos/", operation_id="list_videos", tags=["videos"])
def list_videos(
    offset: Annotated[int, Query(ge=0)] = 0, limit: Annotated[int, Query(ge=0, le=1000)] = 10
) -> OffsetPaginatedResults[dict[str, Any]]:
    """InvokeAI's videos: this server makes none. InvokeAI's filters are accepted and change nothing."""
    return OffsetPaginatedResults[dict[str, Any]](items=[], offset=offset, limit=limit, total=0)


class ModelRelationshipBatchRequest(BaseModel):
    model_keys: list[Annotated[str, StringConstraints(max_length=255)]] = Field(
        max_length=10_000, description="Models whose related models to list"
    )


@router.post("/model_relationships/batch", operation_id="get_related_models_batch", tags=["model_relationships"])
def get_related_models_batch(body: ModelRelationshipBatchRequest) -> list[str]:
    """InvokeAI's links between models (a LoRA made for a main model, ...): this server keeps none."""
    return []
