"""The invocation cache: node outputs kept in memory, so that a node that runs again with the same inputs is not run.

A node whose `use_cache` is true gets its output from here when a node of its type ran before with the same input
values (those of its edges filled in), as InvokeAI's MemoryInvocationCache does. The cache is bounded by
`node_cache_size` outputs, the least recently used going first; 0 turns it off.

What an output names must still be there when a later item takes it from the cache:
- Tensors (latents, conditioning) are per item: the session processor deletes a session's tensors when its item
  ends. The cache pins the tensors an output names (TensorStore.pin) while it keeps the output, and an item that
  takes the output holds them until it ends (TensorStore.hold). The pinned tensors are bounded too, by bytes: at
  most half of the tensor store, the oldest outputs going first.
- Images can be deleted by any client, and each run of an image node is meant to make an image of its own (with
  its item's metadata): an output that holds an image is never kept. (InvokeAI keeps them and drops them when their
  image is deleted.)
- Models: a node that names a model by its name would get the output of another model installed under that name
  later. The cache is emptied whenever the model records change (added, removed, renamed), which every item checks
  before it runs (one read of the models table, shared by every server on the database).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from invokeai.app.nodes.base import BaseInvocation, BaseInvocationOutput, ImageField
from invokeai.app.services.database import Database
from invokeai.app.services.tensors import TensorStore

logger = logging.getLogger(__name__)

DEFAULT_NODE_CACHE_SIZE = 512  # InvokeAI's default
# A tensor store name (uuid4().hex); only strings of this form are looked up in the store.
_TENSOR_NAME = re.compile(r"^[0-9a-f]{32}$")
# Fields of every node that say how it is run, not what it computes.
_NOT_INPUTS = frozenset({"id", "is_intermediate", "use_cache"})


class InvocationCacheStatus(BaseModel):
    size: int = Field(description="How many node outputs the cache holds.")
    hits: int = Field(description="Nodes whose output came from the cache, since the start or the last clear.")
    misses: int = Field(description="Nodes with use_cache that were run, finding no output in the cache.")
    enabled: bool = Field(description="Whether the cache is used: node_cache_size is above 0 and it is not disabled.")
    max_size: int = Field(description="The most outputs it holds (node_cache_size).")
    pinned_bytes: int = Field(
        0, description="The bytes of the tensors that the cached outputs name (kept in the tensor store for them)."
    )


@dataclass
class _Entry:
    output: BaseInvocationOutput
    tensors: tuple[str, ...]  # the tensor store entries the output names, pinned while it is cached


def cache_key(node: BaseInvocation) -> str:
    """The node's type and input values (after its edges are filled in) as a digest: equal for two nodes that
    compute the same output, whatever their ids or how they are marked."""
    data = node.model_dump(mode="json", exclude=set(_NOT_INPUTS))
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _holds_image(value: Any) -> bool:
    if isinstance(value, ImageField):
        return True
    if isinstance(value, BaseModel):
        return any(_holds_image(getattr(value, name)) for name in type(value).model_fields)
    if isinstance(value, dict):
        return any(_holds_image(item) for item in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_image(item) for item in value)
    return False


def models_version_of(db: Database) -> Callable[[], str]:
    """A function that reads the model records' version: a digest of every record's key, name and update time, so
    that an install, a removal or a rename (on any server of the database) changes it."""

    def version() -> str:
        digest = hashlib.sha256()
        for row in db.execute("SELECT key, name, updated_at FROM models ORDER BY key"):
            digest.update(f"{row['key']}\0{row['name']}\0{row['updated_at']}\n".encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    return version


class InvocationCache:
    """Thread-safe: every session worker uses the one cache of its server."""

    def __init__(
        self,
        max_size: int = DEFAULT_NODE_CACHE_SIZE,
        tensors: TensorStore | None = None,
        models_version: Callable[[], str] | None = None,
        max_pinned_bytes: int | None = None,
    ) -> None:
        """models_version: a value that changes whenever the model records change (see models_version_of).
        max_pinned_bytes: the most bytes of tensors that cached outputs may pin; by default half of the store."""
        self.max_size = max_size
        self._tensors = tensors
        self._models_version = models_version
        self._models_seen: str | None = None
        if max_pinned_bytes is None:
            max_pinned_bytes = tensors.max_bytes // 2 if tensors is not None else 0
        self.max_pinned_bytes = max_pinned_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._disabled = False
        self._hits = 0
        self._misses = 0
        self._lock = threading.Lock()
        if tensors is not None and max_size > 0:
            tensors.on_pinned_full(self._release_pins)

    @property
    def active(self) -> bool:
        """Whether nodes should look here at all (node_cache_size above 0 and not disabled)."""
        return self.max_size > 0 and not self._disabled

    def check_models(self) -> None:
        """Before an item runs: empty the cache if the model records changed since the last look (a name may now
        name another model)."""
        if not self.active or self._models_version is None:
            return
        try:
            version: str | None = self._models_version()
        except Exception:
            # Without the records' version a cached output may be another model's: keep none.
            logger.warning("Could not read the model records' version; the invocation cache is emptied", exc_info=True)
            version = None
        with self._lock:
            if (version is None or version != self._models_seen) and self._entries:
                logger.info("The model records changed: the invocation cache drops its %d outputs", len(self._entries))
                self._drop_all()
            self._models_seen = version

    def get(self, key: str, holder: str | None = None) -> BaseInvocationOutput | None:
        """The cached output for `key` (a copy), or None (a miss). `holder` (the session) holds the output's tensors
        until its item ends, so that they outlive the output's eviction meanwhile."""
        with self._lock:
            if not self.active:
                return None
            entry = self._entries.get(key)
            if entry is not None and entry.tensors and self._tensors is not None:
                tensors = self._tensors
                held = (
                    tensors.hold(entry.tensors, holder)
                    if holder is not None
                    else all(name in tensors for name in entry.tensors)
                )
                if not held:
                    self._evict(key)  # a tensor was deleted outright: the output is of no use any more
                    entry = None
            if entry is None:
                self._misses += 1
                return None
            self._hits += 1
            self._entries.move_to_end(key)
            return entry.output.model_copy(deep=True)

    def save(self, key: str, output: BaseInvocationOutput) -> bool:
        """Keep the output under `key`, unless it holds an image; True if it was kept."""
        if not self.active or _holds_image(output):
            return False
        names = self._tensor_names(output)
        size = sum(self._tensors.size_of(name) for name in names) if self._tensors is not None else 0
        if size > self.max_pinned_bytes:
            return False
        with self._lock:
            if not self.active or key in self._entries:
                return False
            if names and (self._tensors is None or not self._tensors.pin(names)):
                return False  # a tensor it names is gone already: nothing to keep
            self._entries[key] = _Entry(output.model_copy(deep=True), names)
            while len(self._entries) > self.max_size:
                self._evict(next(iter(self._entries)))
            if self._tensors is not None:
                while self._tensors.pinned_bytes > self.max_pinned_bytes and len(self._entries) > 1:
                    self._evict(next(iter(self._entries)))
        return True

    def _tensor_names(self, output: BaseInvocationOutput) -> tuple[str, ...]:
        """The tensor store entries the output names: any string of its that is the name of one."""
        if self._tensors is None:
            return ()
        dumped = output.model_dump(mode="json")
        found = dict.fromkeys(s for s in _strings(dumped) if _TENSOR_NAME.match(s) and s in self._tensors)
        return tuple(found)

    def _evict(self, key: str) -> None:
        """Under the lock."""
        entry = self._entries.pop(key, None)
        if entry is not None and entry.tensors and self._tensors is not None:
            self._tensors.unpin(entry.tensors)

    def _drop_all(self) -> None:
        """Under the lock."""
        while self._entries:
            self._evict(next(iter(self._entries)))

    def _release_pins(self, needed: int) -> None:
        """The tensor store has no room for `needed` bytes beside the pinned tensors: drop the oldest outputs that
        pin tensors until it has."""
        tensors = self._tensors
        if tensors is None:
            return
        with self._lock:
            for key in [key for key, entry in self._entries.items() if entry.tensors]:
                if tensors.pinned_bytes + needed <= tensors.max_bytes:
                    return
                self._evict(key)

    def clear(self) -> None:
        """Drop every output and reset the counts (DELETE /api/v1/app/invocation_cache)."""
        with self._lock:
            if self.max_size == 0:
                return
            self._drop_all()
            self._hits = 0
            self._misses = 0

    def enable(self) -> None:
        with self._lock:
            if self.max_size > 0:
                self._disabled = False

    def disable(self) -> None:
        """Stop using the cache; what it holds stays for a later enable, as InvokeAI's does."""
        with self._lock:
            if self.max_size > 0:
                self._disabled = True

    def status(self) -> InvocationCacheStatus:
        with self._lock:
            return InvocationCacheStatus(
                size=len(self._entries),
                hits=self._hits,
                misses=self._misses,
                enabled=self.active,
                max_size=self.max_size,
                pinned_bytes=self._tensors.pinned_bytes if self._tensors is not None else 0,
            )
