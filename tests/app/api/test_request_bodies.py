"""Request bodies: numbers and strings that JSON can carry but the server cannot are 422s naming the place, bodies
that are not JSON text are 400s, every error body is encodable, and the token is checked before any of it.

Bodies are sent as raw bytes: json.dumps would refuse some of them or write them differently.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from api_support import QUEUE, MakeClient, graph_json, node, wait_finished
from fastapi.testclient import TestClient

from invokeai.app.api.openapi import openapi_document

ENQUEUE = f"{QUEUE}/enqueue_batch"
JSON = {"Content-Type": "application/json"}
NODE_LOC = ["body", "batch", "graph", "nodes", "n", "value"]
DOCUMENT = openapi_document()


def strict_json(payload: bytes) -> Any:
    """The answer's JSON, read as strictly as a client in another language would: UTF-8, finite numbers."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"the answer holds {constant}")

    value = json.loads(payload.decode("utf-8"), parse_constant=refuse)
    json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8")  # no lone surrogate either
    return value


def body(node_json: bytes, graph_id: bytes = b'"g"', key: bytes = b'"n"', extra: bytes = b"") -> bytes:
    return (
        b'{"batch":{"graph":{"id":'
        + graph_id
        + b',"nodes":{'
        + key
        + b":"
        + node_json
        + b'},"edges":[]},"runs":1'
        + extra
        + b"}}"
    )


def post(client: TestClient, payload: bytes, path: str = ENQUEUE, method: str = "POST", **headers: str) -> Any:
    return client.request(method, path, content=payload, headers={**JSON, **headers})


def locs(response: Any) -> list[list[str | int]]:
    return [error["loc"] for error in strict_json(response.content)["detail"]]


def assert_nothing_enqueued(client: TestClient) -> None:
    page = client.get(f"{QUEUE}/list")
    assert page.status_code == 200 and page.json()["total"] == 0


@pytest.fixture
def idle(make_client: MakeClient) -> TestClient:
    return make_client(run_processor=False)


NON_FINITE = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1E400"]


@pytest.mark.parametrize("node_type", ["float", "integer", "string", "boolean"])
@pytest.mark.parametrize("number", NON_FINITE, ids=[n.decode() for n in NON_FINITE])
def test_a_non_finite_number_in_a_node_field_is_a_422_naming_it(
    idle: TestClient, node_type: str, number: bytes
) -> None:
    response = post(idle, body(b'{"id":"n","type":"' + node_type.encode() + b'","value":' + number + b"}"))
    assert response.status_code == 422, response.text
    [error] = strict_json(response.content)["detail"]
    assert error["loc"] == NODE_LOC
    assert error["type"] == "finite_number" and error["input"] == number.decode()
    assert_nothing_enqueued(idle)


def test_every_non_finite_number_of_a_body_is_named(idle: TestClient) -> None:
    payload = (
        b'{"batch":{"graph":{"id":"g","nodes":{"n":{"id":"n","type":"float","value":NaN}},"edges":[]},'
        b'"data":[[{"node_path":"n","field_name":"value","items":[1.5,Infinity,[{"deep":-Infinity}]]}]],"runs":1}}'
    )
    response = post(idle, payload)
    assert response.status_code == 422
    assert locs(response) == [
        NODE_LOC,
        ["body", "batch", "data", 0, 0, "items", 1],
        ["body", "batch", "data", 0, 0, "items", 2, 0, "deep"],
    ]
    assert_nothing_enqueued(idle)


@pytest.mark.parametrize("text", ["NaN", "nan", "inf", "-Infinity", "1e999"])
def test_a_non_finite_number_written_as_a_string_is_refused_by_a_float_field(idle: TestClient, text: str) -> None:
    # pydantic reads such strings into floats unless told not to; JSON could not carry the result back.
    response = idle.post(ENQUEUE, json={"batch": {"graph": graph_json(node("n", "float", value=text))}})
    assert response.status_code == 422, response.text
    # pydantic's loc names the union member too: [..., "nodes", "n", "float", "value"].
    assert locs(response) == [[*NODE_LOC[:-1], "float", "value"]]
    data = {"node_path": "n", "field_name": "value", "items": [text]}
    response = idle.post(
        ENQUEUE, json={"batch": {"graph": graph_json(node("n", "float", value=1.0)), "data": [[data]]}}
    )
    assert response.status_code == 422, response.text
    assert locs(response) == [["body", "batch", "data", 0, 0, "items", 0]]
    assert_nothing_enqueued(idle)


