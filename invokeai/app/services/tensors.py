"""Tensors passed between nodes (latents, prompt embeddings): kept in memory under a name that travels on edges.

Graph outputs must be JSON, so a node that produces a tensor saves it here and outputs the name; the next node
loads it by that name. Entries live on the CPU: a tensor left on the execution device between nodes would hold
memory that the model cache cannot see or free. Nodes save under their session as owner, and the session processor
deletes a session's entries when its item ends: nothing outside the item can load them (no API serves tensors).
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

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
    """In memory, at most `max_bytes` in all; the least recently used entries are dropped to make room."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[TensorLike, int]] = OrderedDict()
        self._owned: dict[str, set[str]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

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
            while self._bytes + size > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped
            self._entries[name] = (stored, size)
            self._bytes += size
            if owner is not None:
                self._owned.setdefault(owner, set()).add(name)
        return name

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
            entry = self._entries.pop(name, None)
            if entry is None:
                raise KeyError(f"tensor {name!r} not found")
            self._bytes -= entry[1]

    def delete_owned(self, owner: str) -> int:
        """Delete every entry saved under `owner` that is still here; returns how many were deleted."""
        with self._lock:
            names = self._owned.pop(owner, set())
            deleted = 0
            for name in names:
                entry = self._entries.pop(name, None)
                if entry is not None:
                    self._bytes -= entry[1]
                    deleted += 1
        return deleted

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._entries

    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._bytes
