"""The attention policy on a real CUDA device: PyTorch's own dispatcher, kernels and probe, no stand-ins.

The CPU suite exercises these paths with the CPU as a stand-in GPU (conftest's `stand_in_gpu` and `dispatcher`);
this module checks that the stand-in's assumptions hold on real hardware. Needs torch and pytest only (the GPU
machine has neither diffusers nor the server's dependencies). Where a precondition is a property of the build or
card rather than of the code (cuDNN serving fp32, flash being compiled in), the test skips and says so instead of
passing vacuously.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right
from torch.profiler import profile

from invokeai.backend.attention import (
    ATTENTION_SETTINGS,
    NO_NODE,
    attention_caller,
    attention_stats,
    install_attention,
    kernel_order,
    sdpa_score_matrix_bytes,
    serving_kernel,
    uninstall_attention,
)
from invokeai.backend.attention.benchmarking import sdpa_window
from invokeai.backend.attention.kernel_probe import PROBE_SHAPE, probe_kernels
from invokeai.backend.attention.memory import ACCELERATOR_BYTES_PER_SCORE_ELEMENT
from invokeai.backend.attention.testing import pristine_attention

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

REAL_SDPA = F.scaled_dot_product_attention
CUDNN = int(SDPBackend.CUDNN_ATTENTION)


@pytest.fixture(autouse=True)
def restored_attention() -> Iterator[None]:
    """Whatever a test installs or rebinds, the next test starts from PyTorch's SDPA, flags and order.

    uninstall_attention() alone is not enough where a test bound a stand-in SDPA before installing: uninstalling
    restores the function that was bound at install time, i.e. the stand-in.
    """
    with pristine_attention():
        yield


def _qkv(
    heads: int, length: int, head_dim: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator(device="cuda").manual_seed(seed)
    shape = (1, heads, length, head_dim)
    q, k, v = (torch.randn(shape, generator=generator, device="cuda", dtype=dtype) for _ in range(3))
    return q, k, v


def _math_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The math kernel in fp32: what every fused kernel's output is compared against."""
    with sdpa_kernel([SDPBackend.MATH]):
        return REAL_SDPA(q.float(), k.float(), v.float(), attn_mask=None if mask is None else mask.float())


# (a) The dispatcher property the whole ranked list rests on: a kernel that cannot serve a call is skipped, not
# raised on. fp32 is refused by cuDNN, which makes cuDNN unusable on a card where it otherwise works.
def test_exclusive_cudnn_raises_on_fp32_while_the_ranked_list_completes() -> None:
    q, k, v = _qkv(heads=12, length=1024, head_dim=128, dtype=torch.float32)  # Krea-2's call, scaled down
    can_use_cudnn = getattr(torch.backends.cuda, "can_use_cudnn_attention", None)
    params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, False)
    if can_use_cudnn is not None and can_use_cudnn(params, False):
        pytest.skip("cuDNN serves fp32 on this build: fp32 is no stand-in for an unusable cuDNN here")

    install_attention("auto")
    with sdpa_window("cudnn", "test"), pytest.raises(RuntimeError, match="No available kernel"):
        F.scaled_dot_product_attention(q, k, v)

    assert serving_kernel(q, k, v) == SDPBackend.EFFICIENT_ATTENTION
    out = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, _math_reference(q, k, v), atol=1e-3, rtol=1e-3)
    assert attention_stats().counts[NO_NODE] == {"EFFICIENT_ATTENTION": 1}


# (b) The startup probe on the real device.
def test_the_probe_answers_for_the_device_and_logs_one_line(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="invokeai.backend.attention.kernel_probe")
    result = probe_kernels("cuda")
    assert result is not None, "the probe swallowed an error on a real CUDA device"
    for kernel in ("flash", "cudnn", "efficient"):
        assert isinstance(getattr(result, kernel), bool)
    assert result.shape == list(PROBE_SHAPE)
    records = [r for r in caplog.records if r.name == "invokeai.backend.attention.kernel_probe"]
    assert [r.levelno for r in records] == [logging.INFO]
    line = records[0].getMessage()
    assert torch.cuda.get_device_name() in line
    assert str(torch.__version__) in line
    assert str(list(PROBE_SHAPE)) in line
    assert "no mask" in line