def test_large_finite_numbers_are_accepted(idle: TestClient) -> None:
    response = post(idle, body(b'{"id":"n","type":"float","value":1.7976931348623157e308}'))
    assert response.status_code == 200, response.text
    item = idle.get(f"{QUEUE}/i/{response.json()['item_ids'][0]}").json()
    assert item["session"]["graph"]["nodes"]["n"]["value"] == 1.7976931348623157e308


SURROGATES = {
    "string value": body(b'{"id":"n","type":"string","value":"a\\ud800b"}'),
    "low surrogate": body(b'{"id":"n","type":"string","value":"\\udfff"}'),
    "node id": body(b'{"id":"\\ud800","type":"string","value":"x"}', key=b'"\\ud800"'),
    "node key only": body(b'{"id":"n","type":"string","value":"x"}', key=b'"\\udc00"'),
    "graph id": body(b'{"id":"n","type":"string","value":"x"}', graph_id=b'"\\ud800"'),
    "prompt": body(b'{"id":"n","type":"sd_text_encoder","model":{"name":"m"},"prompt":"a cat \\ud83d"}'),
    "batch id": body(b'{"id":"n","type":"string","value":"x"}', extra=b',"batch_id":"\\ud800"'),
    "datum value": body(
        b'{"id":"n","type":"string","value":"x"}',
        extra=b',"data":[[{"node_path":"n","field_name":"value","items":["\\ud800"]}]]',
    ),
    "unknown field": body(b'{"id":"n","type":"string","value":"x","\\ud800":1}'),
}


@pytest.mark.parametrize("payload", SURROGATES.values(), ids=SURROGATES.keys())
def test_a_lone_surrogate_anywhere_is_a_422_with_an_encodable_body(idle: TestClient, payload: bytes) -> None:
    response = post(idle, payload)
    assert response.status_code == 422, response.text
    errors = strict_json(response.content)["detail"]
    assert errors and all(error["type"] == "string_unicode" for error in errors)
    assert all("\\ud" in error["input"] for error in errors)  # spelled out, not dropped
    assert_nothing_enqueued(idle)


def test_escaped_surrogate_pairs_are_characters_and_are_kept(idle: TestClient) -> None:
    response = post(idle, body(b'{"id":"n","type":"string","value":"cat \\ud83d\\ude00 \\u00e9"}'))
    assert response.status_code == 200, response.text
    item = idle.get(f"{QUEUE}/i/{response.json()['item_ids'][0]}").json()
    assert item["session"]["graph"]["nodes"]["n"]["value"] == "cat \U0001f600 \u00e9"


NOT_JSON_TEXT = {
    "invalid UTF-8": b'{"batch": "\xff"}',
    "UTF-8 encoded surrogate": b'{"batch": "\xed\xa0\x80"}',
    "nested too deeply": b"[" * 5000 + b"]" * 5000,
    "integer of 5000 digits": b'{"batch": {"runs": ' + b"9" * 5000 + b"}}",
}


def json_operations() -> list[tuple[str, str]]:
    """(method, path) of every operation whose body is JSON, with path parameters filled in."""
    operations = []
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                operations.append((method.upper(), path.replace("{queue_id}", "default").replace("{key}", "k")))
    return operations


def documented(method: str, path: str) -> set[str]:
    for template, item in DOCUMENT["paths"].items():
        if template.replace("{queue_id}", "default").replace("{key}", "k") == path:
            return set(item[method.lower()]["responses"])
    raise AssertionError(f"{method} {path} is not in the document")


@pytest.mark.parametrize(("method", "path"), json_operations())
@pytest.mark.parametrize("payload", NOT_JSON_TEXT.values(), ids=NOT_JSON_TEXT.keys())
def test_a_body_that_is_not_json_text_is_a_documented_400(
    idle: TestClient, method: str, path: str, payload: bytes
) -> None:
    response = post(idle, payload, path, method)
    assert response.status_code == 400, response.text
    detail = strict_json(response.content)["detail"]
    assert isinstance(detail, str) and "error parsing the body" not in detail  # says what is wrong
    assert "400" in documented(method, path)


