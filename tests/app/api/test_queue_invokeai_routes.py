"""The queue routes InvokeAI 6.14.2 has beside enqueue, list and cancel: list_all, item_ids, items_by_ids, current,
next, batch status, destinations, cancel_all_except_current; and the item's session as InvokeAI's
GraphExecutionState."""

from __future__ import annotations

import pytest
from api_support import IMAGE_GRAPH, QUEUE, MakeClient, edge, enqueue, graph_json, node, wait_finished, wait_until
from fastapi.testclient import TestClient

from invokeai.app.services import session_queue

COUNT_FIELDS = ("pending", "in_progress", "waiting", "completed", "failed", "canceled", "total")
# The fields InvokeAI 6.14.2's GraphExecutionState requires.
SESSION_FIELDS = {
    "id",
    "graph",
    "execution_graph",
    "executed",
    "executed_history",
    "results",
    "errors",
    "workflow_call_stack",
    "workflow_call_history",
    "prepared_source_mapping",
    "source_prepared_mapping",
}


def counts(body: dict[str, int]) -> tuple[int, ...]:
    return tuple(body[name] for name in COUNT_FIELDS)


def ids(items: list[dict[str, object]]) -> list[object]:
    return [item["item_id"] for item in items]


@pytest.fixture
def idle(make_client: MakeClient) -> TestClient:
    return make_client(run_processor=False)


def test_list_all_answers_every_item_in_run_order_and_filters_by_destination(idle: TestClient) -> None:
    canvas = enqueue(idle, IMAGE_GRAPH, runs=2, destination="canvas").json()["item_ids"]
    gallery = enqueue(idle, IMAGE_GRAPH, destination="gallery").json()["item_ids"]
    first = idle.post(f"{QUEUE}/enqueue_batch", json={"batch": {"graph": IMAGE_GRAPH}, "prepend": True})
    assert first.status_code == 200
    everything = idle.get(f"{QUEUE}/list_all")
    assert everything.status_code == 200
    assert ids(everything.json()) == [*first.json()["item_ids"], *canvas, *gallery]  # priority first, then oldest
    assert everything.json()[0]["session"]["graph"]["nodes"]["resize"]["width"] == 24
    assert ids(idle.get(f"{QUEUE}/list_all", params={"destination": "canvas"}).json()) == canvas
    assert idle.get(f"{QUEUE}/list_all", params={"destination": "nowhere"}).json() == []
    assert idle.get("/api/v1/queue/another/list_all").json() == []


def test_list_all_past_its_bound_is_refused_naming_the_way_to_page(
    idle: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_queue, "MAX_LIST_ALL", 2)
    enqueue(idle, IMAGE_GRAPH, runs=3)
    refused = idle.get(f"{QUEUE}/list_all")
    assert refused.status_code == 422
    [detail] = refused.json()["detail"]
    assert detail["type"] == "too_many_items" and "3 items" in detail["msg"] and "item_ids" in detail["msg"]
    assert idle.get(f"{QUEUE}/list_all", params={"destination": "x" * 1001}).status_code == 422


def test_item_ids_in_both_orders_and_items_by_ids_in_the_order_asked(idle: TestClient) -> None:
    a, b, c = enqueue(idle, IMAGE_GRAPH, runs=3).json()["item_ids"]
    [other] = idle.post("/api/v1/queue/another/enqueue_batch", json={"batch": {"graph": IMAGE_GRAPH}}).json()[
        "item_ids"
    ]
    assert idle.get(f"{QUEUE}/item_ids").json() == {"item_ids": [c, b, a], "total_count": 3}  # DESC by default
    assert idle.get(f"{QUEUE}/item_ids", params={"order_dir": "ASC"}).json()["item_ids"] == [a, b, c]
    bad = idle.get(f"{QUEUE}/item_ids", params={"order_dir": "down"})
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "order_dir"]
    got = idle.post(f"{QUEUE}/items_by_ids", json={"item_ids": [c, 999, other, a]})
    assert got.status_code == 200 and ids(got.json()) == [c, a]  # missing and other queues' ids are left out
    assert "execution_graph" in got.json()[0]["session"]
    assert idle.post(f"{QUEUE}/items_by_ids", json={"item_ids": []}).json() == []
    too_many = idle.post(f"{QUEUE}/items_by_ids", json={"item_ids": list(range(1, 1002))})
    assert too_many.status_code == 422 and too_many.json()["detail"][0]["loc"] == ["body", "item_ids"]
    assert idle.post(f"{QUEUE}/items_by_ids", json=[a]).status_code == 422  # InvokeAI's body is an object


