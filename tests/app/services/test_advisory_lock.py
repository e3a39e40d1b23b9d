"""server_lock on a real PostgreSQL server: one holder at a time among the servers on one database, as the first
starts' demo-model installs need."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from invokeai.app.services.advisory_lock import server_lock


def test_a_second_server_waits_for_the_first_and_says_so(postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    order: list[str] = []
    holding = threading.Event()

    def first() -> None:
        with server_lock(postgres_url, "install_demo_models", "waiting"):
            order.append("first in")
            holding.set()
            time.sleep(0.5)
            order.append("first out")

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(10)
    with caplog.at_level(logging.INFO, logger="invokeai.app.services.advisory_lock"):
        with server_lock(postgres_url, "install_demo_models", "waiting for the other server"):
            order.append("second in")
    thread.join()
    assert order == ["first in", "first out", "second in"]
    assert "waiting for the other server" in caplog.text
    # Another lock's name is another lock; and one released is free again.
    with server_lock(postgres_url, "something else", "never"), server_lock(postgres_url, "install_demo_models", "no"):
        pass


def test_without_a_database_url_there_is_nothing_to_wait_for() -> None:
    with server_lock("", "install_demo_models", "waiting"):
        pass
