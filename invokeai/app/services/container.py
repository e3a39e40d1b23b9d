"""Every service of the server, built from the settings, started and stopped together."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from invokeai.app.config import InvokeAIAppConfig
from invokeai.app.services.advisory_lock import server_lock
from invokeai.app.services.board_images import BoardImageService
from invokeai.app.services.boards import BoardService
from invokeai.app.services.client_state import ClientStateService
from invokeai.app.services.database import Database, open_database
from invokeai.app.services.event_relay import EventRelay
from invokeai.app.services.events import EventBus
from invokeai.app.services.image_orphans import remove_unrecorded_images
from invokeai.app.services.images import TEMPORARY_PREFIX, THUMBNAILS_DIR, ImageService
from invokeai.app.services.invocation_cache import InvocationCache, models_version_of
from invokeai.app.services.model_install import ModelInstallService
from invokeai.app.services.model_manager import ModelManager
from invokeai.app.services.model_records import ModelRecordService
from invokeai.app.services.owned_temporaries import is_leftover
from invokeai.app.services.queue_leases import LeaseKeeper
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import SessionQueue
from invokeai.app.services.tensors import TensorStore
from invokeai.app.services.warm_up import WarmUp
from invokeai.app.services.workflows import WorkflowService
from invokeai.backend.cache.model_cache import ModelCache
from invokeai.backend.devices import choose_device, choose_dtype, choose_generation_devices, worker_names

logger = logging.getLogger(__name__)

MEGABYTE = 1024 * 1024
GIGABYTE = 1024 * MEGABYTE
POSTGRES_POLL_SECONDS = 0.5
DEMO_MODELS_WAIT = "Waiting for another server on the database to finish installing the demo models"


@dataclass
class Services:
    db: Database
    events: EventBus
    images: ImageService
    queue: SessionQueue
    processor: SessionProcessor
    models: ModelManager
    installer: ModelInstallService
    tensors: TensorStore
    leases: LeaseKeeper
    invocation_cache: InvocationCache
    boards: BoardService
    board_images: BoardImageService
    client_state: ClientStateService
    workflows: WorkflowService
    warm_up: WarmUp
    # With database_url: this server's events to the others on the database, and theirs to this one's bus.
    relay: EventRelay | None = None
    database_url: str = ""

    def start(self, run_processor: bool = True, demo_models: bool = False, warm_up: bool = False) -> None:
        """demo_models: install the demo models if no model is installed (before the processor takes items).
        warm_up: import what the models of the last completed items load with, before returning, and load them in
        the background afterwards (warm_up.py)."""
        if self.relay is not None:
            # First: what the start publishes (items it recovers) reaches the other servers' clients too.
            self.relay.start()
        recovered = self.queue.recover_interrupted()
        if recovered:
            logger.info(
                "%s %d queue item(s) that were running when their server stopped",
                "Requeued" if self.queue.requeue_interrupted else "Canceled",
                recovered,
            )
        self.installer.remove_stale_staging()
        remove_leftover_temporaries(self.images.outputs_dir)
        remove_unrecorded_images(self.db, self.images.outputs_dir)
        if demo_models:
            from invokeai.app.services.demo_models import install_demo_models

            try:
                # One server at a time: two first starts on one database would both find no model recorded and
                # build into the shared models_dir at once. The second waits, then finds them recorded and skips.
                with server_lock(self.database_url, "install_demo_models", DEMO_MODELS_WAIT):
                    install_demo_models(self.installer)
            except Exception:
                # The server is useful without them (models can be installed over the API): say why, and go on.
                logger.exception("Could not install the demo models")
        if warm_up:
            self.warm_up.prepare()
        self.leases.start()
        if run_processor:
            self.processor.start()
        if warm_up:
            self.warm_up.start()

    def stop(self) -> None:
        self.warm_up.stop()
        self.processor.stop()
        self.installer.stop()  # its jobs write records: before the database closes
        if self.relay is not None:
            self.relay.stop()  # after the processor: the cancels of its stop reach the other servers
        self.leases.stop()
        self.db.close()


def remove_leftover_temporaries(outputs_dir: Path) -> None:
    """An image is written to a .tmp-* file and renamed into place; a kill in between leaves the .tmp-* behind.
    Only leftovers go (owned_temporaries.is_leftover): in a shared outputs_dir, another live server's write in
    progress stays."""
    for folder in (outputs_dir, outputs_dir / THUMBNAILS_DIR):
        for temporary in folder.glob(f"{TEMPORARY_PREFIX}*"):
            if temporary.is_file() and is_leftover(temporary, TEMPORARY_PREFIX):
                temporary.unlink(missing_ok=True)
                logger.info("Removed %s, left by an image write that did not finish", temporary)


def build_services(config: InvokeAIAppConfig, events: EventBus) -> Services:
    """Open (or create and migrate) the database and build the services on it; starts nothing."""
    db = open_database(config)
    images = ImageService(db, config.outputs_path, config.max_upload_mb * MEGABYTE)
    queue = SessionQueue(
        db,
        events,
        config.max_queue_size,
        config.max_graph_nodes,
        lease_seconds=config.queue_lease_seconds,
        requeue_interrupted=config.requeue_interrupted,
        images=images,
    )
    models = build_model_manager(config, ModelRecordService(db), events)
    installer = ModelInstallService(
        models.records, config.models_path, events, hash_models=config.hash_models, on_delete=models.forget
    )
    tensors = TensorStore()
    invocation_cache = InvocationCache(config.node_cache_size, tensors, models_version_of(db))
    # On a shared PostgreSQL queue, items and a resume may come from other servers, which this one is not told of.
    poll = POSTGRES_POLL_SECONDS if db.dialect == "postgresql" else None
    workers = worker_managers(config, models)
    processor = SessionProcessor(
        queue,
        images,
        events,
        models,
        tensors,
        workers=workers,
        poll_seconds=poll,
        cache=invocation_cache,
    )
    relay = None
    if config.database_url:
        relay = EventRelay(config.database_url, events)
        relay.on_resync(processor.wake)
        # A status change and its events commit together (transactional_events.py).
        queue.transactional_events = relay
    return Services(
        db=db,
        events=events,
        images=images,
        queue=queue,
        processor=processor,
        models=models,
        installer=installer,
        tensors=tensors,
        leases=LeaseKeeper(queue),
        invocation_cache=invocation_cache,
        boards=BoardService(db),
        board_images=BoardImageService(db),
        client_state=ClientStateService(db),
        workflows=WorkflowService(db),
        warm_up=WarmUp(queue, [manager for _, manager in workers], processor, events),
        relay=relay,
        database_url=config.database_url,
    )


def worker_managers(config: InvokeAIAppConfig, models: ModelManager) -> list[tuple[str, ModelManager]]:
    """A model manager per generation device, each named for its worker, all on the one shared RAM cache."""
    devices = choose_generation_devices(config.generation_devices, config.device)
    return [
        (name, models.for_device(device, choose_dtype(config.precision, device)))
        for name, device in zip(worker_names(devices), devices, strict=True)
    ]


def build_model_manager(
    config: InvokeAIAppConfig, records: ModelRecordService, events: EventBus | None = None
) -> ModelManager:
    device = choose_device(config.device)
    cache = ModelCache(
        max_cache_ram_bytes=int(config.max_cache_ram_gb * GIGABYTE),
        execution_device=device,
        device_working_mem_bytes=int(config.device_working_mem_gb * GIGABYTE),
    )
    return ModelManager(records, cache, device, choose_dtype(config.precision, device), events=events)
