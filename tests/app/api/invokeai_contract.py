"""InvokeAI 6.14.2's REST contract for the operations its clients call, taken from its OpenAPI document
(../shared/reference/invokeai-6.14.2-openapi.json beside the checkout) and kept, reduced to what the conformance
test compares, in invokeai_contract.json: a run without the reference beside the checkout still checks.

    python tests/app/api/invokeai_contract.py [reference.json]   # rewrites invokeai_contract.json

Per operation: its success statuses, its required query parameters, its JSON body's top-level type and required
fields, and the required fields of its success response ($refs resolved, top level only)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CONTRACT = HERE / "invokeai_contract.json"
REFERENCE = HERE.parents[3] / "shared" / "reference" / "invokeai-6.14.2-openapi.json"

# The operations the issue lists (InvokeAI's clients call them), and what its web UI calls at start and to generate.
OPERATIONS = """
GET /api/v1/app/version                GET /api/v1/app/runtime_config        GET /api/v1/app/app_deps
GET /api/v1/app/invocation_cache/status DELETE /api/v1/app/invocation_cache  PUT /api/v1/app/invocation_cache/enable
PUT /api/v1/app/invocation_cache/disable GET /api/v1/app/logging             POST /api/v1/app/logging
GET /api/v1/app/patchmatch_status      GET /api/v1/auth/status               GET /api/v1/app/generation_device_options
GET /api/v1/gallery/item_names         GET /api/v1/style_presets/            GET /api/v1/system_prompts/
GET /api/v1/videos/                    POST /api/v1/model_relationships/batch
POST /api/v1/queue/{queue_id}/enqueue_batch       GET /api/v1/queue/{queue_id}/list_all
GET /api/v1/queue/{queue_id}/item_ids             POST /api/v1/queue/{queue_id}/items_by_ids
GET /api/v1/queue/{queue_id}/current              GET /api/v1/queue/{queue_id}/next
GET /api/v1/queue/{queue_id}/b/{batch_id}/status  PUT /api/v1/queue/{queue_id}/cancel_by_destination
GET /api/v1/queue/{queue_id}/counts_by_destination PUT /api/v1/queue/{queue_id}/cancel_all_except_current
PUT /api/v1/queue/{queue_id}/retry_items_by_id    GET /api/v1/queue/{queue_id}/status
GET /api/v1/queue/{queue_id}/i/{item_id}
GET /api/v1/images/                    POST /api/v1/images/upload            GET /api/v1/images/i/{image_name}
PATCH /api/v1/images/i/{image_name}    DELETE /api/v1/images/i/{image_name}  GET /api/v1/images/i/{image_name}/full
GET /api/v1/images/i/{image_name}/thumbnail  GET /api/v1/images/i/{image_name}/metadata
GET /api/v1/images/i/{image_name}/urls       GET /api/v1/images/i/{image_name}/workflow
GET /api/v1/images/names               POST /api/v1/images/images_by_names   POST /api/v1/images/star
POST /api/v1/images/unstar             POST /api/v1/images/delete            GET /api/v1/images/intermediates
DELETE /api/v1/images/intermediates
POST /api/v1/boards/                   GET /api/v1/boards/                   GET /api/v1/boards/{board_id}
PATCH /api/v1/boards/{board_id}        DELETE /api/v1/boards/{board_id}      GET /api/v1/boards/{board_id}/image_names
POST /api/v1/board_images/             DELETE /api/v1/board_images/          POST /api/v1/board_images/batch
POST /api/v1/board_images/batch/delete
GET /api/v1/client_state/{queue_id}/get_by_key    POST /api/v1/client_state/{queue_id}/set_by_key
POST /api/v1/client_state/{queue_id}/delete_by_key
POST /api/v1/workflows/                GET /api/v1/workflows/                GET /api/v1/workflows/i/{workflow_id}
PATCH /api/v1/workflows/i/{workflow_id} DELETE /api/v1/workflows/i/{workflow_id}
GET /api/v1/workflows/counts_by_category
GET /api/v2/models/                    GET /api/v2/models/i/{key}            GET /api/v2/models/get_by_attrs
GET /api/v2/models/scan_folder         GET /api/v2/models/missing            POST /api/v2/models/install
GET /api/v2/models/install             GET /api/v2/models/install/{id}       DELETE /api/v2/models/install/{id}
"""


def operations() -> list[tuple[str, str]]:
    return [(m[1], m[2]) for m in re.finditer(r"\b(GET|POST|PUT|PATCH|DELETE) (\S+)", OPERATIONS)]


def resolve(doc: dict[str, Any], schema: Any) -> dict[str, Any]:
    for _ in range(32):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            break
        node: Any = doc
        for part in schema["$ref"].removeprefix("#/").split("/"):
            node = node.get(part, {})
        schema = node
    return schema if isinstance(schema, dict) else {}


def variants(doc: dict[str, Any], schema: Any, depth: int = 0) -> list[dict[str, Any]]:
    """The schemas a value may take: anyOf/oneOf flattened, null dropped, an array's items for the array."""
    s = resolve(doc, schema)
    if depth > 8:
        return []
    for key in ("anyOf", "oneOf"):
        if isinstance(s.get(key), list):
            return [v for sub in s[key] for v in variants(doc, sub, depth + 1)]
    if isinstance(s.get("allOf"), list) and len(s["allOf"]) == 1:
        return variants(doc, s["allOf"][0], depth + 1)
    if s.get("type") == "null":
        return []
    if s.get("type") == "array" and isinstance(s.get("items"), dict):
        return variants(doc, s["items"], depth + 1)
    return [s]