class FailingCudnn:
    """PyTorch's SDPA, except that any call the dispatcher would serve with cuDNN raises, as on a card where cuDNN
    attention fails at run time in ways no eligibility check predicts."""

    def __init__(self) -> None:
        self.failures = 0

    def __call__(  # type: ignore[no-untyped-def]
        self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False
    ) -> torch.Tensor:
        choice = torch._fused_sdp_choice(
            query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa
        )
        if choice == CUDNN:
            self.failures += 1
            raise RuntimeError("injected cuDNN failure")
        return REAL_SDPA(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


# (c) cuDNN demotion with PyTorch's real dispatcher deciding what cuDNN would have served.
def test_a_cudnn_failure_on_the_device_demotes_cudnn_once() -> None:
    failing = FailingCudnn()
    F.scaled_dot_product_attention = failing  # install_attention wraps whatever SDPA is bound
    install_attention("cudnn")
    q, k, v = _qkv(heads=8, length=256, head_dim=64, dtype=torch.bfloat16)
    if serving_kernel(q, k, v) != SDPBackend.CUDNN_ATTENTION:
        pytest.skip(f"cuDNN does not serve bf16 [1, 8, 256, 64] here: {serving_kernel(q, k, v)}")

    with attention_caller("cuda_node"):
        out = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out.float(), _math_reference(q, k, v), atol=2e-2, rtol=2e-2)
    stats = attention_stats()
    assert stats.cudnn_demoted is True
    order = torch._C._get_sdp_priority_order()
    assert order.index(int(SDPBackend.MATH)) < order.index(CUDNN)  # behind math: no call reaches it again
    assert serving_kernel(q, k, v) != SDPBackend.CUDNN_ATTENTION
    assert [event.error for event in stats.events] == ["injected cuDNN failure"]
    assert [report.reason for report in stats.reports] == ["demoted"]
    assert "cudnn_fallback" not in stats.layers

    with attention_caller("cuda_node"):
        F.scaled_dot_product_attention(q, k, v)
    assert failing.failures == 1  # the second call did not go near cuDNN
    assert sum(attention_stats().counts["cuda_node"].values()) == 2


# (d) A pinned kernel that cannot serve a call is reported once per node type, with the kernel that served it.
def test_pinned_flash_with_an_additive_mask_is_reported_once() -> None:
    install_attention("flash")
    if "FLASH_ATTENTION" in attention_stats().unavailable:
        pytest.skip("this build or device has no flash kernel: the report's reason would be 'unavailable'")
    q, k, v = _qkv(heads=8, length=256, head_dim=64, dtype=torch.bfloat16)
    mask = torch.zeros(1, 1, 1, 256, device="cuda", dtype=torch.bfloat16)
    mask[..., -26:] = torch.finfo(torch.bfloat16).min  # Krea-2's (B, 1, 1, T) key padding

    with attention_caller("cuda_node"):
        first = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    torch.testing.assert_close(first.float(), _math_reference(q, k, v, mask), atol=2e-2, rtol=2e-2)
    stats = attention_stats()
    assert len(stats.reports) == 1
    report = stats.reports[0]
    assert report.node_type == "cuda_node"
    assert report.pinned == "FLASH_ATTENTION"
    assert report.serving != "FLASH_ATTENTION"
    assert report.reason == "cannot_serve"
    assert "cannot serve" in report.message
    assert stats.counts["cuda_node"] == {report.serving: 2}


# (e) Pricing follows PyTorch's real dispatcher on the device.
def test_score_matrix_is_priced_only_under_pinned_math() -> None:
    def priced() -> int:
        return sdpa_score_matrix_bytes(
            device="cuda", dtype=torch.bfloat16, num_heads=24, query_len=1024, key_len=1024, head_dim=128
        )

    install_attention("auto")
    assert priced() == 0
    install_attention("math")
    # 17 bytes per element today (the design discussion's CUDA/ROCm upper bound, until calibrated on a GPU), plus
    # math's scaled copies of the query and key (bf16 on CUDA).
    assert priced() == 24 * 1024 * 1024 * ACCELERATOR_BYTES_PER_SCORE_ELEMENT + 24 * (1024 + 1024) * 128 * 2


def _cuda_flags() -> tuple[bool, ...]:
    backends = torch.backends.cuda
    return (
        backends.flash_sdp_enabled(),
        backends.mem_efficient_sdp_enabled(),
        backends.math_sdp_enabled(),
        backends.cudnn_sdp_enabled(),
    )


# (f) Install ranks PyTorch's kernels process-wide; uninstall gives back exactly what was there before.
@pytest.mark.parametrize("setting", ATTENTION_SETTINGS)
def test_install_and_uninstall_restore_the_order_and_flags(setting: str) -> None:
    # A state no install produces, so a restore that merely resets to defaults would be caught.
    torch._C._set_sdp_priority_order(
        [int(b) for b in (SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION)]
        + [int(SDPBackend.FLASH_ATTENTION), int(SDPBackend.OVERRIDEABLE)]
    )
    torch.backends.cuda.enable_flash_sdp(False)
    before_order, before_flags, before_sdpa = (
        torch._C._get_sdp_priority_order(),
        _cuda_flags(),
        F.scaled_dot_product_attention,
    )

    install_attention(setting)
    expected = [int(kernel) for kernel in kernel_order(setting)]
    assert torch._C._get_sdp_priority_order()[: len(expected)] == expected
    assert all(_cuda_flags())
    assert F.scaled_dot_product_attention is not before_sdpa

    uninstall_attention()
    assert torch._C._get_sdp_priority_order() == before_order
    assert _cuda_flags() == before_flags
    assert F.scaled_dot_product_attention is before_sdpa


