"""The cuDNN guard: on a stand-in sm100 (B200), calls with fewer than 8 key-value heads that the dispatcher sends to
cuDNN run on the next kernel of the order that can serve them, are reported once per (node, kernel, reason) naming
pytorch#193893, and are priced on the kernel that serves them. CUDA-gated tests run the guard's kernels for real."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from invokeai.backend.attention import (
    attention_caller,
    attention_stats,
    cudnn_guard,
    install_attention,
    policy,
    sdpa_score_matrix_bytes,
    serving_kernel,
)
from invokeai.backend.attention.architecture import DeviceFacts
from invokeai.backend.attention.cudnn_guard import FIXED_IN, GUARDED, MIN_KV_HEADS, needed
from invokeai.backend.attention.memory import CPU_BYTES_PER_SCORE_ELEMENT
from invokeai.backend.attention.policy import apply_flags, ranked_flags
from invokeai.backend.attention.testing import DispatchedCall

# B200 with torch 2.13: no flash kernel (pytorch#193893's bisect: FLASH_ATTENTION unavailable), the memory-efficient
# kernel takes no grouped-query call, cuDNN and math take every call.
B200_RULES: dict[str, Callable[[DispatchedCall], bool]] = {
    "CUDNN_ATTENTION": lambda call: True,
    "EFFICIENT_ATTENTION": lambda call: not call.enable_gqa,
    "MATH": lambda call: True,
}


def _facts(capability: tuple[int, int]) -> DeviceFacts:
    return DeviceFacts(platform="cuda", device_type="cuda", capability=capability, cudnn_version=91600)


@pytest.fixture
def b200(monkeypatch: pytest.MonkeyPatch, stand_in_gpu: None, dispatcher) -> None:  # type: ignore[no-untyped-def]
    """The install ranks for an sm100 GPU with cuDNN 9.16 (cuDNN first) and the dispatcher answers as a B200's."""
    monkeypatch.setattr(policy, "device_facts", lambda device, capability, cudnn: _facts((10, 0)))
    monkeypatch.delenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", raising=False)
    dispatcher(B200_RULES)


def _qkv(q_heads: int, kv_heads: int, length: int = 16, head_dim: int = 8) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(7)
    q = torch.randn(1, q_heads, length, head_dim, generator=generator)
    k = torch.randn(1, kv_heads, length, head_dim, generator=generator)
    return q, k, torch.randn_like(k)


