"""The FastAPI app: every resource's router under /api/v1, the settings on app.state."""

from __future__ import annotations

from fastapi import FastAPI

from invokeai.app.api.routers import app as app_router
from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.version import app_version

API_PREFIX = "/api/v1"


def create_app(config: InvokeAIAppConfig) -> FastAPI:
    app = FastAPI(title="InvokeAI", version=app_version())
    app.state.config = config
    app.include_router(app_router.router, prefix=API_PREFIX)
    return app
