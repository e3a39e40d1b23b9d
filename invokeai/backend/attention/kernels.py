"""The `attention_backend` settings and the ranked kernel list each one installs."""

from __future__ import annotations

from torch.nn.attention import SDPBackend

ATTENTION_SETTINGS: tuple[str, ...] = ("auto", "sage", "cudnn", "flash", "efficient", "math")

# Flash leads where the build has it (fastest on Linux CUDA for the Krea-2 shape); cuDNN comes next because it
# serves the additive padding masks flash refuses, at 1.6-2x the memory-efficient kernel; math is the last resort.
AUTO_ORDER: tuple[SDPBackend, ...] = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)

PINNED_KERNELS: dict[str, SDPBackend] = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}

KERNEL_PHRASES: dict[SDPBackend, str] = {
    SDPBackend.FLASH_ATTENTION: "the flash kernel",
    SDPBackend.CUDNN_ATTENTION: "the cuDNN kernel",
    SDPBackend.EFFICIENT_ATTENTION: "the memory-efficient kernel",
    SDPBackend.MATH: "the math kernel",
}


def check_setting(setting: str) -> str:
    if setting not in ATTENTION_SETTINGS:
        raise ValueError(f"attention_backend {setting!r} is not valid; valid values: {', '.join(ATTENTION_SETTINGS)}")
    return setting


def pinned_kernel(setting: str) -> SDPBackend | None:
    """The kernel a setting puts first, or None for auto and sage (which rank PyTorch's kernels as auto does)."""
    return PINNED_KERNELS.get(check_setting(setting))


def kernel_order(setting: str) -> list[SDPBackend]:
    """The ranked kernels for an `attention_backend` value: the pinned kernel, then auto's order without it."""
    pinned = pinned_kernel(setting)
    if pinned is None:
        return list(AUTO_ORDER)
    return [pinned, *(kernel for kernel in AUTO_ORDER if kernel != pinned)]
