"""What route handlers receive through FastAPI's dependency injection."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.services.container import Services


def get_config(request: Request) -> InvokeAIAppConfig:
    config: InvokeAIAppConfig = request.app.state.config
    return config


Config = Annotated[InvokeAIAppConfig, Depends(get_config)]


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


AppServices = Annotated[Services, Depends(get_services)]
