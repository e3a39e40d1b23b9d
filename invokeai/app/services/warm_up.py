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
- After each module, its first calls: one forward of each operation the family runs it for (its calibration runs,
  `Family.runs`) at a small shape (FIRST_CALL_PIXELS, FIRST_CALL_TOKENS), on the worker's device. The first call of a
  module pays once per process for what torch and its kernels set up lazily (the kernels' first dispatch, oneDNN's
  primitives and weight formats, the allocator's first pages): measured 0.02-0.04 s a module for the demo models on
  this CPU, which the first item would pay otherwise.
- It stops at the first sign of real work (an enqueue, or a worker running an item), between two loads, or inside a
  first call, at the next submodule it enters: a node then loads what it needs itself. A load the warm-up began is
  finished once, and only the node that needs that very model waits for it (the cache reads a model outside its
  lock, under that model's own).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch

from invokeai.app.services.events import BatchEnqueuedEvent, EventBase, EventBus
from invokeai.app.services.model_manager import ModelManager
from invokeai.app.services.model_records import ModelNotFoundError, ModelRecord
from invokeai.app.services.session_processor import SessionProcessor
from invokeai.app.services.session_queue import SessionQueue
from invokeai.backend.attention import attention_caller
from invokeai.backend.cache.component_runs import component_run
from invokeai.backend.families import get_family

logger = logging.getLogger(__name__)

# How far back the warm-up looks: the models of the last RECENT_ITEMS completed items, at most MAX_MODELS of them.
RECENT_ITEMS = 10
MAX_MODELS = 3
# The first calls' shape: small, so that they take milliseconds on a full-size model too (what they set up once per
# process does not depend on the shape), and large enough for every family's latent scale and patch size.
FIRST_CALL_PIXELS = 64
# And a short text: the families' runs default to their full padded length (512 tokens for some).
FIRST_CALL_TOKENS = 32
# What the warm-up's attention calls are counted under (GET /api/v1/app/attention): not a node, but not hidden.
FIRST_CALL_NODE = "warm-up"


class _Preempted(Exception):
    """Raised inside a first call when real work arrived: the forward stops at the next submodule."""


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
        loaded, skipped, called = [], [], []
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
                        if held and component in family.module_components:
                            called += self._first_calls(manager, record, component)
        except _Preempted:
            logger.info(
                "Warm-up: stopped for real work after %.1f s (loaded: %s; first calls: %s)",
                time.perf_counter() - started,
                ", ".join(dict.fromkeys(loaded)) or "nothing",
                ", ".join(called) or "none",
            )
            return
        logger.info(
            "Warm-up: loaded %s and made the first calls of %s in %.1f s%s",
            ", ".join(dict.fromkeys(loaded)) or "nothing",
            ", ".join(called) or "nothing",
            time.perf_counter() - started,
            f"; left out (no room in the model cache without evicting): {', '.join(skipped)}" if skipped else "",
        )

    def _first_calls(self, manager: ModelManager, record: ModelRecord, component: str) -> list[str]:
        """One forward of each operation that runs `component` (see the module docstring), on `manager`'s device;
        the operations called. Raises _Preempted when real work arrives meanwhile."""
        family = get_family(record.family)
        facts = {
            "width": FIRST_CALL_PIXELS,
            "height": FIRST_CALL_PIXELS,
            "batch": 1,
            "prompt_tokens": FIRST_CALL_TOKENS,
        }
        called = []
        for operation in (op for op, runs in family.operations.items() if runs == component and op in family.runs):
            if self._yields():
                raise _Preempted
            try:
                with manager.on_device(record, operation, **facts) as module:
                    run = component_run(record.family, operation, module, manager.facts(**facts))
                    hook = torch.nn.modules.module.register_module_forward_pre_hook(self._stop_inside)
                    try:
                        with torch.inference_mode(), attention_caller(FIRST_CALL_NODE, str(manager.device)):
                            run()
                    finally:
                        hook.remove()
            except _Preempted:
                raise
            except Exception as error:  # only time is at stake: the node makes the call itself
                logger.warning("Warm-up: the first call of %s %s failed: %s", record.name, operation, error)
                continue
            called.append(f"{record.name}/{operation}")
        return called

    def _stop_inside(self, module: torch.nn.Module, args: Any) -> None:
        # Every module's forward, in every thread, while a first call runs: only the warm-up's own call is stopped.
        if threading.current_thread() is self._thread and self._yields():
            raise _Preempted
