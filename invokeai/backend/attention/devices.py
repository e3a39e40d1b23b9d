"""Where the ranking applies, and the dispatcher query: the seams tests replace to use the CPU as a stand-in GPU.

PyTorch's CPU backend ignores the priority order (it picks its flash kernel whenever it can), so reports and the
cuDNN fallback only make sense for CUDA and XPU tensors. Tests swap these functions before `install_attention`
to exercise those paths on a CPU-only machine.
"""

from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend


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


# PyTorch's own answer to "which kernel serves this call under the current flags and order", as an
# SDPBackend value (ERROR = -1 when none can). Tests replace it with a function of the same signature.
fused_sdp_choice = torch._fused_sdp_choice

# Routes are the backends' names: pybind enums hash and compare through Python (~0.3 us each), plain strings do
# not, and every call hashes its route once. Indexed by the SDPBackend value; ERROR (-1) is the last entry.
BACKEND_BY_VALUE: tuple[str, ...] = tuple(
    SDPBackend(value).name for value in (*range(int(SDPBackend.OVERRIDEABLE) + 1), int(SDPBackend.ERROR))
)
