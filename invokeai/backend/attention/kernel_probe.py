"""Startup probe: which fused kernels this device offers for the shape the transformers attend over.

A capability query (no kernel launch, no timing) whose answer depends on the build, the device and the shape, so
the log line names all three. Every failure is swallowed: a diagnostic must never stop the server.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend

logger = logging.getLogger(__name__)

PROBE_SHAPE = (1, 24, 1024, 128)
PROBE_DTYPE = torch.bfloat16
_PROBED = {
    "flash": ("can_use_flash_attention", SDPBackend.FLASH_ATTENTION),
    "cudnn": ("can_use_cudnn_attention", SDPBackend.CUDNN_ATTENTION),
    "efficient": ("can_use_efficient_attention", SDPBackend.EFFICIENT_ATTENTION),
}


# The records' attribute docstrings are their field descriptions when the API serves them (see stats.py).
_DESCRIBED = {"use_attribute_docstrings": True}


@dataclass(frozen=True)
class KernelProbe:
    """What PyTorch said at startup about the fused kernels for one call shape on the device."""

    __pydantic_config__ = _DESCRIBED

    device: str
    """The device and its name, e.g. "cuda:0 (NVIDIA H200)"."""
    torch: str
    """The torch version."""
    shape: list[int]
    """The probed query shape [batch, heads, sequence, head_dim]; key and value are the same."""
    dtype: str
    """The probed dtype."""
    mask: str
    """The probed mask ("no mask")."""
    flash: bool
    """Whether the flash kernel can serve the probed call."""
    cudnn: bool
    """Whether the cuDNN kernel can serve it."""
    efficient: bool
    """Whether the memory-efficient kernel can serve it."""
    sage: bool
    """Whether the sageattention package is importable."""


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return torch.xpu.get_device_name(device)


def probe_kernels(device: torch.device | str) -> KernelProbe | None:
    """The probe's answer on cuda and xpu; None elsewhere or on any error."""
    device = torch.device(device)
    if device.type not in ("cuda", "xpu"):
        return None
    try:
        query = torch.zeros(PROBE_SHAPE, device=device, dtype=PROBE_DTYPE)
        params = torch.backends.cuda.SDPAParams(query, query, query, None, 0.0, False, False)
        can = {}
        for name, (function, _) in _PROBED.items():
            can_use = getattr(torch.backends.cuda, function, None)
            can[name] = bool(can_use(params, False)) if can_use is not None else False
        del params, query
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result = KernelProbe(
            device=f"{device} ({_device_name(device)})",
            torch=torch.__version__,
            shape=list(PROBE_SHAPE),
            dtype=str(PROBE_DTYPE).removeprefix("torch."),
            mask="no mask",
            sage=importlib.util.find_spec("sageattention") is not None,
            **can,
        )
        yes_no = " ".join(
            f"{name}={'yes' if getattr(result, name) else 'no'}" for name in ("flash", "cudnn", "efficient", "sage")
        )
        logger.info(
            "SDPA kernels on %s, torch %s, for %s %s, no mask: %s",
            result.device,
            result.torch,
            result.dtype,
            list(PROBE_SHAPE),
            yes_no,
        )
        return result
    except Exception as error:
        logger.debug("SDPA kernel probe failed on %s: %s", device, error)
        return None


def unavailable_kernels(probe: KernelProbe | None) -> frozenset[str]:
    """Names of the kernels this build lacks, plus those the probe found unusable on this device."""
    missing: set[str] = set()
    if torch.version.hip is not None:
        missing.add(SDPBackend.CUDNN_ATTENTION.name)
    if probe is not None:
        missing |= {kernel.name for name, (_, kernel) in _PROBED.items() if not getattr(probe, name)}
    return frozenset(missing)
