"""One PyTorch kernel alone, for one call: its aten operator with the preprocessing PyTorch's SDPA applies before it
(attention.cpp), never by switching PyTorch's process-global flags, which would leak into other threads' calls.

The layers that send a call to a kernel the dispatcher did not choose (the cuDNN guard, the autotuner) run it
through these. Each has SDPA's internal call signature: (q, k, v, attn_mask, dropout_p, is_causal, scale,
enable_gqa). Each serves only the calls PyTorch's own eligibility check for that kernel accepts
(`devices.kernel_can_serve`); math serves every call. The fused ones are CUDA's (ROCm's too, where it has them).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from invokeai.backend.attention.layer import Call
from invokeai.backend.attention.rocm_guard import MATH_CHUNK_BYTES, additive_mask, chunked_math

# What cuDNN's branch of SDPA puts where a bool mask is False: a large finite negative rather than -inf, which
# cuDNN mishandles (attention.cpp's convert_boolean_attn_mask_cudnn).
CUDNN_MASKED = -65504.0


def _log_sumexp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the kernel must keep what its backward needs (SDPA's should_compute_logsumexp)."""
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def flash(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """SDPA's flash branch on CUDA: the head dim padded to a multiple of 8, the scale of the unpadded one, the
    output cut back (flash takes no mask and serves grouped-query heads itself)."""
    head_dim = q.shape[-1]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    pad = -head_dim % 8
    if pad:
        q, k, v = (F.pad(tensor, (0, pad)) for tensor in (q, k, v))
    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    return out[..., :head_dim] if pad else out


def efficient(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """SDPA's memory-efficient branch: an additive mask, expanded to (batch, heads, query, key), its last dimension's
    storage padded to a multiple of 16 (then sliced back), as the kernel needs."""
    bias = additive_mask(mask, q.dtype)
    if bias is not None:
        bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        key_len = k.shape[2]
        if key_len % 16:
            bias = F.pad(bias, (0, 16 - key_len % 16))[..., :key_len]
        elif any(stride % 16 for stride in bias.stride()[:3]):
            bias = bias.contiguous()
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, _log_sumexp(q, k, v), dropout_p, is_causal, scale=scale
    )[0]


def cudnn(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """SDPA's cuDNN branch: a bool mask made additive with cuDNN's finite stand-in for -inf; grouped-query heads
    are the operator's own business, as in SDPA."""
    if mask is not None and mask.dtype == torch.bool:
        mask = torch.zeros_like(mask, dtype=q.dtype).masked_fill_(mask.logical_not(), CUDNN_MASKED)
    return torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, mask, _log_sumexp(q, k, v), dropout_p, is_causal, False, scale=scale
    )[0]


def math_kernel(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Math, on any device, in chunks above 1 GiB of scores as the ROCm guard runs it (the result is the same)."""
    return chunked_math(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa, MATH_CHUNK_BYTES)


# By PyTorch's kernel name. Math runs on every device; the others on CUDA (and ROCm) tensors only.
RUNS: dict[str, Call] = {
    "FLASH_ATTENTION": flash,
    "EFFICIENT_ATTENTION": efficient,
    "CUDNN_ATTENTION": cudnn,
    "MATH": math_kernel,
}
CUDA_ONLY = frozenset({"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"})


def runs_on(kernel: str, tensor: torch.Tensor) -> bool:
    """Whether `RUNS[kernel]` can run a call on this tensor's device."""
    return kernel in RUNS and (kernel not in CUDA_ONLY or tensor.is_cuda)
