"""What the ranking needs to know about the device it runs on: the platform (CUDA, ROCm, XPU, or a host device that
ignores the order), the CUDA compute capability, the cuDNN runtime version, the CUDA version of the torch build, and
how PyTorch reads `TORCH_CUDNN_SDPA_DEPRIORITIZED`.

Every fact can be passed in, so that a CPU-only machine can stand in for any GPU; what is not passed is read from
this process's torch and device.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from invokeai.backend import devices

logger = logging.getLogger(__name__)

Platform = Literal["cuda", "rocm", "xpu", "host"]
Capability = tuple[int, int]

DEPRIORITIZED_ENV = "TORCH_CUDNN_SDPA_DEPRIORITIZED"


@dataclass(frozen=True)
class DeviceFacts:
    """The facts of one device the ranking turns on. `capability` and `cudnn_version` are CUDA's (None elsewhere,
    or where the build has no cuDNN); `cuda_build` is the major CUDA version torch was built against."""

    platform: Platform
    device_type: str
    capability: Capability | None = None
    cudnn_version: int | None = None
    cuda_build: int | None = None

    @property
    def sm(self) -> str:
        """`sm90`, `sm100`, `sm86`: the capability as NVIDIA's architecture names spell it."""
        assert self.capability is not None
        major, minor = self.capability
        return f"sm{major}{minor}"

    def describe(self) -> str:
        """What the order was ranked for, for people: "sm90, cuDNN 9.16.0", "ROCm", "XPU", "cpu"."""
        if self.platform == "cuda" and self.capability is None:
            return "cuda, capability unknown"
        if self.platform == "cuda" and self.capability is not None:
            cudnn = f"cuDNN {cudnn_text(self.cudnn_version)}" if self.cudnn_version is not None else "no cuDNN"
            return f"{self.sm}, {cudnn}"
        return {"rocm": "ROCm", "xpu": "XPU"}.get(self.platform, self.device_type)


def as_capability(value: Capability | tuple[int, ...] | int) -> Capability:
    """(9, 0), or 90 as PyTorch's arch lists write it (major * 10 + minor: 89, 90, 100, 103, 120)."""
    if isinstance(value, int):
        if value < 10:
            raise ValueError(f"capability {value!r}: expected (major, minor) or major * 10 + minor, e.g. 90")
        return divmod(value, 10)
    major, minor = (*tuple(value), 0)[:2]
    return int(major), int(minor)


def as_cudnn_version(value: int | tuple[int, ...] | None) -> int | None:
    """cuDNN's version as torch.backends.cudnn.version() returns it (91600 for 9.16.0: major * 10000 + minor * 100
    + patch from cuDNN 9 on), from that integer or a (9, 16, 0) tuple."""
    if value is None:
        return None
    if isinstance(value, int):
        return value
    major, minor, patch = (*(int(part) for part in value), 0, 0)[:3]
    # cuDNN 8 encoded major * 1000 + minor * 100 + patch; from 9 on major * 10000.
    return major * (10000 if major >= 9 else 1000) + minor * 100 + patch


def cudnn_text(version: int) -> str:
    """91600 -> "9.16.0"; 8907 -> "8.9.7"."""
    if version >= 90000:
        return f"{version // 10000}.{version // 100 % 100}.{version % 100}"
    return f"{version // 1000}.{version // 100 % 10}.{version % 100}"


def cudnn_deprioritized(env: Mapping[str, str] | None = None) -> bool:
    """Whether `TORCH_CUDNN_SDPA_DEPRIORITIZED` keeps cuDNN from the front, read as PyTorch reads it
    (c10::utils::check_env in sdp_utils.cpp's check_prefer_cudnn_attention): only the value "1" does; "0" and an
    unset variable do not; any other value is ignored, and PyTorch warns "Ignoring invalid value for boolean flag",
    as this does. PyTorch reads it once per process, at its first CUDA attention call; this reads it at the install,
    which comes before that call."""
    raw = (os.environ if env is None else env).get(DEPRIORITIZED_ENV)
    if raw is None or raw == "0":
        return False
    if raw == "1":
        return True
    logger.warning("%s=%r is ignored, as PyTorch ignores it: its valid values are 0 or 1.", DEPRIORITIZED_ENV, raw)
    return False


def _cuda_build() -> int | None:
    version = torch.version.cuda
    return int(version.split(".")[0]) if version else None


def _runtime_cudnn() -> int | None:
    try:
        return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    except Exception:  # a diagnostic of the build: never a reason not to start
        return None


def device_facts(
    device: torch.device | str | None = None,
    capability: Capability | tuple[int, ...] | int | None = None,
    cudnn_version: int | tuple[int, ...] | None = None,
) -> DeviceFacts:
    """The facts for `device` (None: the accelerator this process would use), with any passed fact taking the place
    of the device's own. A capability passed without a device means a CUDA device (ROCm on a ROCm build)."""
    if device is None:
        if capability is not None or torch.cuda.is_available():
            kind = "cuda"
        elif hasattr(torch, "xpu") and torch.xpu.is_available():
            kind = "xpu"
        else:
            kind = "cpu"
        target = torch.device(kind)
    else:
        target = torch.device(device)
    if target.type == "xpu":
        return DeviceFacts(platform="xpu", device_type="xpu")
    if target.type != "cuda":
        return DeviceFacts(platform="host", device_type=target.type)
    if devices.is_rocm():
        # torch.cuda is ROCm's too, and reports a gfx capability (MI300: 9.4) that is no NVIDIA architecture.
        return DeviceFacts(platform="rocm", device_type="cuda")
    if capability is None:
        try:
            capability = torch.cuda.get_device_capability(target if target.index is not None else None)
        except Exception:  # no usable CUDA device after all: the ranking must still come out, never stop the server
            return DeviceFacts(platform="cuda", device_type="cuda", cuda_build=_cuda_build())
    return DeviceFacts(
        platform="cuda",
        device_type="cuda",
        capability=as_capability(capability),
        cudnn_version=as_cudnn_version(cudnn_version) if cudnn_version is not None else _runtime_cudnn(),
        cuda_build=_cuda_build(),
    )
