"""Where the ranking applies, and the dispatcher query: the seams tests replace to use the CPU as a stand-in GPU.

PyTorch's CPU backend ignores the priority order (it picks its flash kernel whenever it can), so reports and the
cuDNN fallback only make sense for CUDA and XPU tensors. Tests swap these functions before `install_attention`
to exercise those paths on a CPU-only machine.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend

_BACKENDS: dict[int, SDPBackend] = {int(b): b for b in SDPBackend.__members__.values()}


def is_reported_tensor(tensor: torch.Tensor) -> bool:
    """Tensors whose device walks the installed order: CUDA (and ROCm, which is torch's 'cuda') and XPU."""
    return tensor.is_cuda or tensor.is_xpu


def is_sage_tensor(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def has_reported_device() -> bool:
    """Whether this process can see a device whose attention calls get reported."""
    return torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())


def has_cuda() -> bool:
    return torch.cuda.is_available()


def is_rocm() -> bool:
    return torch.version.hip is not None


def fused_choice(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
) -> SDPBackend:
    """PyTorch's own answer to "which kernel serves this call under the current flags and order"."""
    if scale is None and not enable_gqa:
        choice = torch._fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal)
    else:
        choice = torch._fused_sdp_choice(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
    return _BACKENDS[choice]
