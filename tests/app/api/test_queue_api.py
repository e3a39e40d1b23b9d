"""The queue routes through the real app: shapes clients rely on, every graph refusal, limits and controls."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from api_support import IMAGE_GRAPH, QUEUE, MakeClient, edge, enqueue, graph_json, node, wait_finished, wait_until
from fastapi.testclient import TestClient
from web_server import LOCAL_BASE_URL

EMPTY_COUNTS = {"pending": 0, "in_progress": 0, "waiting": 0, "completed": 0, "failed": 0, "canceled": 0, "total": 0}


def counts(client: TestClient) -> dict[str, int]:
    queue = client.get(f"{QUEUE}/status").json()["queue"]
    return {key: queue[key] for key in EMPTY_COUNTS}


def test_enqueue_runs_and_answers_in_invokeais_shapes(client: TestClient) -> None:
    response = enqueue(client, IMAGE_GRAPH, runs=2)
    assert response.status_code == 200
    body = response.json()
    assert (body["enqueued"], body["requested"], body["queue_id"], body["priority"]) == (2, 2, "default", 0)
    assert len(body["item_ids"]) == 2 and body["batch"]["runs"] == 2 and body["batch"]["batch_id"]
    for item_id in body["item_ids"]:
        item = wait_finished(client, item_id)
        assert item["status"] == "completed", item
        assert item["batch_id"] == body["batch"]["batch_id"]
        assert item["started_at"] and item["completed_at"]
        assert item["session"]["graph"]["nodes"]["resize"]["width"] == 24
        assert item["session"]["results"]["resize"]["image"]["image_name"].endswith(".png")
    assert counts(client) == {**EMPTY_COUNTS, "completed": 2, "total": 2}
    assert client.get(f"{QUEUE}/status").json()["processor"] == {
        "is_started": True,
        "is_processing": False,
        "workers": 1,
        "running_item_ids": [],
    }


def test_batch_data_makes_an_item_per_combination(client: TestClient) -> None:
    data = [
        [{"node_path": "blank", "field_name": "width", "items": [10, 20]}],
        [{"node_path": "blank", "field_name": "color", "items": ["#000000", "#ffffff", "#00ff00"]}],
    ]
    body = enqueue(client, IMAGE_GRAPH, data=data).json()
    assert body["enqueued"] == 6
    item = client.get(f"{QUEUE}/i/{body['item_ids'][-1]}").json()
    assert item["field_values"] == [
        {"node_path": "blank", "field_name": "width", "value": 20},
        {"node_path": "blank", "field_name": "color", "value": "#00ff00"},
    ]
    assert item["session"]["graph"]["nodes"]["blank"]["width"] == 20


REFUSED: dict[str, tuple[dict[str, Any], list[Any], str]] = {
    "unknown node type": (
        graph_json(node("a", "no_such_node")),
        ["body", "batch", "graph", "nodes", "a"],
        "does not match any of the expected tags",
    ),
    "field value of the wrong type": (
        graph_json(node("a", "blank_image", width="wide")),
        ["body", "batch", "graph", "nodes", "a", "blank_image", "width"],
        "valid integer",
    ),
    "required input neither set nor connected": (
        graph_json(node("r", "image_resize")),
        ["body", "batch", "graph", "nodes", "r"],
        "required input 'image' is neither set nor connected",
    ),
    "edge to a missing node": (
        graph_json(node("r", "image_resize"), edges=[edge("ghost", "image", "r", "image")]),
        ["body", "batch", "graph", "edges", 0],
        "source node 'ghost' is not in the graph",
    ),
    "edge to a missing field": (
        graph_json(node("a", "blank_image"), node("r", "image_resize"), edges=[edge("a", "picture", "r", "image")]),
        ["body", "batch", "graph", "edges", 0],
        "has no output 'picture'",
    ),
    "type-incompatible edge": (
        graph_json(node("s", "string"), node("i", "integer"), edges=[edge("s", "value", "i", "value")]),
        ["body", "batch", "graph", "edges", 0],
        "output type str does not fit input type int",
    ),
    "two edges into one input": (
        graph_json(
            node("a", "blank_image"),
            node("b", "blank_image"),
            node("r", "image_resize"),
            edges=[edge("a", "image", "r", "image"), edge("b", "image", "r", "image")],
        ),
        ["body", "batch", "graph", "edges", 1],
        "an input takes at most one edge",
    ),
    "cycle": (
        graph_json(
            node("a", "image_resize"),
            node("b", "image_resize"),
            edges=[edge("a", "image", "b", "image"), edge("b", "image", "a", "image")],
        ),
        ["body", "batch", "graph", "nodes", "a"],
        "the graph has a cycle",
    ),
    "zipped data of unequal length": (
        graph_json(node("a", "integer"), node("b", "integer")),
        ["body", "batch", "data", 0],
        "equally many items",
    ),
    "datum of the wrong type": (
        graph_json(node("a", "integer")),
        ["body", "batch", "data", 0, 0, "items", 0],
        "valid integer",
    ),
}
DATA = {
    "zipped data of unequal length": [
        [
            {"node_path": "a", "field_name": "value", "items": [1, 2]},
            {"node_path": "b", "field_name": "value", "items": [1]},
        ]
    ],
    "datum of the wrong type": [[{"node_path": "a", "field_name": "value", "items": ["x"]}]],
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_an_invalid_graph_is_refused_with_422_naming_the_culprit_and_nothing_is_stored(
    client: TestClient, case: str
) -> None:
    graph, loc, reason = REFUSED[case]
    extra = {"data": DATA[case]} if case in DATA else {}
    response = enqueue(client, graph, runs=3, **extra)
    assert response.status_code == 422, response.text
    [detail] = [d for d in response.json()["detail"] if d["loc"] == loc]
    assert reason in detail["msg"]
    assert counts(client) == EMPTY_COUNTS
    assert client.get(f"{QUEUE}/list").json()["total"] == 0


def test_an_int_may_feed_a_float(client: TestClient) -> None:
    graph = graph_json(node("i", "integer", value=3), node("f", "float"), edges=[edge("i", "value", "f", "value")])
    [item_id] = enqueue(client, graph).json()["item_ids"]
    item = wait_finished(client, item_id)
    assert item["status"] == "completed" and item["session"]["results"]["f"]["value"] == 3.0


@pytest.mark.parametrize(
    "body",
    [{}, {"batch": {"runs": 1}}, {"batch": {"graph": IMAGE_GRAPH, "runs": 0}}, {"batch": {"graph": [], "runs": 1}}],
    ids=["no-batch", "no-graph", "zero-runs", "graph-not-object"],
)
def test_malformed_bodies_get_fastapis_422(client: TestClient, body: dict[str, Any]) -> None:
    response = client.post(f"{QUEUE}/enqueue_batch", json=body)
    assert response.status_code == 422
    assert all({"loc", "msg", "type"} <= set(d) for d in response.json()["detail"])


def test_a_batch_over_max_queue_size_is_refused_whole_with_429(make_client: MakeClient) -> None:
    client = make_client(max_queue_size=5, run_processor=False)
    assert enqueue(client, IMAGE_GRAPH, runs=4).status_code == 200
    response = enqueue(client, IMAGE_GRAPH, runs=2)
    assert response.status_code == 429
    assert response.json()["detail"] == (
        "the batch makes 2 queue items and 4 are pending; at most 5 may be pending (max_queue_size). "
        "Nothing was enqueued."
    )
    assert counts(client)["pending"] == 4
    assert enqueue(client, IMAGE_GRAPH, runs=1).status_code == 200


def test_list_get_cancel_prune_and_clear(make_client: MakeClient) -> None:
    client = make_client(run_processor=False)
    first = enqueue(client, IMAGE_GRAPH, runs=3).json()
    second = enqueue(client, IMAGE_GRAPH, runs=2).json()
    a, b, c = first["item_ids"]

    canceled = client.put(f"{QUEUE}/i/{a}/cancel").json()
    assert (canceled["status"], canceled["cancel_reason"]) == ("canceled", "canceled by request")
    page = client.get(f"{QUEUE}/list", params={"offset": 1, "limit": 2}).json()
    assert ([i["item_id"] for i in page["items"]], page["offset"], page["limit"], page["total"]) == ([b, c], 1, 2, 5)
    only = client.get(f"{QUEUE}/list", params={"status": "canceled"}).json()
    assert [i["item_id"] for i in only["items"]] == [a]

    by_batch = client.put(f"{QUEUE}/cancel_by_batch_ids", json={"batch_ids": [second["batch"]["batch_id"]]})
    assert by_batch.json() == {"canceled": 2}
    assert counts(client) == {**EMPTY_COUNTS, "pending": 2, "canceled": 3, "total": 5}
    assert client.put(f"{QUEUE}/prune").json() == {"deleted": 3}
    assert client.get(f"{QUEUE}/i/{a}").status_code == 404
    assert client.put(f"{QUEUE}/clear").json() == {"deleted": 2}
    assert counts(client) == EMPTY_COUNTS


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/queue/default/i/999", 404),
        ("/api/v1/queue/elsewhere/i/1", 404),
        ("/api/v1/queue/default/i/0", 422),
        ("/api/v1/queue/default/i/99999999999999999999999", 422),
        ("/api/v1/queue/bad%20id/status", 422),
    ],
)
def test_unknown_and_malformed_item_ids(make_client: MakeClient, path: str, status: int) -> None:
    client = make_client(run_processor=False)
    enqueue(client, IMAGE_GRAPH)
    assert client.get(path).status_code == status


def test_pause_and_resume(client: TestClient) -> None:
    assert client.put(f"{QUEUE}/processor/pause").json() == {
        "is_started": False,
        "is_processing": False,
        "workers": 1,
        "running_item_ids": [],
    }
    [item_id] = enqueue(client, IMAGE_GRAPH).json()["item_ids"]
    assert client.get(f"{QUEUE}/i/{item_id}").json()["status"] == "pending"
    assert client.put(f"{QUEUE}/processor/resume").json()["is_started"] is True
    assert wait_finished(client, item_id)["status"] == "completed"


def test_a_failing_node_fails_its_item_and_the_server_keeps_serving(client: TestClient) -> None:
    missing = {"image_name": "0" * 32 + ".png"}
    failing = graph_json(node("r", "image_resize", image=missing, width=4, height=4))
    [failed_id] = enqueue(client, failing).json()["item_ids"]
    [ok_id] = enqueue(client, IMAGE_GRAPH).json()["item_ids"]
    failed = wait_finished(client, failed_id)
    assert (failed["status"], failed["error_type"]) == ("failed", "ImageNotFoundError")
    assert "not found" in failed["error_message"] and "Traceback" in failed["error_traceback"]
    assert wait_finished(client, ok_id)["status"] == "completed"
    assert client.get("/api/v1/app/version").status_code == 200


def test_cancel_of_a_running_item(client: TestClient, scripted_integer_node: list[str]) -> None:
    [item_id] = enqueue(client, graph_json(node("n", "integer", value=100_000))).json()["item_ids"]
    wait_until(lambda: client.get(f"{QUEUE}/i/{item_id}").json()["status"] == "in_progress", what="the start")
    assert client.put(f"{QUEUE}/i/{item_id}/cancel").json()["status"] == "canceled"
    wait_until(lambda: not client.get(f"{QUEUE}/status").json()["processor"]["is_processing"], what="the stop")
    item = client.get(f"{QUEUE}/i/{item_id}").json()
    assert (item["status"], item["session"]["results"]) == ("canceled", {})


def test_retry_items_by_id_enqueues_a_canceled_item_again_and_answers_the_new_id(make_client: MakeClient) -> None:
    client = make_client(run_processor=False)
    ids = enqueue(client, IMAGE_GRAPH, runs=2).json()["item_ids"]
    client.put(f"{QUEUE}/i/{ids[0]}/cancel")
    response = client.put(f"{QUEUE}/retry_items_by_id", json=[ids[0]])  # a bare array, as InvokeAI's
    assert response.status_code == 200
    body = response.json()
    assert body["queue_id"] == "default" and body["retried_item_ids"] == [ids[0]]
    [new_id] = body["item_ids"]
    assert new_id not in ids
    item = client.get(f"{QUEUE}/i/{new_id}").json()
    assert item["status"] == "pending" and item["retried_from_item_id"] == ids[0]
    assert item["session"]["graph"] == client.get(f"{QUEUE}/i/{ids[0]}").json()["session"]["graph"]
    assert client.get(f"{QUEUE}/i/{ids[0]}").json()["status"] == "canceled"  # the original stays as it was


def test_retry_items_by_id_refuses_what_it_cannot_retry_and_enqueues_nothing(make_client: MakeClient) -> None:
    client = make_client(run_processor=False)
    pending, canceled = enqueue(client, IMAGE_GRAPH, runs=2).json()["item_ids"]
    client.put(f"{QUEUE}/i/{canceled}/cancel")
    refused = client.put(f"{QUEUE}/retry_items_by_id", json=[canceled, pending])
    assert refused.status_code == 409 and f"{pending} (pending)" in refused.json()["detail"]
    unknown = client.put(f"{QUEUE}/retry_items_by_id", json=[canceled, 424242])
    assert unknown.status_code == 404 and "424242" in unknown.json()["detail"]
    # InvokeAI's body is the array itself: the object this server took before is refused, naming the body.
    old_shape = client.put(f"{QUEUE}/retry_items_by_id", json={"item_ids": [canceled]})
    assert old_shape.status_code == 422 and old_shape.json()["detail"][0]["loc"] == ["body"]
    too_many = client.put(f"{QUEUE}/retry_items_by_id", json=list(range(1, 1002)))
    assert too_many.status_code == 422 and "1000" in too_many.json()["detail"][0]["msg"]
    assert client.put(f"{QUEUE}/retry_items_by_id", json=[0]).status_code == 422
    empty = client.put(f"{QUEUE}/retry_items_by_id", json=[])
    assert empty.status_code == 200 and empty.json()["retried_item_ids"] == []  # as InvokeAI answers it
    assert counts(client)["total"] == 2


def test_a_damaged_stored_item_never_fails_list_or_get(make_client: MakeClient) -> None:
    client = make_client(run_processor=False)
    data = [[{"node_path": "blank", "field_name": "width", "items": [10, 20, 30]}]]
    ids = enqueue(client, IMAGE_GRAPH, data=data).json()["item_ids"]
    db = client.app.state.services.db  # type: ignore[attr-defined]
    db.execute("UPDATE session_queue SET field_values = 'not json' WHERE item_id = ?", (ids[1],))
    db.execute("UPDATE session_queue SET results = NULL, field_values = '[null]' WHERE item_id = ?", (ids[2],))
    listed = client.get(f"{QUEUE}/list")
    assert listed.status_code == 200
    items = listed.json()["items"]
    assert [item["session"] is None for item in items] == [False, True, True]
    assert "cannot be read" in items[1]["read_error"]
    for item_id in ids[1:]:
        got = client.get(f"{QUEUE}/i/{item_id}")
        assert got.status_code == 200 and got.json()["read_error"]
    assert client.put(f"{QUEUE}/i/{ids[1]}/cancel").json()["status"] == "canceled"


def test_a_restart_keeps_the_pause_and_removes_leftover_temporary_files(tmp_path: Path) -> None:
    from invokeai.app.api.app_factory import create_app
    from invokeai.app.config import InvokeAIAppConfig

    config = InvokeAIAppConfig.located({}, tmp_path, None)
    with TestClient(create_app(config), base_url=LOCAL_BASE_URL) as first:
        assert first.put(f"{QUEUE}/processor/pause").json()["is_started"] is False
    outputs = config.outputs_path
    leftovers = [outputs / ".tmp-abc.png", outputs / "thumbnails" / ".tmp-def.webp"]
    for path in leftovers:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"partial")
    (outputs / "keep.txt").write_text("not ours")
    with TestClient(create_app(config), base_url=LOCAL_BASE_URL) as second:
        assert second.get(f"{QUEUE}/status").json()["processor"]["is_started"] is False
        [item_id] = enqueue(second, IMAGE_GRAPH).json()["item_ids"]
        time.sleep(0.3)
        assert second.get(f"{QUEUE}/i/{item_id}").json()["status"] == "pending"
        assert [path.exists() for path in leftovers] == [False, False]
        assert (outputs / "keep.txt").exists()
        second.put(f"{QUEUE}/processor/resume")
        assert wait_finished(second, item_id)["status"] == "completed"