_ATEN_KERNELS = {
    "aten::_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
    "aten::_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "aten::_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
    "aten::_scaled_dot_product_attention_math": "MATH",
}


def _kernels_that_ran(function, *args, **kwargs) -> list[str]:  # type: ignore[no-untyped-def]
    with profile() as prof:
        function(*args, **kwargs)
        torch.cuda.synchronize()
    return sorted({_ATEN_KERNELS[e.name] for e in prof.events() if e.name in _ATEN_KERNELS})


# (g) What is counted is what ran, for a grouped-query call on the real dispatcher.
def test_a_grouped_query_call_is_routed_and_counted_as_it_runs() -> None:
    install_attention("auto")
    q = torch.randn(1, 32, 256, 128, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 8, 256, 128, device="cuda", dtype=torch.bfloat16)
    choice = SDPBackend(torch._fused_sdp_choice(q, kv, kv, is_causal=True, enable_gqa=True)).name
    assert serving_kernel(q, kv, kv, is_causal=True, enable_gqa=True).name == choice
    with attention_caller("gqa_node"):
        ran = _kernels_that_ran(F.scaled_dot_product_attention, q, kv, kv, is_causal=True, enable_gqa=True)
    assert ran == [choice]
    assert attention_stats().counts["gqa_node"] == {choice: 1}


# (h) The override protocol on the device: a lower-right causal bias gives the unpatched result.
def test_a_causal_bias_mask_gives_the_unpatched_result() -> None:
    q = torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
    expected = REAL_SDPA(q, kv, kv, attn_mask=causal_lower_right(128, 256))
    install_attention("efficient")
    got = F.scaled_dot_product_attention(q, kv, kv, attn_mask=causal_lower_right(128, 256))
    torch.testing.assert_close(got, expected)


# (i) Compiled code dispatches under the installed order: a pinned kernel serves the compiled call.
def test_the_installed_order_applies_inside_compiled_code() -> None:
    q, k, v = _qkv(heads=8, length=256, head_dim=64, dtype=torch.bfloat16)
    install_attention("efficient")
    if serving_kernel(q, k, v) != SDPBackend.EFFICIENT_ATTENTION:
        pytest.skip(f"the memory-efficient kernel does not serve bf16 [1, 8, 256, 64] here: {serving_kernel(q, k, v)}")

    def attend(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(a, b, c) * 2.0

    torch._dynamo.reset()
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    compiled(q, k, v)  # compile outside the profile
    assert _kernels_that_ran(compiled, q, k, v) == ["EFFICIENT_ATTENTION"]


def _fresh_process(code: str) -> str:
    """`code` in a new Python: PyTorch ranks its own kernels once per process, at the first CUDA attention call."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[3]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=300, check=True
    )
    return result.stdout.strip().splitlines()[-1]


# (j) The ranking's copy of PyTorch's rule (check_prefer_cudnn_attention) says what PyTorch itself does here.
def test_pytorchs_own_first_choice_is_the_one_the_ranking_expects_of_it() -> None:
    code = (
        "import torch\n"
        "from invokeai.backend.attention.architecture import device_facts\n"
        "from invokeai.backend.attention.policy import pytorch_prefers_cudnn\n"
        "q = torch.zeros(1, 1, 8, 8, device='cuda', dtype=torch.float16)\n"
        "torch._fused_sdp_choice(q, q, q)\n"
        "print(torch._C._get_sdp_priority_order()[0] == 3, pytorch_prefers_cudnn(device_facts('cuda')))\n"
    )
    pytorch_first_is_cudnn, expected = _fresh_process(code).split()
    assert pytorch_first_is_cudnn == expected


# (k) PyTorch's one-shot default order, set at the first CUDA call, does not replace an installed pin.
@pytest.mark.parametrize("setting", ["flash", "efficient", "auto"])
def test_the_first_call_of_a_process_keeps_the_installed_order(setting: str) -> None:
    code = (
        "import torch, torch.nn.functional as F\n"
        "from invokeai.backend.attention import install_attention, kernel_order\n"
        f"install_attention({setting!r})\n"
        "q = torch.randn(1, 8, 128, 64, device='cuda', dtype=torch.bfloat16)\n"
        "F.scaled_dot_product_attention(q, q, q)\n"
        f"print(torch._C._get_sdp_priority_order()[:4] == [int(k) for k in kernel_order({setting!r})])\n"
    )
    assert _fresh_process(code) == "True"
