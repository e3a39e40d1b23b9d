"""/api/v1/auth: what InvokeAI's web UI asks before anything else (whether to show a sign-up or login page). This
server has one user and no accounts: there is nothing to set up and no login; api_token, when set, is the only
credential, and this route needs it like every other."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from invokeai.app.api.json_body import ApiRoute

router = APIRouter(prefix="/auth", tags=["authentication"], route_class=ApiRoute)


class SetupStatusResponse(BaseModel):
    setup_required: bool = Field(description="Whether an administrator must be set up first: never, here.")
    multiuser_enabled: bool = Field(description="Whether users sign in: never, here (one user, an optional token).")
    strict_password_checking: bool = Field(description="Whether passwords are checked for strength: no passwords.")
    admin_email: str | None = Field(default=None, description="The first administrator's email: none.")


@router.get("/status", operation_id="get_setup_status")
def get_setup_status() -> SetupStatusResponse:
    return SetupStatusResponse(setup_required=False, multiuser_enabled=False, strict_password_checking=False)
