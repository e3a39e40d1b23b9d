"""Fixtures for the queue, processor and event bus tests: the real services on an in-memory database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from queue_support import EventRecorder

from invokeai.app.services.events import EventBus
from invokeai.app.services.images import ImageService
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import SessionQueue
from invokeai.app.services.sqlite import SqliteDatabase


@pytest.fixture
def events() -> EventBus:
    return EventBus()


@pytest.fixture
def recorder(events: EventBus) -> EventRecorder:
    recorder = EventRecorder()
    events.add_listener(recorder)
    return recorder


@pytest.fixture
def images(db: SqliteDatabase, tmp_path: Path) -> ImageService:
    return ImageService(db, tmp_path / "outputs", max_upload_bytes=1_000_000)


@pytest.fixture
def queue(db: SqliteDatabase, events: EventBus) -> SessionQueue:
    return SessionQueue(db, events, max_queue_size=20)


@pytest.fixture
def processor(queue: SessionQueue, images: ImageService, events: EventBus) -> Iterator[SessionProcessor]:
    """A started processor, stopped after the test."""
    worker = SessionProcessor(queue, images, events)
    worker.start()
    yield worker
    worker.stop()
