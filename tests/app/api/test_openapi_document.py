"""openapi.json: what `python -m invokeai.app.api.openapi` prints, committed, with every node, output and event."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from invokeai.app.api.openapi import openapi_document, render
from invokeai.app.nodes.base import invocation_classes, output_classes
from invokeai.app.services.events import EVENT_TYPES

REPO = Path(__file__).resolve().parents[3]


def test_committed_openapi_json_is_current() -> None:
    committed = REPO / "openapi.json"
    assert committed.exists(), "openapi.json is missing: run python -m invokeai.app.api.openapi > openapi.json"
    assert committed.read_text(encoding="utf-8") == render(), (
        "openapi.json is stale: run python -m invokeai.app.api.openapi > openapi.json"
    )


def test_the_module_prints_the_document(child_env: Callable[..., dict[str, str]]) -> None:
    # An INVOKEAI_* variable, even a bad one, does not change or stop the printing.
    result = subprocess.run(
        [sys.executable, "-m", "invokeai.app.api.openapi"],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(INVOKEAI_PORT="not-a-port"),
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == openapi_document()


def test_every_node_output_and_event_schema_is_in_the_document() -> None:
    schemas = openapi_document()["components"]["schemas"]
    for model in (*invocation_classes(), *output_classes(), *EVENT_TYPES):
        assert model.__name__ in schemas, model.__name__
    node_union = schemas["Graph"]["properties"]["nodes"]["additionalProperties"]
    assert set(node_union["discriminator"]["mapping"]) == {
        cls.model_fields["type"].default for cls in invocation_classes()
    }
    output_union = schemas["GraphExecutionState"]["properties"]["results"]["additionalProperties"]
    assert set(output_union["discriminator"]["mapping"]) == {
        cls.model_fields["type"].default for cls in output_classes()
    }
    blank = schemas["BlankImageInvocation"]["properties"]
    assert {"width", "height", "color"} <= set(blank)
    assert "image" in schemas["ImageOutput"]["properties"]


def test_the_event_stream_documents_its_payloads() -> None:
    stream = openapi_document()["paths"]["/api/v1/queue/{queue_id}/events"]["get"]["responses"]["200"]["content"]
    item = stream["text/event-stream"]["itemSchema"]
    assert item["properties"]["event"]["enum"] == [event.event_name for event in EVENT_TYPES]
    payload = item["properties"]["data"]["contentSchema"]
    assert {ref["$ref"].rsplit("/", 1)[1] for ref in payload["anyOf"]} == {e.__name__ for e in EVENT_TYPES}


def test_every_reference_in_the_document_resolves() -> None:
    document = openapi_document()
    references = re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(document))
    assert references
    assert set(references) <= set(document["components"]["schemas"])
