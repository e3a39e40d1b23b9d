"""Bytes per element of a materialised attention score matrix (the math kernel), by device and dtype.

The math kernel holds the scores, their softmax (in fp32 whatever the input dtype) and temporaries at once.
CPU figures are upper bounds of what `scripts/calibrate_sdpa_math_memory.py` measured on this project's CI
machine (torch 2.13.0, peak-RSS growth per score element, maxima over 8-head calls with no, additive and causal
masks and a one-head 512-wide VAE-like call): float32 9.9, bfloat16 11.4, float16 11.4; each rounded up plus one
byte of margin. A causal call also builds its mask once, shared by the heads: `causal_mask_bytes` prices it,
which covers the one-head causal calls that measured 13.3-13.5 bytes per element. Accelerator figures are the
upper bound measured on CUDA and ROCm in the design discussion (~17 bytes per element), used until the
calibration is run on a GPU.
"""

from __future__ import annotations

import torch

CPU_BYTES_PER_SCORE_ELEMENT: dict[torch.dtype, int] = {
    torch.float32: 11,
    torch.bfloat16: 13,
    torch.float16: 13,
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


def causal_mask_bytes(query_len: int, key_len: int, dtype: torch.dtype) -> int:
    """The math kernel's causal mask: one query_len x key_len additive bias and two bool temporaries per call,
    shared by every head (which is why one-head causal calls measure ~3 bytes per element above the table)."""
    return query_len * key_len * (dtype.itemsize + 2)
