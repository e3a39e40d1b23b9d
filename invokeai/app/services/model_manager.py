"""What nodes use to get models: resolve a graph's model identifier to a record, load a component through the model
cache, and hold it on the execution device with its working memory reserved."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, Field

from invokeai.app.logging_setup import route_ml_library_logging
from invokeai.app.services.events import EventBus, ModelLoadCompleteEvent, ModelLoadStartedEvent
from invokeai.app.services.model_configs import model_config
from invokeai.app.services.model_records import (
    ModelIdentifier,
    ModelNotFoundError,
    ModelRecord,
    ModelRecordService,
    model_token,
)
from invokeai.backend.cache.model_cache import ModelCache
from invokeai.backend.cache.working_memory import CallFacts, estimate_working_memory
from invokeai.backend.families import get_family
from invokeai.backend.models.errors import UnsupportedModelError
from invokeai.backend.models.loaders import (
    architecture,
    comparable_config,
    components_of,
    config_defaults,
    expected_bytes,
    import_classes,
    load_component,
    pipeline_options,
)
from invokeai.backend.models.probe import ProbeResult


def probe_of(record: ModelRecord) -> ProbeResult:
    """The record as the backend loaders take it; the installer probed the files, so they are not read again."""
    return ProbeResult(
        path=Path(record.path),
        family=record.family,
        type=record.type,
        format=record.format,
        config_variant=record.config_variant,
        size=record.size,
    )


class ModelFilesMissingError(RuntimeError):
    """A recorded model whose files this host cannot see: with several servers on one database the records are
    shared, and each host must see the files at the recorded path (a shared models_dir, docs/scale.md)."""

    def __init__(self, record: ModelRecord, path: str | Path) -> None:
        super().__init__(
            f"model {record.name!r}: {path} cannot be read on host {socket.gethostname()}; every server needs the "
            f"model's files at the path in its record (a models_dir that every host mounts at the same path)"
        )
        self.path = str(path)


def cache_key(record: ModelRecord, component: str) -> str:
    return f"{record.key}:{component}"


@contextmanager
def _files_of(record: ModelRecord) -> Iterator[None]:
    """Reading the model's files: one missing here (a file inside a folder this host sees only in part) is
    ModelFilesMissingError, naming the host and the file, not a bare FileNotFoundError from a loader."""
    try:
        yield
    except FileNotFoundError as error:
        raise ModelFilesMissingError(record, error.filename or record.path) from error


class CachedModel(BaseModel):
    """A model component in the shared RAM cache, as one worker's device sees it."""

    key: str = Field(description="The model's key (GET /api/v2/models/).")
    name: str | None = Field(description="The model's name; null once its record is gone.")
    component: str = Field(description="The component, e.g. unet, text_encoder, vae, transformer.")
    on_device: bool = Field(description="Whether this worker's device holds it now (on the CPU: the RAM copy).")
    size_bytes: int = Field(description="Bytes of its parameters and buffers.")