def test_next_is_the_item_that_runs_next_and_current_the_running_one(
    make_client: MakeClient, scripted_integer_node: list[str]
) -> None:
    client = make_client()
    assert client.get(f"{QUEUE}/current").json() is None and client.get(f"{QUEUE}/next").json() is None
    client.put(f"{QUEUE}/processor/pause")
    [slow] = enqueue(client, graph_json(node("n", "integer", value=100_000))).json()["item_ids"]
    [later] = enqueue(client, graph_json(node("n", "integer", value=0))).json()["item_ids"]
    assert client.get(f"{QUEUE}/next").json()["item_id"] == slow
    assert client.get(f"{QUEUE}/current").json() is None
    client.put(f"{QUEUE}/processor/resume")
    wait_until(lambda: client.get(f"{QUEUE}/current").json() is not None, what="the start")
    current = client.get(f"{QUEUE}/current").json()
    assert (current["item_id"], current["status"]) == (slow, "in_progress")
    assert client.get(f"{QUEUE}/next").json()["item_id"] == later
    # cancel_all_except_current: the pending item goes, the running one runs on.
    assert client.put(f"{QUEUE}/cancel_all_except_current").json() == {"canceled": 1}
    assert client.get(f"{QUEUE}/i/{later}").json()["status"] == "canceled"
    assert client.get(f"{QUEUE}/i/{slow}").json()["status"] == "in_progress"
    client.put(f"{QUEUE}/i/{slow}/cancel")


def test_batch_status_counts_the_batchs_items(idle: TestClient) -> None:
    body = enqueue(idle, IMAGE_GRAPH, runs=3, origin="canvas-client", destination="canvas").json()
    batch_id = body["batch"]["batch_id"]
    idle.put(f"{QUEUE}/i/{body['item_ids'][0]}/cancel")
    enqueue(idle, IMAGE_GRAPH)  # another batch, not counted
    status = idle.get(f"{QUEUE}/b/{batch_id}/status")
    assert status.status_code == 200
    got = status.json()
    assert (got["queue_id"], got["batch_id"], got["origin"], got["destination"]) == (
        "default",
        batch_id,
        "canvas-client",
        "canvas",
    )
    assert counts(got) == (2, 0, 0, 0, 0, 1, 3)
    unknown = idle.get(f"{QUEUE}/b/no-such-batch/status").json()
    assert counts(unknown) == (0,) * 7 and unknown["origin"] is None
    assert idle.get(f"{QUEUE}/b/bad%20id/status").status_code == 422


def test_counts_and_cancel_by_destination(idle: TestClient) -> None:
    enqueue(idle, IMAGE_GRAPH, runs=2, destination="canvas")
    [gallery] = enqueue(idle, IMAGE_GRAPH, destination="gallery").json()["item_ids"]
    got = idle.get(f"{QUEUE}/counts_by_destination", params={"destination": "canvas"})
    assert got.status_code == 200
    assert got.json()["destination"] == "canvas" and got.json()["queue_id"] == "default"
    assert counts(got.json()) == (2, 0, 0, 0, 0, 0, 2)
    missing = idle.get(f"{QUEUE}/counts_by_destination")
    assert missing.status_code == 422 and missing.json()["detail"][0]["loc"] == ["query", "destination"]
    assert idle.put(f"{QUEUE}/cancel_by_destination").status_code == 422
    assert idle.put(f"{QUEUE}/cancel_by_destination", params={"destination": "canvas"}).json() == {"canceled": 2}
    assert counts(idle.get(f"{QUEUE}/counts_by_destination", params={"destination": "canvas"}).json()) == (
        0,
        0,
        0,
        0,
        0,
        2,
        2,
    )
    assert idle.get(f"{QUEUE}/i/{gallery}").json()["status"] == "pending"


def test_the_status_has_invokeais_counts(idle: TestClient) -> None:
    enqueue(idle, IMAGE_GRAPH, runs=2)
    queue = idle.get(f"{QUEUE}/status").json()["queue"]
    required = {"queue_id", "item_id", "batch_id", "session_id", *COUNT_FIELDS}
    assert required <= set(queue)
    assert counts(queue) == (2, 0, 0, 0, 0, 0, 2)


