"""The ranking: kernel names, the order each setting installs on the device at hand and why, a cuDNN demotion, and
PyTorch's process-wide flags.

`torch.nn.attention.sdpa_kernel(order, set_priority=True)` does the same on entry, but it is a context manager that
restores on exit; the server holds one order for the life of the process and changes it on a cuDNN demotion or a
benchmarking window, so the same two steps (enable the flags, then set the priority order) are applied here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend

from invokeai.backend.attention.architecture import (
    Capability,
    DeviceFacts,
    cudnn_deprioritized,
    cudnn_text,
    device_facts,
)
from invokeai.backend.attention.settings import check_setting

# Flash leads where the build has it (fastest on Linux CUDA for the Krea-2 shape); cuDNN comes next because it
# serves the additive padding masks flash refuses, at 1.6-2x the memory-efficient kernel; math is the last resort.
# The order of sm80-sm89, ROCm, XPU and the host devices.
AUTO_ORDER: tuple[SDPBackend, ...] = (
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)
# PyTorch's own order where it prefers cuDNN (sdp_utils.cpp's priority_order).
CUDNN_FIRST_ORDER: tuple[SDPBackend, ...] = (
    SDPBackend.CUDNN_ATTENTION,
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
)
# PyTorch puts cuDNN first only with a cuDNN runtime newer than this (9.15.0): 9.15.1 fixed lengths not divisible
# by 128 (pytorch#169849).
CUDNN_PREFERRED_AFTER = 91500
CUDNN_PREFERRING_MAJORS = (9, 10)  # sm90 (Hopper), sm100/sm103 (data-centre Blackwell)

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

# The facts each reason rests on (docs/attention.md, "Why auto's order", names the models whose calls these are; generic
# code names no family).
MEASURED_FLASH_FIRST = (
    "flash measured fastest on sm86/sm89 (a [1, 48, 4608, 128] bf16 joint-attention call: flash 19.74 ms, cuDNN "
    "21.27 ms on a 30-series card), and cuDNN serves the padding masks flash refuses"
)
PYTORCH_CUDNN_FIRST = (
    "cuDNN first, as PyTorch ranks it here (check_prefer_cudnn_attention): on an H100, [1, 24, 4608, 128] bf16 "
    "(a 24-head joint attention over a 1024x1024 image's tokens) runs at 631 TFLOPS on cuDNN against 329 on flash "
    "(pytorch#142132)"
)
BLACKWELL_FEW_KV_HEADS = (
    "calls with fewer than 8 key-value heads skip cuDNN, which corrupts them on B200 (pytorch#193893)"
)


@dataclass(frozen=True)
class Ranking:
    """The kernels a setting ranks on a device, first choice first, and why, in words."""

    order: tuple[SDPBackend, ...]
    reason: str
    facts: DeviceFacts


def pinned_kernel(setting: str) -> SDPBackend | None:
    """The kernel a setting puts first, or None for auto and sage (which rank PyTorch's kernels as auto does)."""
    return PINNED_KERNELS.get(check_setting(setting))


def pytorch_prefers_cudnn(facts: DeviceFacts, env: Mapping[str, str] | None = None) -> bool:
    """PyTorch's check_prefer_cudnn_attention (sdp_utils.cpp), for these facts: a cuDNN runtime newer than 9.15.0
    on sm90 or sm10x (on builds against CUDA 12, only sm90, sm100 and sm103), unless TORCH_CUDNN_SDPA_DEPRIORITIZED
    says otherwise."""
    if facts.platform != "cuda" or facts.capability is None or facts.cudnn_version is None:
        return False
    major, minor = facts.capability
    if facts.cudnn_version <= CUDNN_PREFERRED_AFTER or major not in CUDNN_PREFERRING_MAJORS:
        return False
    if facts.cuda_build is not None and facts.cuda_build < 13 and minor not in (0, 3):
        return False
    return not cudnn_deprioritized(env)


def _auto_ranking(facts: DeviceFacts, env: Mapping[str, str] | None) -> tuple[tuple[SDPBackend, ...], str]:
    if facts.platform == "host":
        return AUTO_ORDER, (
            f"{facts.device_type}: PyTorch picks the kernel itself there (flash, else math) and ignores the order"
        )
    if facts.platform == "rocm":
        return AUTO_ORDER, (
            "ROCm: flash first (AOTriton), no cuDNN in ROCm builds; heads wider than the ROCm guard's limit run on math"
        )
    if facts.platform == "xpu":
        return AUTO_ORDER, (
            "XPU: the order is kept, but XPU runs its fused oneDNN kernel by its own rule and honours only the enable "
            "flags"
        )
    if facts.capability is None:
        return AUTO_ORDER, "cuda: the device's capability could not be read, so flash first"
    sm = facts.sm
    major, _ = facts.capability
    if facts.cudnn_version is None:
        return AUTO_ORDER, f"{sm}, no cuDNN in this build: flash first"
    cudnn = f"cuDNN {cudnn_text(facts.cudnn_version)}"
    if pytorch_prefers_cudnn(facts, env):
        reason = f"{sm}, {cudnn}: {PYTORCH_CUDNN_FIRST}"
        if major == 10:
            reason += f"; {BLACKWELL_FEW_KV_HEADS}"
        return CUDNN_FIRST_ORDER, reason
    if major in CUDNN_PREFERRING_MAJORS:
        if facts.cudnn_version <= CUDNN_PREFERRED_AFTER:
            why = (
                "PyTorch puts cuDNN first only with cuDNN newer than 9.15.0 (9.15.1 fixed lengths not divisible by "
                "128, pytorch#169849)"
            )
        elif cudnn_deprioritized(env):
            why = "TORCH_CUDNN_SDPA_DEPRIORITIZED=1 keeps cuDNN behind flash, as it does in PyTorch"
        else:
            why = "PyTorch's builds against CUDA 12 prefer cuDNN only on sm90, sm100 and sm103"
        return AUTO_ORDER, f"{sm}, {cudnn}: flash first; {why}"
    if major < 8:
        return AUTO_ORDER, f"{sm}, {cudnn}: the sm80-sm89 order (PyTorch's flash kernel needs sm80 and skips itself)"
    if major == 8:
        return AUTO_ORDER, f"{sm}, {cudnn}: flash first; {MEASURED_FLASH_FIRST}"
    return AUTO_ORDER, (
        f"{sm}, {cudnn}: flash first; PyTorch prefers cuDNN only on sm90 and sm100/sm103, and nothing measured here "
        "says otherwise"
    )


def ranking(
    setting: str,
    *,
    capability: Capability | tuple[int, ...] | int | None = None,
    cudnn_version: int | tuple[int, ...] | None = None,
    env: Mapping[str, str] | None = None,
    device: torch.device | str | None = None,
) -> Ranking:
    """The order `setting` installs on a device, and the reason. Each fact not passed is this process's own:
    `device` (None: the accelerator torch would use), its `capability` ((9, 0) or 90), the `cudnn_version`
    (91600 or (9, 16, 0)), the environment `env` (os.environ) for TORCH_CUDNN_SDPA_DEPRIORITIZED.

    auto: sm80-sm89 rank flash, cuDNN, memory-efficient, math; sm90 and sm10x with cuDNN newer than 9.15.0 rank
    cuDNN first, as PyTorch does; ROCm, XPU and host devices keep flash first. A pin goes first, then auto's order
    without it; sage ranks PyTorch's kernels as auto does."""
    check_setting(setting)
    facts = device_facts(device, capability, cudnn_version)
    order, reason = _auto_ranking(facts, env)
    pinned = pinned_kernel(setting)
    if pinned is not None:
        order = (pinned, *(kernel for kernel in order if kernel != pinned))
        reason = f"attention_backend {setting!r} pins {KERNEL_PHRASES[pinned]} first, then auto's order; {reason}"
    elif setting == "sage":
        reason = f"SageAttention for the calls it takes, auto's order for the rest; {reason}"
    return Ranking(order=tuple(order), reason=reason, facts=facts)


def kernel_order(
    setting: str,
    *,
    capability: Capability | tuple[int, ...] | int | None = None,
    cudnn_version: int | tuple[int, ...] | None = None,
    env: Mapping[str, str] | None = None,
    device: torch.device | str | None = None,
) -> list[SDPBackend]:
    """The ranked kernels for an `attention_backend` value on a device (`ranking`, without the reason)."""
    return list(ranking(setting, capability=capability, cudnn_version=cudnn_version, env=env, device=device).order)


def settle_pytorch_order(device: torch.device) -> None:
    """Let PyTorch set its own default order now, before it is read and replaced.

    PyTorch ranks its kernels once, at the first CUDA attention dispatch of the process (sdp_utils.cpp's
    priority_order): where it prefers cuDNN it then sets cuDNN, flash, memory-efficient, math over whatever order
    was set before. A dispatcher query is such a dispatch, so one made here, before the previous flags are read and
    the installed order applied, keeps PyTorch from replacing the installed order (a pin included) at the first
    real call, and lets the uninstall restore PyTorch's own default."""
    if device.type != "cuda":
        return
    try:
        query = torch.zeros(1, 1, 8, 8, device=device, dtype=torch.float16)
        torch._fused_sdp_choice(query, query, query)
    except Exception:  # every kernel switched off by the caller, or no usable device: nothing to settle
        pass


def demoted_order(order: Sequence[SDPBackend]) -> tuple[SDPBackend, ...]:
    """cuDNN moved behind math, the kernel that serves every call: after a run-time failure no call reaches cuDNN
    again, and every kernel that was ahead of it stays ahead."""
    rest = [kernel for kernel in order if kernel != SDPBackend.CUDNN_ATTENTION]
    return (*rest, SDPBackend.CUDNN_ATTENTION)


@dataclass(frozen=True)
class Window:
    """A benchmarking window over PyTorch's flags: one kernel alone (exclusive), or that kernel ranked first.
    `source` names what opened it, for the reports (e.g. "INVOKE_KREA2_SDPA_BACKEND=cudnn")."""

    mode: str
    kernel: SDPBackend
    exclusive: bool
    source: str = ""


_FLAG_NAMES: dict[SDPBackend, str] = {
    SDPBackend.MATH: "math",
    SDPBackend.FLASH_ATTENTION: "flash",
    SDPBackend.EFFICIENT_ATTENTION: "mem_efficient",
    SDPBackend.CUDNN_ATTENTION: "cudnn",
    SDPBackend.OVERRIDEABLE: "overrideable",
}
ALL_KERNELS: frozenset[SDPBackend] = frozenset(_FLAG_NAMES)


@dataclass(frozen=True)
class KernelFlags:
    enabled: frozenset[SDPBackend]
    order: tuple[int, ...]


def read_flags() -> KernelFlags:
    enabled = frozenset(k for k, name in _FLAG_NAMES.items() if getattr(torch._C, f"_get_{name}_sdp_enabled")())
    return KernelFlags(enabled, tuple(torch._C._get_sdp_priority_order()))


def apply_flags(flags: KernelFlags) -> None:
    for kernel, name in _FLAG_NAMES.items():
        getattr(torch._C, f"_set_sdp_use_{name}")(kernel in flags.enabled)
    torch._C._set_sdp_priority_order(list(flags.order))


def ranked_flags(order: Sequence[SDPBackend], enabled: Iterable[SDPBackend] | None = None) -> KernelFlags:
    """Set-priority semantics: `order` first, then every other backend in PyTorch's current order.

    OVERRIDEABLE (the fused oneDNN kernel of XPU builds) stays enabled and goes after math: XPU ignores the order
    but honours the flags, so disabling it would send every XPU call to math, while CUDA walks the order and
    raises "Invalid backend" if it meets an enabled OVERRIDEABLE before math.
    """
    ranked = [int(k) for k in order]
    if int(SDPBackend.OVERRIDEABLE) not in ranked:
        ranked.append(int(SDPBackend.OVERRIDEABLE))
    ranked += [b for b in torch._C._get_sdp_priority_order() if b not in ranked]
    return KernelFlags(ALL_KERNELS if enabled is None else frozenset(enabled), tuple(ranked))


def flags_for(order: Sequence[SDPBackend], window: Window | None, cudnn_demoted: bool) -> KernelFlags:
    """The flags in force: the installed order, or an open window over it. A window never ranks a demoted cuDNN
    first again: that would send calls to the kernel that failed, with no fallback left around it."""
    if window is not None and window.exclusive:
        return ranked_flags([window.kernel], enabled=[window.kernel])
    ranked = list(order)
    if window is not None and not (window.kernel is SDPBackend.CUDNN_ATTENTION and cudnn_demoted):
        ranked = [window.kernel, *(k for k in ranked if k != window.kernel)]
    return ranked_flags(ranked)
