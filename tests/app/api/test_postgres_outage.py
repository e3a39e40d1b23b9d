"""The API while its PostgreSQL server is down (a server of the tests' own, stopped and started again): 503 with a
JSON body and Retry-After, one log line for the outage, and answers again by itself once the database is back."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from api_support import QUEUE, MakeClient
from wait_support import wait_until

from invokeai.app.services import postgres


def test_the_api_answers_503_with_retry_after_during_an_outage_and_recovers(
    make_client: MakeClient, faulty_postgres: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(postgres, "POOL_WAIT_S", 0.5)  # a request waits this long for a connection, then fails
    client = make_client(use_memory_db=False, database_url=faulty_postgres.url, run_processor=False)
    assert client.get(f"{QUEUE}/status").status_code == 200
    faulty_postgres.halt()
    with caplog.at_level(logging.WARNING):
        answers = [client.get(f"{QUEUE}/status") for _ in range(3)]
        answers.append(client.put(f"{QUEUE}/cancel_all_except_current"))
    for answer in answers:
        assert answer.status_code == 503, answer.text
        assert answer.json() == {"detail": "the database cannot be reached; try again shortly"}
        assert answer.headers["Retry-After"] == "5"
    ours = [r for r in caplog.records if r.name.startswith("invokeai.app.api")]
    assert len(ours) == 1 and "The database cannot be reached" in ours[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info]  # no traceback per request
    faulty_postgres.resume()
    wait_until(lambda: client.get(f"{QUEUE}/status").status_code == 200, timeout=15, what="the API to answer again")