def test_a_completed_items_session_is_a_graph_execution_state(client: TestClient) -> None:
    graph = graph_json(
        node("i", "integer", value=3),
        node("f", "float"),
        node("blank", "blank_image", width=8, height=8),
        edges=[edge("i", "value", "f", "value")],
    )
    [item_id] = enqueue(client, graph).json()["item_ids"]
    session = wait_finished(client, item_id)["session"]
    assert set(session) == SESSION_FIELDS
    assert session["execution_graph"]["nodes"].keys() == graph["nodes"].keys()
    assert session["execution_graph"]["edges"] == graph["edges"]
    order = session["executed_history"]
    assert sorted(order) == ["blank", "f", "i"] and order.index("i") < order.index("f")
    assert sorted(session["executed"]) == sorted(order) and session["errors"] == {}
    assert list(session["results"]) == order and session["results"]["f"]["value"] == 3.0
    assert session["prepared_source_mapping"] == {n: n for n in order}
    assert session["source_prepared_mapping"] == {n: [n] for n in order}
    assert session["workflow_call_stack"] == [] and session["workflow_call_history"] == []


def test_a_failed_items_session_names_the_failed_node_in_errors(client: TestClient) -> None:
    missing = {"image_name": "0" * 32 + ".png"}
    graph = graph_json(
        node("i", "integer", value=3),
        node("r", "image_resize", image=missing, width=4, height=4),
        node("after", "image_resize", width=2, height=2),
        edges=[edge("r", "image", "after", "image")],
    )
    [item_id] = enqueue(client, graph).json()["item_ids"]
    item = wait_finished(client, item_id)
    session = item["session"]
    assert item["status"] == "failed"
    assert session["errors"] == {"r": f"ImageNotFoundError: {item['error_message']}"}
    assert session["executed"] == ["i"] and list(session["results"]) == ["i"]
    assert sorted(session["execution_graph"]["nodes"]) == ["i", "r"]  # prepared: what ran and what failed
    assert session["execution_graph"]["edges"] == []
    assert session["prepared_source_mapping"] == {"i": "i", "r": "r"}


def test_a_pending_items_session_has_run_nothing(idle: TestClient) -> None:
    [item_id] = enqueue(idle, IMAGE_GRAPH).json()["item_ids"]
    session = idle.get(f"{QUEUE}/i/{item_id}").json()["session"]
    assert set(session) == SESSION_FIELDS
    assert session["execution_graph"]["nodes"] == {} and session["executed"] == [] and session["results"] == {}
    assert session["graph"]["nodes"].keys() == IMAGE_GRAPH["nodes"].keys()


def test_the_routes_and_the_invocation_cache_on_postgresql(make_client: MakeClient, postgres_url: str) -> None:
    client = make_client(use_memory_db=False, database_url=postgres_url)
    graph = graph_json(node("i", "integer", value=3), node("f", "float"), edges=[edge("i", "value", "f", "value")])
    done = [wait_finished(client, i)["status"] for i in enqueue(client, graph, runs=2).json()["item_ids"]]
    assert done == ["completed", "completed"]
    status = client.get("/api/v1/app/invocation_cache/status").json()  # the models' version read on PostgreSQL
    assert (status["hits"], status["misses"]) == (2, 2)
    client.put(f"{QUEUE}/processor/pause")
    body = enqueue(client, IMAGE_GRAPH, runs=3, destination="canvas").json()
    a, b, c = body["item_ids"]
    assert ids(client.get(f"{QUEUE}/list_all", params={"destination": "canvas"}).json()) == [a, b, c]
    assert client.get(f"{QUEUE}/item_ids", params={"order_dir": "ASC"}).json()["item_ids"][-3:] == [a, b, c]
    assert ids(client.post(f"{QUEUE}/items_by_ids", json={"item_ids": [c, a]}).json()) == [c, a]
    assert client.get(f"{QUEUE}/next").json()["item_id"] == a and client.get(f"{QUEUE}/current").json() is None
    assert counts(client.get(f"{QUEUE}/b/{body['batch']['batch_id']}/status").json()) == (3, 0, 0, 0, 0, 0, 3)
    assert client.put(f"{QUEUE}/cancel_by_destination", params={"destination": "canvas"}).json() == {"canceled": 3}
    assert counts(client.get(f"{QUEUE}/counts_by_destination", params={"destination": "canvas"}).json()) == (
        0,
        0,
        0,
        0,
        0,
        3,
        3,
    )
    enqueue(client, IMAGE_GRAPH, runs=2)
    assert client.put(f"{QUEUE}/cancel_all_except_current").json() == {"canceled": 2}
    client.put(f"{QUEUE}/processor/resume")
