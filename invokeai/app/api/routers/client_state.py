"""/api/v1/client_state/{queue_id}, as InvokeAI 6.14.2 shapes it: the string values InvokeAI's web UI keeps its
settings in, by key. As in InvokeAI the queue id is not part of the key (it is kept in the path for its clients)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query

from invokeai.app.api.dependencies import AppServices
from invokeai.app.api.json_body import ApiRoute
from invokeai.app.services.client_state import MAX_KEY_LENGTH, MAX_KEYS, MAX_VALUE_LENGTH
from invokeai.app.services.queue_models import ID_PATTERN

router = APIRouter(prefix="/client_state/{queue_id}", tags=["client_state"], route_class=ApiRoute)

QueueId = Annotated[str, Path(pattern=ID_PATTERN, description="A queue id (not part of the key, as in InvokeAI).")]
Key = Annotated[str, Query(min_length=1, max_length=MAX_KEY_LENGTH, description="The key.")]


@router.get("/get_by_key", operation_id="get_client_state_by_key")
def get_client_state_by_key(queue_id: QueueId, key: Key, services: AppServices) -> str | None:
    """The value stored under the key, or null."""
    return services.client_state.get(key)


@router.post(
    "/set_by_key",
    operation_id="set_client_state",
    responses={
        409: {"description": f"The key is new and {MAX_KEYS} keys are stored, the most kept."},
        413: {"description": f"The value is longer than {MAX_VALUE_LENGTH} characters."},
    },
)
def set_client_state(
    queue_id: QueueId,
    key: Key,
    value: Annotated[str, Body(description="The value: a JSON string (InvokeAI's UI stores JSON text in it).")],
    services: AppServices,
) -> str:
    """Store the value under the key (replacing any); the answer is the value."""
    return services.client_state.set(key, value)


@router.get("/get_keys_by_prefix", operation_id="get_client_state_keys_by_prefix")
def get_client_state_keys_by_prefix(
    queue_id: QueueId,
    prefix: Annotated[str, Query(max_length=MAX_KEY_LENGTH, description="The keys' beginning.")],
    services: AppServices,
) -> list[str]:
    """The keys that start with the prefix, most recently set first."""
    return services.client_state.keys_by_prefix(prefix)


@router.post("/delete_by_key", operation_id="delete_client_state_by_key")
def delete_client_state_by_key(queue_id: QueueId, key: Key, services: AppServices) -> None:
    """Forget the key (a key that is not stored is no error)."""
    services.client_state.delete(key)


@router.post("/delete", operation_id="delete_client_state")
def delete_client_state(queue_id: QueueId, services: AppServices) -> None:
    """Forget every key."""
    services.client_state.delete_all()
