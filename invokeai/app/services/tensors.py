"""Tensors passed between nodes (latents, prompt embeddings): kept in memory under a name that travels on edges.

Graph outputs must be JSON, so a node that produces a tensor saves it here and outputs the name; the next node
loads it by that name. Entries live on the CPU: a tensor left on the execution device between nodes would hold
memory that the model cache cannot see or free. Nodes save under their session as owner, and the session processor
deletes a session's entries when its item ends: nothing outside the item can load them (no API serves tensors).

The invocation cache keeps node outputs across items, and an output names its tensors: the cache pins them. A
pinned entry outlives its owners and is never dropped to make room; it goes when its last pin and its last owner
are gone. A session that takes an output from the cache holds its tensors as an owner too (`hold`), so that the
cache may drop the output meanwhile without pulling them from under the running item.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable

import torch

TensorLike = torch.Tensor | dict[str, torch.Tensor]

DEFAULT_MAX_BYTES = 2 * 1024**3


def _nbytes(obj: TensorLike) -> int:
    tensors = obj.values() if isinstance(obj, dict) else (obj,)
    return sum(t.numel() * t.element_size() for t in tensors)


def _to_cpu(obj: TensorLike) -> TensorLike:
    if isinstance(obj, dict):
        return {name: t.detach().to("cpu", copy=True) for name, t in obj.items()}
    return obj.detach().to("cpu", copy=True)


def _copy(obj: TensorLike) -> TensorLike:
    # Consumers get their own copy: an in-place op in one node must not change what another node loads.
    if isinstance(obj, dict):
        return {name: t.clone() for name, t in obj.items()}
    return obj.clone()


class TensorStore:
    """In memory, at most `max_bytes` in all; the least recently used entries that are not pinned are dropped to make
    room."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[TensorLike, int]] = OrderedDict()
        self._owned: dict[str, set[str]] = {}  # owner -> names
        self._owners: dict[str, set[str]] = {}  # name -> owners
        self._pins: dict[str, int] = {}  # name -> how many cached outputs name it
        self._bytes = 0
        self._pinned_bytes = 0
        self._lock = threading.Lock()
        # Asked to unpin (drop cached outputs) when only pinned entries stand between a save and the cap; called
        # without this store's lock held, since it calls back into the store.
        self._release_pins: Callable[[int], None] | None = None

    def on_pinned_full(self, release: Callable[[int], None]) -> None:
        """`release(needed)` is called when a save of `needed` bytes finds no room left but pinned entries': it
        should unpin until pinned_bytes + needed <= max_bytes (the invocation cache drops its oldest outputs)."""
        self._release_pins = release

    def save(self, obj: TensorLike, owner: str | None = None) -> str:
        """Store a tensor or a dict of tensors (copied to the CPU); returns its name (32 hex digits).
        With `owner`, `delete_owned(owner)` deletes it."""
        if not (
            isinstance(obj, torch.Tensor)
            or (
                isinstance(obj, dict)
                and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
            )
        ):
            raise TypeError(f"the tensor store holds a tensor or a dict of str -> tensor, not {type(obj).__name__}")
        size = _nbytes(obj)
        if size > self.max_bytes:
            raise ValueError(f"a {size}-byte entry does not fit in the tensor store ({self.max_bytes} bytes)")
        stored = _to_cpu(obj)
        name = uuid.uuid4().hex
        with self._lock:
            fits = self._pinned_bytes + size <= self.max_bytes
        if not fits and self._release_pins is not None:
            self._release_pins(size)
        with self._lock:
            if self._pinned_bytes + size > self.max_bytes:
                raise ValueError(
                    f"a {size}-byte entry does not fit in the tensor store ({self.max_bytes} bytes) beside the "
                    f"{self._pinned_bytes} bytes that cached node outputs keep"
                )
            self._make_room(size)
            self._entries[name] = (stored, size)
            self._bytes += size
            if owner is not None:
                self._owned.setdefault(owner, set()).add(name)
                self._owners[name] = {owner}
        return name

    def _make_room(self, size: int) -> None:
        """Drop the least recently used unpinned entries until `size` more bytes fit (the caller checked that the
        pinned ones leave room). Under the lock."""
        if self._bytes + size <= self.max_bytes:
            return
        for name in [name for name in self._entries if name not in self._pins]:
            self._remove(name)
            if self._bytes + size <= self.max_bytes:
                return

    def _remove(self, name: str) -> None:
        """Forget an entry and every owner and pin of it. Under the lock."""
        entry = self._entries.pop(name, None)
        if entry is not None:
            self._bytes -= entry[1]
        for owner in self._owners.pop(name, ()):
            names = self._owned.get(owner)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._owned[owner]
        if self._pins.pop(name, 0) and entry is not None:
            self._pinned_bytes -= entry[1]

    def _release(self, name: str) -> bool:
        """Delete an entry that no owner and no pin holds any more. Under the lock."""
        if name in self._pins or self._owners.get(name) or name not in self._entries:
            return False
        self._remove(name)
        return True

    def load(self, name: str) -> TensorLike:
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                raise KeyError(
                    f"tensor {name!r} not found: it was never saved, was deleted, or was dropped to keep the "
                    f"tensor store under {self.max_bytes} bytes"
                )
            self._entries.move_to_end(name)
        return _copy(entry[0])

    def delete(self, name: str) -> None:
        with self._lock:
            if name not in self._entries:
                raise KeyError(f"tensor {name!r} not found")
            self._remove(name)

    def delete_owned(self, owner: str) -> int:
        """Let go of every entry saved or held under `owner`: those that nothing else holds (no other owner, no
        pin) are deleted. Returns how many were deleted."""
        with self._lock:
            names = self._owned.pop(owner, set())
            deleted = 0
            for name in names:
                owners = self._owners.get(name)
                if owners is not None:
                    owners.discard(owner)
                    if not owners:
                        del self._owners[name]
                deleted += self._release(name)
        return deleted

    def hold(self, names: Iterable[str], owner: str) -> bool:
        """Make `owner` an owner of each named entry too (delete_owned(owner) lets go of them); False, holding
        nothing, if one of them is gone."""
        names = list(names)
        with self._lock:
            if any(name not in self._entries for name in names):
                return False
            for name in names:
                self._owned.setdefault(owner, set()).add(name)
                self._owners.setdefault(name, set()).add(owner)
        return True

    def pin(self, names: Iterable[str]) -> bool:
        """Pin each named entry once more: it is neither dropped to make room nor deleted with its owners until as
        many unpins. False, pinning nothing, if one of them is gone."""
        names = list(names)
        with self._lock:
            if any(name not in self._entries for name in names):
                return False
            for name in names:
                count = self._pins.get(name, 0)
                if count == 0:
                    self._pinned_bytes += self._entries[name][1]
                self._pins[name] = count + 1
        return True

    def unpin(self, names: Iterable[str]) -> None:
        """Undo one pin of each named entry; one that no pin and no owner holds any more is deleted."""
        with self._lock:
            for name in names:
                count = self._pins.get(name, 0)
                if count > 1:
                    self._pins[name] = count - 1
                elif count == 1:
                    del self._pins[name]
                    self._pinned_bytes -= self._entries[name][1]
                    self._release(name)

    def size_of(self, name: str) -> int:
        """The entry's size in bytes; 0 for a name that is not here."""
        with self._lock:
            entry = self._entries.get(name)
            return entry[1] if entry is not None else 0

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._entries

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes

    @property
    def pinned_bytes(self) -> int:
        """The bytes of the entries that cached node outputs pin."""
        with self._lock:
            return self._pinned_bytes
