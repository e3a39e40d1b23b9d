"""Read and check a safetensors file's header without reading its tensors.

Layout: 8-byte little-endian header length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}}
(plus an optional "__metadata__" of strings), then the data, offsets relative to its start.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import UnsupportedModelError

DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
# Headers of real checkpoints are well under a megabyte; a larger length is garbage, not a reason to read 100 MB.
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorHeader:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: dict[str, TensorHeader]
    metadata: dict[str, str]


def read_safetensors_header(path: Path) -> SafetensorsHeader:
    """The header of `path`, checked against the file's size; UnsupportedModelError says what is wrong."""
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        if len(prefix) < 8:
            raise UnsupportedModelError(f"{path.name}: truncated safetensors file ({size} bytes, no header length)")
        (length,) = struct.unpack("<Q", prefix)
        if length > size - 8:
            raise UnsupportedModelError(
                f"{path.name}: corrupt or truncated safetensors file: header length {length} is beyond the file "
                f"size ({size} bytes)"
            )
        if length > MAX_HEADER_BYTES:
            raise UnsupportedModelError(f"{path.name}: corrupt safetensors file: header length {length} is implausible")
        raw = file.read(length)
    try:
        parsed = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UnsupportedModelError(
            f"{path.name}: corrupt safetensors file: header is not valid JSON ({exc})"
        ) from None
    if not isinstance(parsed, dict):
        raise UnsupportedModelError(f"{path.name}: corrupt safetensors file: header is not a JSON object")
    metadata = parsed.pop("__metadata__", None) or {}
    data_size = size - 8 - length
    tensors = {name: _tensor(path, name, entry, data_size) for name, entry in parsed.items()}
    if not tensors:
        raise UnsupportedModelError(f"{path.name}: safetensors file holds no tensors")
    return SafetensorsHeader(tensors=tensors, metadata=metadata if isinstance(metadata, dict) else {})


def _tensor(path: Path, name: str, entry: object, data_size: int) -> TensorHeader:
    def bad(what: str) -> UnsupportedModelError:
        return UnsupportedModelError(f"{path.name}: corrupt safetensors file: tensor {name!r} {what}")

    if not isinstance(entry, dict):
        raise bad("has no description")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise bad(f"has unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise bad(f"has an invalid shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise bad(f"has invalid data offsets {offsets!r}")
    begin, end = offsets
    if not 0 <= begin <= end:
        raise bad(f"has invalid data offsets {offsets!r}")
    if end > data_size:
        raise UnsupportedModelError(
            f"{path.name}: truncated safetensors file: tensor {name!r} ends at byte {end} of the data, which has "
            f"only {data_size} bytes"
        )
    if end - begin != math.prod(shape) * DTYPE_SIZES[dtype]:
        raise bad(f"size {end - begin} does not match its shape {shape} and dtype {dtype}")
    return TensorHeader(dtype=dtype, shape=tuple(shape), begin=begin, end=end)
