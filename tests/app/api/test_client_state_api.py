"""/api/v1/client_state/{queue_id} as InvokeAI 6.14.2 has it: a JSON string body stored and answered by key (the
queue id is not part of the key, as in InvokeAI), deletes, and the bounds on keys and values."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

STATE = "/api/v1/client_state/default"


def test_a_value_is_set_read_and_deleted_by_key(client: TestClient) -> None:
    value = json.dumps({"gallery": {"limit": 20}})
    assert client.get(f"{STATE}/get_by_key", params={"key": "gallery"}).json() is None
    response = client.post(f"{STATE}/set_by_key", params={"key": "gallery"}, json=value)
    assert (response.status_code, response.json()) == (200, value)
    assert client.get(f"{STATE}/get_by_key", params={"key": "gallery"}).json() == value
    # As InvokeAI keys it: by user and key, whatever the queue.
    assert client.get("/api/v1/client_state/other/get_by_key", params={"key": "gallery"}).json() == value
    client.post(f"{STATE}/set_by_key", params={"key": "gallery_2"}, json="2")
    assert client.get(f"{STATE}/get_keys_by_prefix", params={"prefix": "gallery"}).json() == ["gallery_2", "gallery"]
    assert client.post(f"{STATE}/delete_by_key", params={"key": "gallery"}).status_code == 200
    assert client.get(f"{STATE}/get_by_key", params={"key": "gallery"}).json() is None
    assert client.post(f"{STATE}/delete").status_code == 200
    assert client.get(f"{STATE}/get_by_key", params={"key": "gallery_2"}).json() is None


@pytest.mark.parametrize(
    ("params", "body", "loc"),
    [
        ({"key": "k" * 256}, "v", ["query", "key"]),
        ({"key": ""}, "v", ["query", "key"]),
        ({}, "v", ["query", "key"]),
        ({"key": "k"}, {"not": "a string"}, ["body"]),
        ({"key": "k"}, 12, ["body"]),
    ],
)
def test_bad_keys_and_values_are_422_naming_them(
    client: TestClient, params: dict[str, str], body: object, loc: list[str]
) -> None:
    response = client.post(f"{STATE}/set_by_key", params=params, json=body)
    assert response.status_code == 422, response.text
    assert loc in [error["loc"] for error in response.json()["detail"]]


@pytest.mark.parametrize("raw", [b'"\\ud800"', b'{"v": NaN}'])
def test_lone_surrogates_and_non_finite_numbers_are_refused(client: TestClient, raw: bytes) -> None:
    response = client.post(
        f"{STATE}/set_by_key", params={"key": "k"}, content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert client.get(f"{STATE}/get_by_key", params={"key": "k"}).json() is None


def test_the_value_size_and_the_number_of_keys_are_bounded(client: TestClient) -> None:
    too_large = client.post(f"{STATE}/set_by_key", params={"key": "k"}, json="x" * (1024 * 1024 + 1))
    assert too_large.status_code == 413 and "at most 1048576" in too_large.json()["detail"]
    client.app.state.services.client_state.max_keys = 2  # type: ignore[attr-defined]
    for key in ("a", "b"):
        assert client.post(f"{STATE}/set_by_key", params={"key": key}, json="1").status_code == 200
    full = client.post(f"{STATE}/set_by_key", params={"key": "c"}, json="1")
    assert full.status_code == 409 and "2 keys" in full.json()["detail"]
    assert client.post(f"{STATE}/set_by_key", params={"key": "a"}, json="2").status_code == 200


def test_a_bad_queue_id_is_422(client: TestClient) -> None:
    response = client.get("/api/v1/client_state/bad%20queue/get_by_key", params={"key": "k"})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["path", "queue_id"]
