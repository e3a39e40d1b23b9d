"""Every service of the server, built from the settings, started and stopped together."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.services.events import EventBus
from invokeai.app.services.images import ImageService
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import SessionQueue
from invokeai.app.services.sqlite import SqliteDatabase

logger = logging.getLogger(__name__)

MEGABYTE = 1024 * 1024


@dataclass
class Services:
    db: SqliteDatabase
    events: EventBus
    images: ImageService
    queue: SessionQueue
    processor: SessionProcessor

    def start(self, run_processor: bool = True) -> None:
        recovered = self.queue.recover_interrupted()
        if recovered:
            logger.info("Canceled %d queue item(s) that were running when the server last stopped", recovered)
        if run_processor:
            self.processor.start()

    def stop(self) -> None:
        self.processor.stop()
        self.db.close()


def build_services(config: InvokeAIAppConfig, events: EventBus) -> Services:
    """Open (or create and migrate) the database and build the services on it; starts nothing."""
    db = SqliteDatabase(None if config.use_memory_db else config.db_file)
    images = ImageService(db, config.outputs_path, config.max_upload_mb * MEGABYTE)
    queue = SessionQueue(db, events, config.max_queue_size)
    processor = SessionProcessor(queue, images, events)
    return Services(db=db, events=events, images=images, queue=queue, processor=processor)
