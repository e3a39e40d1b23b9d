"""Schemathesis against the app: requests generated from the OpenAPI document never get a 5xx answer.

Bounded (a few examples per operation, derandomized, no deadline) so that the run takes well under two minutes.
The processor is not started: generated graphs are queued but never run (running them tests the nodes, which
have their own tests, and could take long).
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    allow_header_conformance,
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from invokeai.app.api.app_factory import create_app
from invokeai.app.config import InvokeAIAppConfig

EXAMPLES_PER_OPERATION = 25

# Loaded when the module is imported (schemathesis makes one test per operation from it), so the app is built
# here; the fixture below starts its services for the duration of the tests.
ROOT = Path(tempfile.mkdtemp(prefix="invokeai-fuzz-"))
# schemathesis's ASGI client names the host "testserver": listed, so that its requests reach the routes.
APP = create_app(
    InvokeAIAppConfig.located(
        {"use_memory_db": True, "max_queue_size": 50, "allowed_hosts": ["testserver"]}, ROOT, None
    ),
    run_processor=False,
)
# The event stream never ends on its own; it has its own tests over a real socket.
schema = schemathesis.openapi.from_asgi("/openapi.json", APP).exclude(operation_id="queue_events")


@pytest.fixture(scope="module", autouse=True)
def started_services() -> Iterator[None]:
    # POST /api/v1/app/logging sets the process's log level: the tests after these get back the one they had.
    level = logging.getLogger().level
    try:
        with TestClient(APP):
            yield
    finally:
        logging.getLogger().setLevel(level)
        shutil.rmtree(ROOT, ignore_errors=True)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES_PER_OPERATION,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_generated_request_gets_a_server_error(case: schemathesis.Case) -> None:
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            response_schema_conformance,
            content_type_conformance,
            unsupported_method,
            allow_header_conformance,
        ]
    )
