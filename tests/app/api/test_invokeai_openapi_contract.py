"""Every operation InvokeAI's clients call (invokeai_contract.py's list) is in this server's OpenAPI document as
InvokeAI 6.14.2's is: the path and method, one of its success statuses, its required query parameters, its JSON
body's type and required fields, and its success response's required fields. This server may add fields and
operations; what still differs is listed below, with why, and in docs/api.md."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from invokeai_contract import CONTRACT, REFERENCE, all_fields, derive, json_schema, operations, top_type

from invokeai.app.api.app_factory import create_app
from invokeai.app.config import InvokeAIAppConfig

CONTRACT_DATA: dict[str, dict[str, Any]] = json.loads(CONTRACT.read_text(encoding="utf-8"))

# Operation -> why this server differs from InvokeAI there. Each must still differ (the test says when one no
# longer does), and docs/api.md names each.
KNOWN_DIFFERENCES: dict[str, str] = {}


@pytest.fixture(scope="module")
def ours() -> dict[str, Any]:
    config = InvokeAIAppConfig.located({"use_memory_db": True}, REFERENCE.parent, None)
    return create_app(config, run_processor=False).openapi()


def _normal(path: str) -> str:
    return re.sub(r"\{[^}]*\}", "{}", path)


def _problems(ours: dict[str, Any], key: str, want: dict[str, Any]) -> list[str]:
    method, path = key.split(" ", 1)
    found = {
        (m.upper(), _normal(p)): op
        for p, item in ours["paths"].items()
        for m, op in item.items()
        if isinstance(op, dict)
    }
    op = found.get((method, _normal(path)))
    if op is None:
        return ["no such operation"]
    problems = []
    codes = sorted(code for code in op.get("responses") or {} if code.startswith("2"))
    if want["success"] and not set(codes) & set(want["success"]):
        problems.append(f"documents {codes}, InvokeAI {want['success']}")
    params = {p["name"] for p in op.get("parameters") or [] if p.get("in") == "query"}
    if lacking := [name for name in want["required_query"] if name not in params]:
        problems.append(f"lacks query parameters {lacking}")
    if want["body_type"] is not None:
        body = json_schema((op.get("requestBody") or {}).get("content"))
        if body is None:
            problems.append("takes no JSON body")
        else:
            if top_type(ours, body) != want["body_type"]:
                problems.append(f"body is {top_type(ours, body)}, InvokeAI's {want['body_type']}")
            if missing := sorted(set(want["body_required"]) - all_fields(ours, body)):
                problems.append(f"body lacks {missing}")
    if want["response_required"]:
        code = next((c for c in want["success"] if c in codes), codes[0] if codes else None)
        response = json_schema(((op.get("responses") or {}).get(code) or {}).get("content")) if code else None
        have = all_fields(ours, response) if response is not None else set()
        if missing := sorted(set(want["response_required"]) - have):
            problems.append(f"{code} response lacks {missing}")
    return problems


def test_the_contract_covers_the_listed_operations() -> None:
    assert sorted(CONTRACT_DATA) == sorted(f"{m} {p}" for m, p in operations())


@pytest.mark.skipif(not REFERENCE.is_file(), reason=f"InvokeAI's document is not beside the checkout ({REFERENCE})")
def test_the_contract_is_what_the_reference_document_says() -> None:
    assert derive(json.loads(REFERENCE.read_text(encoding="utf-8"))) == CONTRACT_DATA, (
        "invokeai_contract.json is stale: python tests/app/api/invokeai_contract.py"
    )


@pytest.mark.parametrize("key", sorted(CONTRACT_DATA))
def test_operation_matches_invokeai(ours: dict[str, Any], key: str) -> None:
    problems = _problems(ours, key, CONTRACT_DATA[key])
    if key in KNOWN_DIFFERENCES:
        assert problems, f"{key} now matches InvokeAI: drop it from KNOWN_DIFFERENCES (and docs/api.md)"
    else:
        assert not problems, "; ".join(problems)
