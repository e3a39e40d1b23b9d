"""The FastAPI app: every resource's router under /api/v1 (models under /api/v2), Socket.IO at /ws/socket.io, the
web UI at / for every other path, the services started and stopped with it; in front of them all, the refusals of
request_guard.py and the headers of security_headers.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Depends, FastAPI
from starlette.middleware.cors import CORSMiddleware

from invokeai.app.api.auth import BEARER, TokenMiddleware
from invokeai.app.api.docs_page import serve_docs
from invokeai.app.api.errors import add_body_errors, install_error_handlers
from invokeai.app.api.request_guard import AllowedHosts, AllowedOrigins, RequestGuard, origin_text
from invokeai.app.api.routers import app as app_router
from invokeai.app.api.routers import auth as auth_router
from invokeai.app.api.routers import board_images as board_images_router
from invokeai.app.api.routers import boards as boards_router
from invokeai.app.api.routers import client_state as client_state_router
from invokeai.app.api.routers import events as events_router
from invokeai.app.api.routers import gallery as gallery_router
from invokeai.app.api.routers import images as images_router
from invokeai.app.api.routers import left_out as left_out_router
from invokeai.app.api.routers import models as models_router
from invokeai.app.api.routers import queue as queue_router
from invokeai.app.api.routers import workflows as workflows_router
from invokeai.app.api.security_headers import BUILTIN_UI_POLICY, INVOKEAI_UI_POLICY, SecurityHeaders
from invokeai.app.api.sockets import mount_socketio
from invokeai.app.api.web_ui import WEB_UI_DIR, serve_web_ui
from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.services.container import MEGABYTE, build_services
from invokeai.app.services.events import EventBus
from invokeai.app.version import app_version

API_PREFIX = "/api/v1"
# Models are under v2, as in InvokeAI, whose clients look for them there.
API_V2_PREFIX = "/api/v2"
UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: {"description": "The server's api_token setting is set, and the request lacks 'Authorization: Bearer <it>'."}
}
# Room for the multipart framing around an upload of the largest allowed size.
MULTIPART_OVERHEAD = 1 * MEGABYTE


def create_app(
    config: InvokeAIAppConfig, *, run_processor: bool = True, demo_models: bool = False, warm_up: bool = False
) -> FastAPI:
    """The app; it opens the database and starts the processor only when it starts (its lifespan), so building
    it touches nothing on disk. run_processor=False: items are queued but never run (for API fuzzing).
    demo_models: at start, before serving, install the demo models if the install_demo_models setting asks and no
    model is installed (invokeai-web passes True; tests that do not exercise it are spared the seconds it takes).
    warm_up: at start, import what the models of the last completed items load with, and load them in the
    background once serving (services/warm_up.py; invokeai-web passes True)."""
    # The bus exists before the services so that the shutdown signal can end the event streams (see serve()).
    events = EventBus()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        services = build_services(config, events)
        # In a thread: building the demo models takes seconds, and the event loop must stay free meanwhile.
        await asyncio.to_thread(
            services.start,
            run_processor=run_processor,
            demo_models=demo_models and config.install_demo_models,
            warm_up=warm_up and run_processor,
        )
        app.state.services = services
        sockets.start(events)
        try:
            yield
        finally:
            await sockets.stop()
            events.close()
            # Joining the worker blocks; keep the event loop free meanwhile.
            await asyncio.to_thread(services.stop)

    # Every request body is bounded (HTTP 413 while it arrives): nothing legitimate is larger than an upload.
    max_body_size = config.max_upload_mb * MEGABYTE + MULTIPART_OVERHEAD
    # /docs is served by docs_page.py (offline); FastAPI's own would load Swagger UI from a CDN.
    app = FastAPI(
        title="InvokeAI",
        version=app_version(),
        lifespan=lifespan,
        max_body_size=max_body_size,
        docs_url=None,
        redoc_url=None,
        swagger_ui_oauth2_redirect_url=None,
    )
    app.state.config = config
    app.state.events = events
    origins = AllowedOrigins(config.allowed_origins)
    # The last added runs first: the headers go on every answer, refusals included; a refused request reaches
    # neither CORS nor the token check.
    app.add_middleware(TokenMiddleware, token=config.api_token)
    if origins.listed:
        # The listed origins' pages may also read the answers and send JSON (a CORS preflight first).
        app.add_middleware(
            CORSMiddleware,
            allow_origins=sorted(origin_text(origin) for origin in origins.listed),
            allow_methods=["*"],
            allow_headers=["*"],
        )
    app.add_middleware(RequestGuard, hosts=AllowedHosts(config.host, config.allowed_hosts), origins=origins)
    app.add_middleware(SecurityHeaders)
    install_error_handlers(app)
    for router in (
        app_router.router,
        auth_router.router,
        queue_router.router,
        events_router.router,
        images_router.router,
        boards_router.router,
        board_images_router.router,
        client_state_router.router,
        workflows_router.router,
        gallery_router.router,
        left_out_router.router,
    ):
        app.include_router(router, prefix=API_PREFIX, dependencies=[Depends(BEARER)], responses=UNAUTHORIZED)
    app.include_router(
        models_router.router, prefix=API_V2_PREFIX, dependencies=[Depends(BEARER)], responses=UNAUTHORIZED
    )
    amend_openapi(app, events_router.describe_stream_items, add_body_errors)
    # InvokeAI's events over Socket.IO, from the same bus as the event stream (sockets.py).
    sockets = mount_socketio(app, config.api_token, origins)
    app.state.sockets = sockets
    serve_docs(app)
    other_ui = config.web_ui_dir
    serve_web_ui(app, other_ui or WEB_UI_DIR, INVOKEAI_UI_POLICY if other_ui else BUILTIN_UI_POLICY)
    return app


def amend_openapi(app: FastAPI, *amendments: Callable[[dict[str, Any]], None]) -> None:
    """Make `app.openapi()` apply `amendments`, in order, to the document FastAPI generates. FastAPI builds the
    document once and caches it; the amendments apply to that first build only."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        first = app.openapi_schema is None
        document = generate()
        if first:
            for amend in amendments:
                amend(document)
        return document

    app.openapi = openapi  # type: ignore[method-assign]