def _math(q, k, v, **kwargs) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with sdpa_kernel([SDPBackend.MATH]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


@pytest.mark.parametrize(
    ("facts", "guarded"),
    [
        (_facts((10, 0)), True),
        (_facts((10, 3)), True),
        (_facts((9, 0)), False),
        (_facts((12, 0)), False),
        (_facts((8, 9)), False),
        (DeviceFacts(platform="rocm", device_type="cuda"), False),
        (DeviceFacts(platform="host", device_type="cpu"), False),
    ],
)
def test_the_guard_is_needed_on_the_sm100_family_only(facts: DeviceFacts, guarded: bool) -> None:
    assert needed(facts) is guarded


def test_no_fixed_pytorch_is_known_yet() -> None:
    assert FIXED_IN is None


@pytest.mark.parametrize(("fixed_in", "version", "guarded"), [("2.14.0", "2.13.0", True), ("2.13.0", "2.13.0", False)])
def test_a_fixed_pytorch_removes_the_guard(
    fixed_in: str, version: str, guarded: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cudnn_guard, "FIXED_IN", fixed_in)
    assert needed(_facts((10, 0)), version) is guarded
    assert needed(_facts((10, 0)), "2.14.0+cu130") is False


def test_a_grouped_query_call_with_few_key_value_heads_runs_on_the_next_kernel_that_can_serve_it(b200) -> None:  # type: ignore[no-untyped-def]
    install_attention("auto")
    assert "cudnn_guard" in attention_stats().layers
    q, k, v = _qkv(q_heads=28, kv_heads=4)  # Qwen2.5-VL's layout
    # cuDNN is first and would take it; the memory-efficient kernel refuses grouped-query calls: math serves it.
    assert serving_kernel(q, k, v, enable_gqa=True) is SDPBackend.MATH
    with attention_caller("qwen_text_encoder"):
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(out, _math(q, k, v, enable_gqa=True))
    assert attention_stats().counts["qwen_text_encoder"] == {"MATH": 1}


def test_eight_key_value_heads_stay_on_cudnn(b200) -> None:  # type: ignore[no-untyped-def]
    install_attention("auto")
    q, k, v = _qkv(q_heads=32, kv_heads=MIN_KV_HEADS)  # Qwen3's layout
    assert serving_kernel(q, k, v, enable_gqa=True) is SDPBackend.CUDNN_ATTENTION
    wide = _qkv(q_heads=24, kv_heads=24)
    assert serving_kernel(*wide) is SDPBackend.CUDNN_ATTENTION


def test_a_plain_call_with_few_heads_goes_to_the_memory_efficient_kernel(b200, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Every head of a multi-head call is a key-value head. The memory-efficient kernel has no CPU implementation, so
    # its run is recorded here and stood in for by math; the CUDA tests below run it for real.
    ran: list[str] = []

    def efficient(q, k, v, *rest):  # type: ignore[no-untyped-def]
        ran.append("efficient")
        return torch.ops.aten._scaled_dot_product_attention_math(q, k, v)[0]

    monkeypatch.setattr(GUARDED["EFFICIENT_ATTENTION"], "run", efficient)
    install_attention("auto")
    q, k, v = _qkv(q_heads=4, kv_heads=4)
    assert serving_kernel(q, k, v) is SDPBackend.EFFICIENT_ATTENTION
    with attention_caller("small_heads"):
        F.scaled_dot_product_attention(q, k, v)
    assert ran == ["efficient"]
    assert attention_stats().counts["small_heads"] == {"EFFICIENT_ATTENTION": 1}


def test_it_is_reported_once_per_node_kernel_and_reason(b200, caplog) -> None:  # type: ignore[no-untyped-def]
    install_attention("auto")
    q, k, v = _qkv(q_heads=12, kv_heads=2)
    with caplog.at_level(logging.WARNING), attention_caller("text_encoder"):
        for _ in range(3):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    with attention_caller("other_node"):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    reports = attention_stats().reports
    assert [(r.node_type, r.pinned, r.serving, r.reason) for r in reports] == [
        ("text_encoder", "CUDNN_ATTENTION", "MATH", "cudnn_guard"),
        ("other_node", "CUDNN_ATTENTION", "MATH", "cudnn_guard"),
    ]
    first = reports[0].message
    assert first.startswith("cuDNN attention is skipped for attention in text_encoder")
    assert "pytorch#193893" in first and "12 query / 2 key-value heads" in first and first.endswith("runs on MATH.")
    assert [r.getMessage() for r in caplog.records if "193893" in r.getMessage()] == [first, reports[1].message]


def test_a_cudnn_pin_is_reported_once_not_twice(b200) -> None:  # type: ignore[no-untyped-def]
    install_attention("cudnn")
    q, k, v = _qkv(q_heads=8, kv_heads=1)
    with attention_caller("text_encoder"):
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    (report,) = attention_stats().reports
    assert report.reason == "cudnn_guard"
    assert report.message.startswith("attention_backend 'cudnn' is not possible for attention in text_encoder")


def test_with_math_pinned_a_guarded_call_is_not_reported_by_the_pin(b200) -> None:  # type: ignore[no-untyped-def]
    # Pinned math serves before cuDNN: the guard never sees the call.
    install_attention("math")
    q, k, v = _qkv(q_heads=8, kv_heads=2)
    F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert attention_stats().reports == []


def test_where_nothing_else_is_enabled_cudnn_keeps_the_call(b200) -> None:  # type: ignore[no-untyped-def]
    # An exclusive cuDNN benchmarking window exists to run cuDNN alone.
    install_attention("auto")
    apply_flags(ranked_flags([SDPBackend.CUDNN_ATTENTION], enabled=[SDPBackend.CUDNN_ATTENTION]))
    q, k, v = _qkv(q_heads=8, kv_heads=2)
    assert serving_kernel(q, k, v, enable_gqa=True) is SDPBackend.CUDNN_ATTENTION


def test_a_demotion_removes_the_guard(b200) -> None:  # type: ignore[no-untyped-def]
    from invokeai.backend.attention.install import rebind
    from invokeai.backend.attention.state import STATE

    install_attention("auto")
    STATE.cudnn_demoted = True
    STATE.order = policy.demoted_order(STATE.order)
    STATE.apply()
    rebind()
    assert "cudnn_guard" not in attention_stats().layers


def test_the_guard_is_not_composed_on_hopper(stand_in_gpu, dispatcher, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(policy, "device_facts", lambda device, capability, cudnn: _facts((9, 0)))
    dispatcher(B200_RULES)
    install_attention("auto")
    assert "cudnn_guard" not in attention_stats().layers
    q, k, v = _qkv(q_heads=8, kv_heads=2)
    assert serving_kernel(q, k, v, enable_gqa=True) is SDPBackend.CUDNN_ATTENTION


def test_with_the_real_cpu_dispatcher_the_guard_leaves_calls_alone(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The guard forced on, PyTorch's own CPU dispatcher answering: it never picks cuDNN, so nothing is rerouted.
    monkeypatch.setattr(policy, "device_facts", lambda device, capability, cudnn: _facts((10, 0)))
    install_attention("auto")
    assert "cudnn_guard" in attention_stats().layers
    q, k, v = _qkv(q_heads=8, kv_heads=2)
    assert serving_kernel(q, k, v, enable_gqa=True) is SDPBackend.FLASH_ATTENTION
    with attention_caller("cpu_node"):
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    torch.testing.assert_close(out, _math(q, k, v, enable_gqa=True), atol=1e-5, rtol=1e-5)
    assert attention_stats().counts["cpu_node"] == {"FLASH_ATTENTION": 1}
    assert attention_stats().reports == []


def _priced(**kwargs) -> int:  # type: ignore[no-untyped-def]
    return sdpa_score_matrix_bytes(device="cpu", dtype=torch.float32, query_len=77, key_len=77, head_dim=8, **kwargs)


def test_the_estimate_prices_the_kernel_that_serves(b200) -> None:  # type: ignore[no-untyped-def]
    install_attention("auto")
    scores = 28 * 77 * 77 * CPU_BYTES_PER_SCORE_ELEMENT[torch.float32]
    guarded = _priced(num_heads=28, kv_heads=4)
    assert guarded >= scores  # math: the whole matrix
    assert _priced(num_heads=32, kv_heads=8) == 0  # cuDNN serves it
    assert _priced(num_heads=4) == 0  # the memory-efficient kernel serves a plain call
    # Two prompts of a 4-key-value-head encoder fold to 8 heads; each item still has 4, so math still serves them.
    assert _priced(num_heads=56, kv_heads=8, batch=2) > 0
    assert _priced(num_heads=56, kv_heads=8, batch=1) == 0


# --- the guard's kernels on a real CUDA device --------------------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _cuda_qkv(q_heads: int, kv_heads: int, length: int, head_dim: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator(device="cuda").manual_seed(3)
    shape = (2, q_heads, length, head_dim)
    q = torch.randn(shape, generator=generator, device="cuda", dtype=torch.bfloat16)
    k = torch.randn((2, kv_heads, length, head_dim), generator=generator, device="cuda", dtype=torch.bfloat16)
    return q, k, torch.randn_like(k)


def _pytorch(kernel: SDPBackend, q, k, v, **kwargs) -> torch.Tensor:  # type: ignore[no-untyped-def]
    with sdpa_kernel([kernel]):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("head_dim", [64, 72])
@pytest.mark.parametrize("mask", ["none", "bool padding", "additive per head"])
def test_the_guards_memory_efficient_run_equals_pytorchs(head_dim: int, mask: str) -> None:
    q, k, v = _cuda_qkv(4, 4, 77, head_dim)  # 77 keys: a mask the kernel needs padded
    attn_mask = None
    if mask == "bool padding":
        attn_mask = torch.ones(2, 1, 1, 77, dtype=torch.bool, device="cuda")
        attn_mask[..., -9:] = False
    elif mask == "additive per head":
        attn_mask = torch.randn(2, 4, 77, 77, device="cuda", dtype=torch.bfloat16)
    if not torch.backends.cuda.can_use_efficient_attention(
        torch.backends.cuda.SDPAParams(q, k, v, attn_mask, 0.0, False, False)
    ):
        pytest.skip("the memory-efficient kernel cannot serve this call here")
    expected = _pytorch(SDPBackend.EFFICIENT_ATTENTION, q, k, v, attn_mask=attn_mask)
    got = GUARDED["EFFICIENT_ATTENTION"].run(q, k, v, attn_mask, 0.0, False, None, False)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize(("kv_heads", "head_dim", "causal"), [(4, 64, False), (2, 72, True), (4, 128, False)])
def test_the_guards_flash_run_equals_pytorchs(kv_heads: int, head_dim: int, causal: bool) -> None:
    q, k, v = _cuda_qkv(8, kv_heads, 256, head_dim)
    gqa = kv_heads != 8
    if not torch.backends.cuda.can_use_flash_attention(torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, causal, gqa)):
        pytest.skip("the flash kernel cannot serve this call here")
    expected = _pytorch(SDPBackend.FLASH_ATTENTION, q, k, v, is_causal=causal, enable_gqa=gqa)
    got = GUARDED["FLASH_ATTENTION"].run(q, k, v, None, 0.0, causal, None, gqa)
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


@cuda
@pytest.mark.cuda
def test_on_a_real_device_a_forced_guard_keeps_few_key_value_heads_off_cudnn(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(cudnn_guard, "needed", lambda facts, torch_version=None: True)
    install_attention("cudnn")
    q, k, v = _cuda_qkv(12, 2, 256, 128)
    if not torch.backends.cuda.can_use_cudnn_attention(torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, False, True)):
        pytest.skip("cuDNN cannot serve this grouped-query call here: there is nothing to guard")
    assert serving_kernel(q, k, v, enable_gqa=True) not in (SDPBackend.CUDNN_ATTENTION, SDPBackend.ERROR)
    with attention_caller("cuda_node"):
        out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    reference = _pytorch(SDPBackend.MATH, q.float(), k.float(), v.float(), enable_gqa=True)
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)
    assert "CUDNN_ATTENTION" not in attention_stats().counts["cuda_node"]
    assert [r.reason for r in attention_stats().reports] == ["cudnn_guard"]
