"""The app on PostgreSQL (database_url): items run through the API as on SQLite; the settings show the lease and
hide the URL (it may hold a password)."""

from __future__ import annotations

from api_support import QUEUE, MakeClient, enqueue, graph_json, node, wait_finished


def test_the_app_runs_items_on_postgresql_and_shows_the_lease_setting(
    make_client: MakeClient, postgres_url: str
) -> None:
    client = make_client(use_memory_db=False, database_url=postgres_url, queue_lease_seconds=9)
    config = client.get("/api/v1/app/config").json()["config"]
    assert config["queue_lease_seconds"] == 9 and config["requeue_interrupted"] is False
    assert "database_url" not in config
    response = enqueue(client, graph_json(node("n", "integer", value=3)), runs=2)
    assert response.status_code == 200, response.text
    for item_id in response.json()["item_ids"]:
        assert wait_finished(client, item_id)["status"] == "completed"
    assert client.get(f"{QUEUE}/status").json()["queue"]["completed"] == 2
