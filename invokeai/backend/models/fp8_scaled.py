"""ComfyUI's fp8 single files: weights stored as float8 (e4m3fn or e5m2), each with an optional per-tensor scale
(`<module>.scale_weight`, or `<module>.weight_scale` in its newer files) and an empty `scaled_fp8` tensor marking a
scaled file; `scale_input` / `input_scale` tensors are for fp8 matrix products, which the server does not run.

`dequantized` turns such a state dict back into ordinary weights (the stored value times its scale, in the model's
dtype) and leaves any other tensor as it is, so a bf16 or fp16 file passes through unchanged. `scaled_fp8` writes one,
for fixtures and tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

MARKER = "scaled_fp8"
WEIGHT_SCALES = (".scale_weight", ".weight_scale")
INPUT_SCALES = (".scale_input", ".input_scale")
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)
_E4M3_MAX = 448.0


def _scale_of(name: str, state: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    stem = name.removesuffix(".weight")
    for suffix in WEIGHT_SCALES:
        if stem + suffix in state:
            return state[stem + suffix]
    return None


def _is_marker(name: str) -> bool:
    # At the top level in ComfyUI's files, whatever prefix the model's tensors have.
    return name == MARKER or name.endswith("." + MARKER)


def is_fp8(state: Mapping[str, torch.Tensor]) -> bool:
    return any(_is_marker(name) or tensor.dtype in FP8_DTYPES for name, tensor in state.items())


def dequantized(state: Mapping[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The state dict with every fp8 tensor as `dtype` (times its scale, where it has one) and the scale and marker
    tensors left out; a file without fp8 tensors comes back as it is."""
    if not is_fp8(state):
        return dict(state)
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if _is_marker(name) or name.endswith(WEIGHT_SCALES + INPUT_SCALES):
            continue
        if tensor.dtype in FP8_DTYPES:
            value = tensor.to(torch.float32)
            scale = _scale_of(name, state)
            if scale is not None:
                value = value * scale.to(torch.float32)
            tensor = value.to(dtype)
        out[name] = tensor
    return out


def scaled_fp8(state: Mapping[str, torch.Tensor], names: Iterable[str]) -> dict[str, torch.Tensor]:
    """`state` with the tensors `names` stored as ComfyUI's scaled float8_e4m3fn (the scale maps the tensor's
    largest magnitude to e4m3's largest), the marker added."""
    out = dict(state)
    for name in names:
        tensor = out[name].to(torch.float32)
        scale = (tensor.abs().max() / _E4M3_MAX).clamp(min=1e-12)
        out[name] = (tensor / scale).to(torch.float8_e4m3fn)
        out[name.removesuffix(".weight") + WEIGHT_SCALES[0]] = scale.reshape(())
    out[MARKER] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out