class ModelManager:
    def __init__(
        self,
        records: ModelRecordService,
        cache: ModelCache,
        device: torch.device,
        dtype: torch.dtype,
        *,
        events: EventBus | None = None,
    ) -> None:
        self.records = records
        self.cache = cache
        self.device = device
        self.dtype = dtype
        # Where model_load_started / model_load_complete go (InvokeAI's events), when a component is read from disk.
        self.events = events
        # Tokenizers and schedulers: small and not modules, so the cache (which prices and moves modules) does not
        # take them; kept here so that a node does not read them from disk at every run.
        self._small: dict[str, Any] = {}
        self._small_lock = threading.Lock()
        # Tokenizers are not safe to use from two threads at once (a fast tokenizer's padding settings are
        # mutated per call), so each worker's manager keeps its own, under its own suffix of the shared dict.
        self._small_suffix = ""
        self._workers = 0

    def for_device(self, device: torch.device, dtype: torch.dtype) -> ModelManager:
        """A manager for one worker: the same records, RAM cache and tokenizers, its own execution device."""
        manager = ModelManager(self.records, self.cache, device, dtype, events=self.events)
        manager._small = self._small
        manager._small_lock = self._small_lock
        with self._small_lock:
            self._workers += 1
            manager._small_suffix = f"@{self._workers}"
        return manager

    def cached_models(self) -> list[CachedModel]:
        """Every module in the RAM cache, and whether this manager's device holds it."""
        return self._described(self.cache.stats(self.device)["resident"])

    def _described(self, resident: list[dict[str, Any]]) -> list[CachedModel]:
        names = {record.key: record.name for record in self.records.list()} if resident else {}
        found = []
        for entry in resident:
            key, _, component = entry["key"].rpartition(":")
            found.append(
                CachedModel(
                    key=key,
                    name=names.get(key),
                    component=component,
                    on_device=entry["on_device"],
                    size_bytes=entry["size"],
                )
            )
        return found

    def models_on_device(self) -> frozenset[str]:
        """The models with a component on this device, as tokens (model_token): by key and by name, since a graph
        may name a model either way. What a worker prefers its next item to use."""
        # Asked at every claim: the records are read only when the device holds something.
        on_device = [entry for entry in self.cache.stats(self.device)["resident"] if entry["on_device"]]
        tokens = set()
        for model in self._described(on_device):
            tokens.add(model_token(key=model.key))
            if model.name is not None:
                tokens.add(model_token(name=model.name))
        return frozenset(tokens)

    def resolve(self, ident: ModelIdentifier) -> ModelRecord:
        """The record a graph's model field names. ModelNotFoundError says which key or name is missing;
        ModelFilesMissingError that this host cannot see its files."""
        if ident.key is not None:
            record = self.records.get(ident.key)
        else:
            assert ident.name is not None  # ModelIdentifier guarantees one of them
            record = self.records.get_by_name(ident.name)
        self._probe(record)
        return record

    def _probe(self, record: ModelRecord) -> ProbeResult:
        """probe_of(record), once its path is known to be there on this host."""
        probe = probe_of(record)
        if not probe.path.exists():
            raise ModelFilesMissingError(record, probe.path)
        return probe

    def components(self, record: ModelRecord) -> list[str]:
        return list(components_of(probe_of(record)))

    def _loader(self, record: ModelRecord, component: str) -> Any:
        # Loaded on the CPU in the execution dtype: the cache keeps it in RAM and moves it to the device on demand.
        def load() -> Any:
            route_ml_library_logging()
            # Only a read from disk is announced: a component the cache holds is not loaded again.
            config = model_config(record) if self.events is not None else None
            if self.events is not None and config is not None:
                self.events.publish(ModelLoadStartedEvent(config=config, submodel_type=component))
            with _files_of(record):
                loaded = load_component(self._probe(record), component, device="cpu", dtype=self.dtype)
            if self.events is not None and config is not None:
                self.events.publish(ModelLoadCompleteEvent(config=config, submodel_type=component))
            return loaded

        return load

    def load(self, record: ModelRecord, component: str) -> Any:
        """A component of the model: a module (in RAM, from the cache), a tokenizer or a scheduler."""
        key = cache_key(record, component)
        # Modules are the cache's business (it prices and moves them); tokenizers and schedulers are not.
        if component in get_family(record.family).module_components:
            return self.cache.load(key, self._loader(record, component))
        key += self._small_suffix
        with self._small_lock:
            if key not in self._small:
                self._small[key] = self._loader(record, component)()
            return self._small[key]

    def load_files(self, record: ModelRecord, part: str, read: Callable[[Path], Any]) -> Any:
        """What a family reads from the model's files beside its components (Qwen-Image-Edit's processor/):
        `read(path)` of the model's folder or file, once, kept like its tokenizers under `part` until the model
        is forgotten."""
        key = cache_key(record, part) + self._small_suffix
        with self._small_lock:
            if key not in self._small:
                with _files_of(record):
                    self._small[key] = read(self._probe(record).path)
            return self._small[key]

    def import_libraries(self, record: ModelRecord) -> list[str]:
        """Import the classes the model's components load with, reading no weights (loaders.import_classes); the
        names of the classes."""
        route_ml_library_logging()
        with _files_of(record):
            return import_classes(self._probe(record))

    def preload(self, record: ModelRecord, component: str) -> bool:
        """Load the component into the RAM cache (a tokenizer or scheduler: into this manager's own) if it is not
        there and fits beside what the cache holds without evicting anything; whether it is held now."""
        key = cache_key(record, component)
        if component not in get_family(record.family).module_components:
            self.load(record, component)
            return True
        if self.cache.holds(key):
            return True
        with _files_of(record):
            expected = expected_bytes(self._probe(record), component, self.dtype)
        if expected > self.cache.free_bytes():
            return False
        self.cache.load(key, self._loader(record, component))
        return self.cache.holds(key)

    def config(self, record: ModelRecord, component: str) -> dict[str, Any]:
        """The component's config, read from the model's files: what an estimate needs, without loading the module
        (a model larger than the cache would otherwise be loaded twice, once for its config and once to run)."""
        with _files_of(record):
            return architecture(self._probe(record), component)

    def pipeline_options(self, record: ModelRecord) -> dict[str, Any]:
        """The model_index.json flags the model's family honours (its `pipeline_options`), as the stock pipeline
        reads them from the model's files: how its nodes run this model where the pipeline's config says so."""
        with _files_of(record):
            return pipeline_options(self._probe(record))

    def facts(self, **facts: Any) -> CallFacts:
        """The facts of one call on this manager's execution device and dtype (see CallFacts for the rest)."""
        return CallFacts(device=self.device, dtype=self.dtype, **facts)

    def working_memory(self, record: ModelRecord, operation: str, **facts: Any) -> int:
        """Bytes to reserve beside the module for one `operation` call (a key of the family's `operations`: a
        component, or vae_decode / vae_encode) with these CallFacts, priced under the installed attention policy.
        The config comes from the model's files, so a module not yet loaded is not loaded for its estimate."""
        component = get_family(record.family).component_of(operation)
        call = self.facts(**facts)
        estimate = estimate_working_memory(record.family, operation, self.config(record, component), call)
        return estimate.total(call.device, call.dtype)

    @contextmanager
    def on_device(self, record: ModelRecord, operation: str, **facts: Any) -> Iterator[torch.nn.Module]:
        """The module that `operation` runs, on the execution device for the duration of the block, with the
        working memory its estimator gives for `facts` free beside it (the cache offloads other models to make
        room)."""
        component = get_family(record.family).component_of(operation)
        reserve = self.working_memory(record, operation, **facts)
        key = cache_key(record, component)
        with self.cache.on_device(key, self._loader(record, component), reserve, self.device) as module:
            yield module

    def companion(self, record: ModelRecord, component: str) -> ModelRecord:
        """For a model that lacks `component` (a lone component file: a transformer, a VAE, a text encoder): the
        first pipeline of its family, by name, that has it and was made for the same architecture of what the model
        holds, so the text encoder and VAE fit the transformer, and the tokenizer the text encoder (a tiny demo
        transformer pairs with the demo pipeline, a full-size one with a full-size pipeline, whatever else is
        installed). Architectures are compared as `comparable_config` gives them: a transformers config written by
        another transformers version, or saved in another dtype, is still the same architecture."""
        # Compared with the class defaults filled in, from the model's own class for each component it holds.
        defaults = {held: config_defaults(probe_of(record), held) for held in self.components(record)}
        own = {held: self._architecture(record, held, defaults[held]) for held in self.components(record)}
        candidates = [
            other
            for other in self.records.list(family=record.family, type="main")
            if other.format == "diffusers" and component in self.components(other)
        ]
        if not candidates:
            raise ModelNotFoundError(
                f"model {record.name!r} has no {component}, and no {record.family} pipeline (diffusers) is installed "
                f"to take it from; install one, e.g. with install_demo_models"
            )
        for other in candidates:
            if all(
                mine is not None and self._architecture(other, held, defaults[held]) == mine
                for held, mine in own.items()
            ):
                return other
        raise ModelNotFoundError(
            f"model {record.name!r} has no {component}, and no installed {record.family} pipeline was made for its "
            f"{' and '.join(own)} (installed: {', '.join(other.name for other in candidates)}); install the pipeline "
            f"it belongs to, or name a model that has {component} in that node"
        )

    def _architecture(self, record: ModelRecord, component: str, defaults: dict[str, Any]) -> dict[str, Any] | None:
        try:
            return comparable_config({**defaults, **self.config(record, component)})
        except (OSError, ValueError, UnsupportedModelError):
            return None  # a config that cannot be read matches nothing: not a model to pair with

    def forget(self, record: ModelRecord) -> None:
        """Drop everything loaded of a deleted model: its modules leave the cache (RAM and device) at once, or when
        the node using one finishes; its tokenizers and schedulers go too."""
        prefix = f"{record.key}:"
        self.cache.drop(prefix)
        with self._small_lock:
            for key in [key for key in self._small if key.startswith(prefix)]:
                del self._small[key]
