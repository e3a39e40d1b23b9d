"""Read and check a GGUF file's tensor table without reading its tensors."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import UnsupportedModelError

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GGUFTensor:
    shape: tuple[int, ...]  # torch order (GGUF stores dimensions innermost first)
    quant_type: str


@dataclass(frozen=True)
class GGUFHeader:
    architecture: str | None
    tensors: dict[str, GGUFTensor]


def is_gguf(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(4) == GGUF_MAGIC


def read_gguf_header(path: Path) -> GGUFHeader:
    """The tensor table of `path`, checked against the file's size; UnsupportedModelError says what is wrong."""
    import gguf  # numpy only; kept local so importing the probe stays cheap

    size = path.stat().st_size
    try:
        # The reader memory-maps the file: only the pages of the header and tensor table are read.
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as exc:  # the reader raises IndexError/ValueError/struct errors on cut or garbled files
        raise UnsupportedModelError(
            f"{path.name}: corrupt or truncated GGUF file ({type(exc).__name__}: {exc})"
        ) from None
    tensors: dict[str, GGUFTensor] = {}
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > size:
            raise UnsupportedModelError(
                f"{path.name}: truncated GGUF file: tensor {tensor.name!r} ends at byte {end}, the file has {size}"
            )
        shape = tuple(int(d) for d in reversed(tensor.shape.tolist()))
        tensors[tensor.name] = GGUFTensor(shape=shape, quant_type=tensor.tensor_type.name)
    if not tensors:
        raise UnsupportedModelError(f"{path.name}: GGUF file holds no tensors")
    field = reader.fields.get("general.architecture")
    architecture = str(field.contents()) if field is not None else None
    return GGUFHeader(architecture=architecture, tensors=tensors)