def required_fields(doc: dict[str, Any], schema: Any) -> list[str]:
    """The fields every variant of the schema requires."""
    sets = [set(v.get("required") or []) & set(v.get("properties") or {}) for v in variants(doc, schema)]
    sets = [s for s in sets if s] or [set()]
    return sorted(set.intersection(*sets))


def all_fields(doc: dict[str, Any], schema: Any) -> set[str]:
    return {p for v in variants(doc, schema) for p in v.get("properties") or {}}


def top_type(doc: dict[str, Any], schema: Any) -> str:
    s = resolve(doc, schema)
    kinds = {resolve(doc, v).get("type") for v in s.get("anyOf") or s.get("oneOf") or [s]} - {"null", None}
    return "/".join(sorted(kinds)) or "any"


def json_schema(content: Any) -> Any:
    if not isinstance(content, dict) or not content:
        return None
    media = content.get("application/json") or next(iter(content.values()))
    return media.get("schema") if isinstance(media, dict) else None


def success_codes(op: dict[str, Any]) -> list[str]:
    return sorted(code for code in op.get("responses") or {} if code.startswith("2"))


def describe(doc: dict[str, Any], op: dict[str, Any]) -> dict[str, Any]:
    """What the conformance test compares of one operation."""
    body = op.get("requestBody") or {}
    media = sorted(body.get("content") or {})
    body_schema = json_schema(body.get("content")) if media and media[0] != "multipart/form-data" else None
    codes = success_codes(op)
    response = json_schema(((op.get("responses") or {}).get(codes[0] if codes else "200") or {}).get("content"))
    return {
        "success": codes,
        "required_query": sorted(
            p["name"] for p in op.get("parameters") or [] if p.get("in") == "query" and p.get("required")
        ),
        "body_type": top_type(doc, body_schema) if body_schema is not None else None,
        "body_required": required_fields(doc, body_schema) if body_schema is not None else [],
        "response_required": required_fields(doc, response) if response is not None else [],
    }


def derive(reference: dict[str, Any]) -> dict[str, Any]:
    paths = reference["paths"]
    return {f"{method} {path}": describe(reference, paths[path][method.lower()]) for method, path in operations()}


if __name__ == "__main__":
    source = Path(sys.argv[1]) if len(sys.argv) > 1 else REFERENCE
    contract = derive(json.loads(source.read_text(encoding="utf-8")))
    CONTRACT.write_text(json.dumps(contract, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {CONTRACT} ({len(contract)} operations) from {source}")
