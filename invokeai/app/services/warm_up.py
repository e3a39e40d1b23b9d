"""The warm-up: after a restart, the models the last items used are made ready before anyone asks for them.

Where the first item after a restart spent its time (docs/performance.md, "The first image"): importing diffusers
and transformers (seconds of CPU, far more than reading a small model), then reading each component. So:

- Before the server serves (`prepare`), the classes of the models that the last completed items named are imported
  (no weights read): an item enqueued the moment the server answers finds them imported. A queue with no completed
  item (the first start after the demo install) names none: then the classes of one model per installed family
  are imported, and no weights are guessed at. A server with no model imports nothing.
- Once the server serves (`start`), a background thread loads the recent models' components into the RAM cache,
  the most recent item's models first, each only where it fits beside what the cache holds (nothing is evicted for
  a guess). Tokenizers and schedulers come first: they are read in milliseconds, and a scheduler's first read
  imports every scheduler class diffusers lists as compatible with it.
- Not its modules' first calls: made here, in the warm-up's thread, they were measured not to shorten the first
  item's calls in its worker's thread, and they took the time the warm-up had for reading what the item needs
  (docs/performance.md, "Issue 26 §3").
- It stops at the first sign of real work (an enqueue, or a worker running an item), between two loads: a node then
  loads what it needs itself. A load the warm-up began is finished once, and only a node that needs that very model
  waits for it (the cache reads a model outside its lock, under that model's own).
"""

from __future__ import annotations

import logging
import threading
import time

from invokeai.app.services.events import BatchEnqueuedEvent, EventBase, EventBus
from invokeai.app.services.model_manager import ModelManager
from invokeai.app.services.model_records import ModelNotFoundError, ModelRecord
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import SessionQueue
from invokeai.backend.families import get_family

logger = logging.getLogger(__name__)

# How far back the warm-up looks: the models of the last RECENT_ITEMS completed items, at most MAX_MODELS of them.
RECENT_ITEMS = 10
MAX_MODELS = 3


class _Preempted(Exception):
    """Real work arrived: the background load stops."""


class WarmUp:
    def __init__(
        self, queue: SessionQueue, managers: list[ModelManager], processor: SessionProcessor, events: EventBus
    ) -> None:
        """managers: each worker's model manager (modules go into their shared RAM cache once; tokenizers and
        schedulers, which each worker keeps its own of, into each)."""
        self._queue = queue
        self._managers = managers
        self._processor = processor
        self._records: list[ModelRecord] = []
        self._real_work = threading.Event()
        self._thread: threading.Thread | None = None
        events.add_listener(self._on_enqueued, frozenset({BatchEnqueuedEvent.event_name}))

    def _on_enqueued(self, event: EventBase) -> None:
        self._real_work.set()

    def recent_records(self) -> list[ModelRecord]:
        """The installed models that the last completed items named, most recent first (a model since deleted, or
        is left out)."""
        if not self._managers:
            return []
        manager = self._managers[0]
        records: dict[str, ModelRecord] = {}
        for token in self._queue.recent_models(RECENT_ITEMS):
            kind, _, value = token.partition(":")
            try:
                record = manager.records.get(value) if kind == "key" else manager.records.get_by_name(value)
            except ModelNotFoundError:
                continue
            records.setdefault(record.key, record)
            if len(records) == MAX_MODELS:
                break
        return list(records.values())

    def installed_families(self) -> list[ModelRecord]:
        """One pipeline per installed family (the first by name): what a server whose queue never completed an item
        (a first start after the demo install, say) imports for, not knowing which model it will be asked for."""
        if not self._managers:
            return []
        chosen: dict[str, ModelRecord] = {}
        for record in self._managers[0].records.list(type="main"):
            chosen.setdefault(record.family, record)
        return list(chosen.values())

    def prepare(self) -> None:
        """Before serving: import what the recent models load with (without a recent one: what every installed
        family loads with). Failures are logged, never fatal: the warm-up only saves time."""
        try:
            self._records = self.recent_records()
            importing = self._records or self.installed_families()
        except Exception:
            logger.exception("Warm-up: could not read the recent items' models")
            return
        if not importing:
            return
        started = time.perf_counter()
        families = set()
        for record in importing:
            if record.family in families:
                continue  # the same family's classes: imported already
            families.add(record.family)
            try:
                self._managers[0].import_libraries(record)
            except Exception as error:  # a model that cannot load fails in its node, with its reason
                logger.warning("Warm-up: could not import the classes of %s: %s", record.name, error)
        logger.info(
            "Warm-up: imported the libraries of %s in %.1f s (%s)",
            ", ".join(record.name for record in importing),
            time.perf_counter() - started,
            "the models the last items used" if self._records else "no item completed yet: one model per family",
        )

    def start(self) -> None:
        """Once serving: load the recent models in the background, until real work arrives."""
        if not self._records:
            return
        self._thread = threading.Thread(target=self._load, name="warm-up", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background load to end; whether it has."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self._real_work.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _yields(self) -> bool:
        return self._real_work.is_set() or self._processor.busy

    def _load(self) -> None:
        started = time.perf_counter()
        loaded, skipped = [], []
        try:
            for record in self._records:
                family = get_family(record.family)
                # Tokenizers and schedulers first (see the module docstring), then the modules in the family's order.
                components = sorted(
                    self._managers[0].components(record), key=lambda name: name in family.module_components
                )
                for component in components:
                    for index, manager in enumerate(self._managers):
                        if self._yields():
                            raise _Preempted
                        if index and component in family.module_components:
                            continue  # modules: one RAM copy for every worker
                        try:
                            held = manager.preload(record, component)
                        except Exception as error:  # its node fails with the reason, if it runs
                            logger.warning("Warm-up: could not load %s %s: %s", record.name, component, error)
                            held = False
                        (loaded if held else skipped).append(f"{record.name}/{component}")
        except _Preempted:
            logger.info(
                "Warm-up: stopped for real work after %.1f s (loaded: %s)",
                time.perf_counter() - started,
                ", ".join(dict.fromkeys(loaded)) or "nothing",
            )
            return
        logger.info(
            "Warm-up: loaded %s in %.1f s%s",
            ", ".join(dict.fromkeys(loaded)) or "nothing",
            time.perf_counter() - started,
            f"; left out (no room in the model cache without evicting): {', '.join(skipped)}" if skipped else "",
        )
