"""Bytes per element of a materialised attention score matrix (the math kernel), by device and dtype.

The math kernel holds the scores, their softmax (in fp32 whatever the input dtype) and temporaries at once.
CPU figures are upper bounds of what `scripts/calibrate_sdpa_math_memory.py` measured on this project's CI
machine (see docs/attention.md); accelerator figures are the upper bound measured on CUDA and ROCm in the design
discussion (~17 bytes per element), used until the calibration is run on a GPU.
"""

from __future__ import annotations

import torch

CPU_BYTES_PER_SCORE_ELEMENT: dict[torch.dtype, int] = {
    torch.float32: 12,
    torch.bfloat16: 12,
    torch.float16: 12,
}
ACCELERATOR_BYTES_PER_SCORE_ELEMENT = 17


def bytes_per_score_element(device: torch.device | str, dtype: torch.dtype) -> int:
    if torch.device(device).type == "cpu":
        return CPU_BYTES_PER_SCORE_ELEMENT.get(dtype, 2 * dtype.itemsize + 8)
    return ACCELERATOR_BYTES_PER_SCORE_ELEMENT


def score_matrix_bytes(
    num_heads: int, query_len: int, key_len: int, device: torch.device | str, dtype: torch.dtype
) -> int:
    return num_heads * query_len * key_len * bytes_per_score_element(device, dtype)
