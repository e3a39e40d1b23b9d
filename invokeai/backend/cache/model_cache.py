"""The model cache: models loaded on demand and kept in RAM up to a byte limit (least recently used evicted first),
and put on an execution device for a node after its working memory has been reserved there.

One cache serves every session worker: the RAM copy is shared, so a model is read from disk once whatever the
number of workers. Each device holds its own copy, made from the RAM copy (`device_copy`), so that one worker's
move to its GPU never takes the model away from another worker; an offload drops that device's copy, and the RAM
copy stays. On the CPU the RAM copy is the device copy.

A node asks `on_device(key, loader, working_memory_bytes)` with an estimate from `working_memory.ESTIMATORS`; the
cache reserves max(estimate, device_working_mem_bytes) on top of the model itself by offloading other models from
that device, least recently used first, until the device reports that much free. Models stay on the device after the
node (the next node often needs the same one) until a reservation needs the room. On the CPU nothing moves. The RAM
limit counts the RAM copies, which stay while a device holds a copy.

Thread-safe: one lock guards the bookkeeping; a model in use by a node is never evicted or offloaded. A read from
disk runs outside that lock, under a lock of its own key: a model is read once however many threads ask for it, and a
read in progress (the warm-up's, say) holds up nobody who needs another model or only the cache's bookkeeping (a
worker claiming its next item, a node whose model is held already).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

logger = logging.getLogger(__name__)

Loader = Callable[[], torch.nn.Module]


def model_bytes(model: torch.nn.Module) -> int:
    """Parameter and buffer bytes (quantized parameters count their packed bytes)."""
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


# Device queries, module-level so tests can stand in for a GPU on a CPU-only machine.
def reserves_device_memory(device: torch.device) -> bool:
    """Devices whose memory the cache manages; on others (CPU, MPS's unified memory) models run where they are."""
    return device.type == "cuda"


def device_free_bytes(device: torch.device) -> int:
    """What a new allocation can use: free memory on the device plus blocks PyTorch's allocator holds unused."""
    free, _total = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def release_cached_blocks(device: torch.device) -> None:
    """Return the allocator's unused blocks to the driver, so the next free-memory reading sees offloaded models."""
    torch.cuda.empty_cache()


def shares_ram_copy(device: torch.device) -> bool:
    """Devices that run a model where the RAM copy is, without a copy of their own."""
    return device.type == "cpu"


def device_copy(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of `model` whose parameters and buffers are on `device`; `model` itself is left where it is. The
    tensors are copied straight to the device (a deepcopy's memo maps each one to its device copy), so the copy
    costs no second RAM copy on the way."""
    memo: dict[int, Any] = {}
    for parameter in model.parameters():
        if id(parameter) not in memo:
            memo[id(parameter)] = torch.nn.Parameter(
                parameter.detach().to(device, copy=True), requires_grad=parameter.requires_grad
            )
    for buffer in model.buffers():
        if id(buffer) not in memo:
            memo[id(buffer)] = buffer.detach().to(device, copy=True)
    return copy.deepcopy(model, memo)


def _indexed(device: torch.device | str) -> torch.device:
    """Parameters report an indexed CUDA device: compare like with like."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _device_of(model: torch.nn.Module) -> torch.device | None:
    first = next(iter((*model.parameters(), *model.buffers())), None)
    return None if first is None else first.device


@dataclass
class _Entry:
    model: torch.nn.Module  # the RAM copy, which every worker shares
    size: int
    # device -> the model on it; the CPU's is `model` itself.
    copies: dict[torch.device, torch.nn.Module] = field(default_factory=dict)
    in_use: int = 0
    dropped: bool = False  # asked to leave while in use: it leaves when its last user releases it


class ModelCache:
    def __init__(self, max_cache_ram_bytes: int, execution_device: torch.device, device_working_mem_bytes: int) -> None:
        self.max_cache_ram_bytes = max_cache_ram_bytes
        device = _indexed(execution_device)
        self.execution_device = device
        self.device_working_mem_bytes = device_working_mem_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._lock = threading.RLock()
        self._reading: dict[str, threading.Lock] = {}  # key -> held while that key's model is read from disk
        self._hits = self._misses = self._evictions = self._offloads = 0
        self._last_reservation: dict[str, Any] | None = None
        self._devices: list[torch.device] = [device]  # every device a worker put models on

    # --- RAM ------------------------------------------------------------------------------------------------

    def load(self, key: str, loader: Loader) -> torch.nn.Module:
        """The model under `key`, loaded by `loader` on a miss. A model larger than the whole cache is returned but
        not kept; otherwise the least recently used models that are not in use are evicted until it fits."""
        return self._load_entry(key, loader).model

    def _load_entry(self, key: str, loader: Loader) -> _Entry:
        with self._lock:
            entry = self._hit(key)
            if entry is not None:
                return entry
            reading = self._reading.setdefault(key, threading.Lock())
        # Whoever reads first reads for everyone asking for this key meanwhile; the others find it held after.
        with reading:
            with self._lock:
                entry = self._hit(key)
                if entry is not None:
                    return entry
                self._misses += 1
            try:
                model = loader()
            except BaseException:
                with self._lock:
                    self._reading.pop(key, None)
                raise
            entry = _Entry(model, model_bytes(model))
            where = _device_of(model)
            if where is not None and where.type != "cpu":
                entry.copies[where] = model  # a loader that put it on a device: that copy is the only one
            with self._lock:
                # Held (or refused) before the key's read lock goes: a thread that asks after finds it, never reads.
                self._reading.pop(key, None)
                if self._make_room(entry.size):
                    self._entries[key] = entry
                else:
                    logger.info(
                        "model %s (%d MiB) does not fit in the model cache; it is not kept", key, entry.size >> 20
                    )
            return entry

    def _hit(self, key: str) -> _Entry | None:
        # Under self._lock.
        entry = self._entries.get(key)
        if entry is not None:
            self._hits += 1
            self._entries.move_to_end(key)
        return entry

    def _make_room(self, size: int) -> bool:
        if size > self.max_cache_ram_bytes:
            return False
        for key in list(self._entries):
            if self._cached_bytes() + size <= self.max_cache_ram_bytes:
                break
            if self._entries[key].in_use == 0:
                del self._entries[key]
                self._evictions += 1
        return self._cached_bytes() + size <= self.max_cache_ram_bytes

    def free_bytes(self) -> int:
        """RAM the cache can still take without evicting anything."""
        with self._lock:
            return max(0, self.max_cache_ram_bytes - self._cached_bytes())

    def holds(self, key: str) -> bool:
        with self._lock:
            return key in self._entries

    def drop(self, prefix: str) -> int:
        """Remove every model whose key starts with `prefix` (the components of a deleted model), freeing its RAM
        and device memory now rather than when it would be least recently used. A model in use leaves when its
        node releases it. Returns how many models were removed now."""
        with self._lock:
            removed = 0
            for key in [key for key in self._entries if key.startswith(prefix)]:
                entry = self._entries[key]
                if entry.in_use:
                    entry.dropped = True
                else:
                    del self._entries[key]
                    removed += 1
        if removed:
            for device in self._devices:
                if reserves_device_memory(device):
                    release_cached_blocks(device)
        return removed

    def _cached_bytes(self) -> int:
        return sum(entry.size for entry in self._entries.values())

    # --- execution device -----------------------------------------------------------------------------------

    @contextmanager
    def on_device(
        self, key: str, loader: Loader, working_memory_bytes: int, device: torch.device | None = None
    ) -> Iterator[torch.nn.Module]:
        """The model on `device` (the execution device unless given: a worker passes its own), with
        max(working_memory_bytes, the floor) reserved beside it."""
        device = self.execution_device if device is None else _indexed(device)
        loaded = self._load_entry(key, loader)  # read from disk outside the lock (see the module docstring)
        with self._lock:
            if device not in self._devices:
                self._devices.append(device)
            # Evicted between the read and here (by another thread's load): this call still runs the copy it got.
            entry = self._entries.get(key, loaded)
            reserved = max(working_memory_bytes, self.device_working_mem_bytes)
            on_device = device in entry.copies
            needed = reserved + (0 if on_device else entry.size)
            short = self._reserve(device, entry, needed) if reserves_device_memory(device) else 0
            if not on_device:
                entry.copies[device] = entry.model if shares_ram_copy(device) else device_copy(entry.model, device)
            model = entry.copies[device]
            self._last_reservation = {
                "key": key,
                "device": str(device),
                "working_memory_bytes": working_memory_bytes,
                "floor_bytes": self.device_working_mem_bytes,
                "reserved_bytes": reserved,
                "short_bytes": short,
            }
            entry.in_use += 1
        try:
            yield model
        finally:
            with self._lock:
                entry.in_use -= 1
                if entry.dropped and not entry.in_use and self._entries.get(key) is entry:
                    del self._entries[key]

    def _reserve(self, device: torch.device, wanted: _Entry, needed: int) -> int:
        """Offload models other than `wanted` from `device` (not in use, least recently used first) until `needed`
        bytes are free there; returns how many bytes are still missing (0 when the reservation holds)."""
        free = device_free_bytes(device)
        for entry in list(self._entries.values()):
            if free >= needed:
                break
            # in_use counts every worker's use: a model another device's worker holds is spared as well, which
            # costs at most a later offload, never a model pulled from under a running node.
            if entry is wanted or device not in entry.copies or entry.in_use:
                continue
            del entry.copies[device]  # the RAM copy stays for every other worker
            self._offloads += 1
            release_cached_blocks(device)
            free = device_free_bytes(device)
        if free < needed:
            logger.warning(
                "only %d MiB free on %s for a reservation of %d MiB after offloading every idle model",
                free >> 20,
                device,
                needed >> 20,
            )
        return max(0, needed - free)

    # --- reporting ------------------------------------------------------------------------------------------

    def stats(self, device: torch.device | None = None) -> dict[str, Any]:
        """What is cached; `on_device` is about `device` (the execution device unless given)."""
        device = self.execution_device if device is None else _indexed(device)
        with self._lock:
            return {
                "resident": [
                    {"key": key, "size": entry.size, "on_device": device in entry.copies, "in_use": entry.in_use > 0}
                    for key, entry in self._entries.items()
                ],
                "resident_bytes": self._cached_bytes(),
                "max_cache_ram_bytes": self.max_cache_ram_bytes,
                "execution_device": str(device),
                "hits": self._hits,
                "misses": self._misses,
                "evictions": self._evictions,
                "offloads": self._offloads,
                "last_reservation": dict(self._last_reservation) if self._last_reservation else None,
            }