def test_the_json_operations_are_the_ones_expected() -> None:
    # The parametrized tests below cover every JSON body; this keeps the list from silently shrinking.
    assert {path for _, path in json_operations()} >= {
        f"{QUEUE}/enqueue_batch",
        f"{QUEUE}/cancel_by_batch_ids",
        "/api/v2/models/i/k",
        "/api/v2/models/install",
    }


@pytest.mark.parametrize(("method", "path"), json_operations())
def test_every_json_route_decodes_its_body_strictly(idle: TestClient, method: str, path: str) -> None:
    # Every router must use ApiRoute; a route that does not would answer this with a 500 or store a null.
    for payload, loc in ((b'{"x": [1, NaN]}', ["body", "x", 1]), (b'{"\\ud800": 1}', ["body"])):
        response = post(idle, payload, path, method)
        assert response.status_code == 422, response.text
        assert locs(response) == [loc]
        assert "422" in documented(method, path)


def test_a_malformed_body_is_still_fastapis_json_invalid(idle: TestClient) -> None:
    response = post(idle, b"{not json")
    assert response.status_code == 422
    [error] = strict_json(response.content)["detail"]
    assert error["type"] == "json_invalid" and error["loc"] == ["body", 1]


def test_after_refused_bodies_the_queue_runs_and_answers(client: TestClient) -> None:
    for payload in (*SURROGATES.values(), body(b'{"id":"n","type":"float","value":NaN}')):
        assert post(client, payload).status_code == 422
    response = client.post(ENQUEUE, json={"batch": {"graph": graph_json(node("n", "float", value=2.5))}})
    item = wait_finished(client, response.json()["item_ids"][0])
    assert item["status"] == "completed" and item["session"]["results"]["n"]["value"] == 2.5
    assert client.get(f"{QUEUE}/list").status_code == 200
    assert client.get(f"{QUEUE}/status").status_code == 200


@pytest.mark.parametrize(
    "content",
    [
        {"detail": [{"loc": ["body", "\ud800"], "input": math.nan}]},
        {"detail": ["\udfff", math.inf, -math.inf, {"k\ud800": (1, math.nan)}]},
    ],
)
def test_an_error_body_is_sent_even_when_it_holds_what_json_cannot_carry(content: dict[str, Any]) -> None:
    # The decoder keeps such values out of error answers; this is the net under it.
    from invokeai.app.api.errors import ErrorResponse

    rendered = strict_json(ErrorResponse(content, status_code=422).body)
    assert "\\ud800" in json.dumps(rendered) or "\\udfff" in json.dumps(rendered)
    assert "nan" in json.dumps(rendered)


# -- the token comes first ------------------------------------------------------------------------------------

TOKEN = "body-token"


@pytest.fixture
def guarded(make_client: MakeClient) -> TestClient:
    return make_client(api_token=TOKEN, run_processor=False)


@pytest.mark.parametrize(
    "payload",
    [b"{not json", b'{"batch": NaN}', b'{"batch": "\xff"}', b"[" * 5000, body(b'{"id":"\\ud800"}')],
    ids=["malformed", "nan", "not-utf8", "too-deep", "surrogate"],
)
@pytest.mark.parametrize("header", [None, "Bearer wrong"], ids=["no-token", "wrong-token"])
def test_a_bad_body_without_the_token_is_a_401(guarded: TestClient, payload: bytes, header: str | None) -> None:
    headers = {"Authorization": header} if header else {}
    response = post(guarded, payload, **headers)
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == "Bearer"


def test_with_the_token_a_bad_body_is_judged(guarded: TestClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert post(guarded, b"{not json", **auth).status_code == 422
    assert post(guarded, b'{"batch": "\xff"}', **auth).status_code == 400


@pytest.mark.parametrize("path", ["/api/v1/no-such-route", "/api/v2/models/i/k/nothing"])
def test_without_the_token_an_unknown_api_path_is_a_401_too(guarded: TestClient, path: str) -> None:
    # Nothing about the API's shape is answered to a client without the token.
    assert guarded.get(path).status_code == 401


def test_the_document_stays_open_with_a_token(guarded: TestClient) -> None:
    assert guarded.get("/openapi.json").status_code == 200
