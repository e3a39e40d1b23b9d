"""install_attention / uninstall_attention: the process-wide order, its exact undo, and SDPA's semantics kept."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend as B

import invokeai.backend.attention.install as install_module
from invokeai.backend import devices
from invokeai.backend.attention import (
    ATTENTION_SETTINGS,
    attention_stats,
    install_attention,
    kernel_order,
    serving_kernel,
    uninstall_attention,
)
from invokeai.backend.attention.policy import apply_flags, read_flags

PACKAGE = Path(__file__).resolve().parents[3] / "invokeai"


def _math_reference(q, k, v, *args, **kwargs):  # type: ignore[no-untyped-def]
    return torch.ops.aten._scaled_dot_product_attention_math(q, k, v, *args, **kwargs)[0]


@pytest.mark.parametrize("setting", ATTENTION_SETTINGS)
def test_install_sets_pytorchs_priority_order_for_the_process(setting: str) -> None:
    install_attention(setting)
    order = torch._C._get_sdp_priority_order()
    assert order[:4] == [int(k) for k in kernel_order(setting)]


def test_install_is_not_a_silent_no_op_on_pytorchs_default_order() -> None:
    # PyTorch's own default ranks memory-efficient before cuDNN; merely enabling kernels would leave it so.
    default = read_flags()
    assert default.order.index(int(B.EFFICIENT_ATTENTION)) < default.order.index(int(B.CUDNN_ATTENTION))
    install_attention("auto")
    order = torch._C._get_sdp_priority_order()
    assert order.index(int(B.CUDNN_ATTENTION)) < order.index(int(B.EFFICIENT_ATTENTION))


@pytest.mark.parametrize("setting", ATTENTION_SETTINGS)
def test_a_pin_is_never_exclusive(setting: str) -> None:
    install_attention(setting)
    assert read_flags().enabled >= {B.FLASH_ATTENTION, B.CUDNN_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH}


@pytest.mark.parametrize("setting", ATTENTION_SETTINGS)
def test_overrideable_stays_enabled_and_ranked_after_math(setting: str) -> None:
    # XPU ignores the order but honours the flags: disabling OVERRIDEABLE would send every XPU call to math,
    # and CUDA raises "Invalid backend" if it meets an enabled OVERRIDEABLE before math.
    install_attention(setting)
    order = torch._C._get_sdp_priority_order()
    assert torch._C._get_overrideable_sdp_enabled()
    assert order[-1] == int(B.OVERRIDEABLE)
    assert order.index(int(B.MATH)) < order.index(int(B.OVERRIDEABLE))


def test_install_rebinds_sdpa_once_and_is_idempotent() -> None:
    original = F.scaled_dot_product_attention
    install_attention("efficient")
    wrapper = F.scaled_dot_product_attention
    assert wrapper is not original
    install_attention("efficient")
    assert F.scaled_dot_product_attention is wrapper


def test_installing_another_setting_replaces_the_first_and_still_undoes_to_the_original() -> None:
    original, before = F.scaled_dot_product_attention, torch._C._get_sdp_priority_order()
    install_attention("efficient")
    install_attention("math")
    assert torch._C._get_sdp_priority_order()[0] == int(B.MATH)
    uninstall_attention()
    assert F.scaled_dot_product_attention is original
    assert torch._C._get_sdp_priority_order() == before


def test_uninstall_restores_the_function_object_flags_and_order_exactly() -> None:
    # A non-default prior state: flash disabled and a custom order, as another library might have left it.
    custom = read_flags()
    custom = type(custom)(custom.enabled - {B.FLASH_ATTENTION}, (0, 3, 2, 1, 4))
    apply_flags(custom)
    original = F.scaled_dot_product_attention
    install_attention("cudnn")
    uninstall_attention()
    assert F.scaled_dot_product_attention is original
    assert read_flags() == custom


def test_uninstall_without_install_does_nothing() -> None:
    before = read_flags()
    uninstall_attention()
    assert read_flags() == before


@pytest.mark.parametrize("setting", ["efficient", "cudnn"])
def test_a_pinned_kernel_the_cpu_lacks_still_completes(setting: str, qkv) -> None:  # type: ignore[no-untyped-def]
    # Pinning EFFICIENT or CUDNN alone on CPU raises "No viable backend"; the ranked list must not.
    q, k, v = qkv(1, 2, 16, 8)
    install_attention(setting)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v), _math_reference(q, k, v))


CALLS = {
    "plain": ((), {}),
    "positional mask and causal flag": ((None, 0.0, True), {}),
    "bool mask": ((), {"attn_mask": torch.rand(1, 1, 16, 16) > 0.3}),
    "additive mask": ((), {"attn_mask": torch.randn(1, 2, 16, 16)}),
    "causal keyword": ((), {"is_causal": True}),
    "scale": ((), {"scale": 0.3}),
}


@pytest.mark.parametrize("setting", ["auto", "efficient"])
@pytest.mark.parametrize("name", CALLS)
def test_the_patched_function_computes_what_sdpa_computes(setting: str, name: str, qkv) -> None:  # type: ignore[no-untyped-def]
    q, k, v = qkv(1, 2, 16, 8)
    args, kwargs = CALLS[name]
    expected = F.scaled_dot_product_attention(q, k, v, *args, **kwargs)
    install_attention(setting)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, *args, **kwargs), expected)


def test_grouped_query_attention_passes_through(qkv) -> None:  # type: ignore[no-untyped-def]
    q = torch.randn(1, 8, 16, 8)
    _, k, v = qkv(1, 2, 16, 8)
    expected = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    install_attention("auto")
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, enable_gqa=True), expected)


def test_the_signature_is_sdpas_with_keyword_only_scale_and_enable_gqa() -> None:
    install_attention("auto")
    parameters = inspect.signature(F.scaled_dot_product_attention).parameters
    assert list(parameters) == ["query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"]
    assert parameters["scale"].kind is inspect.Parameter.KEYWORD_ONLY
    assert parameters["enable_gqa"].kind is inspect.Parameter.KEYWORD_ONLY
    assert [parameters[n].default for n in ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")] == [
        None,
        0.0,
        False,
        None,
        False,
    ]


def _error_of(call) -> tuple[type[BaseException], str]:  # type: ignore[no-untyped-def]
    with pytest.raises(Exception) as error:
        call()
    return type(error.value), str(error.value)


@pytest.mark.parametrize(
    "bad_call",
    [
        lambda f, q: f(q, q[:, :, :, :4], q),
        lambda f, q: f(q, q, q, None, 0.0, False, 1.0),
        lambda f, q: f(q, q, q, torch.ones(3, 3), 0.0, False),
        lambda f, q: f(q, q, q, None, 0.0, True, scale="big"),
        lambda f, q: f(q, q),
    ],
)
def test_errors_are_pytorchs_own(bad_call) -> None:  # type: ignore[no-untyped-def]
    q = torch.randn(1, 2, 16, 8)
    expected = _error_of(lambda: bad_call(F.scaled_dot_product_attention, q))
    install_attention("efficient")
    got = _error_of(lambda: bad_call(F.scaled_dot_product_attention, q))
    assert got[0] is expected[0]
    # Word for word, except Python's own wording of a missing argument (PyTorch's binding says "arguments").
    assert got[1] == expected[1] or ("missing 1 required positional" in got[1] and "value" in got[1])


def test_serving_kernel_on_cpu_is_pytorchs_cpu_choice() -> None:
    install_attention("math")  # CPU ignores the order: flash still serves 4-D calls, math serves dropout
    q = torch.randn(1, 2, 16, 8)
    assert serving_kernel(q, q, q) is B.FLASH_ATTENTION
    assert serving_kernel(q, q, q, dropout_p=0.5) is B.MATH
    assert serving_kernel(q[0], q[0], q[0]) is B.MATH


def test_stats_report_setting_and_installed_order() -> None:
    install_attention("cudnn", device="cpu")
    stats = attention_stats()
    assert stats.setting == "cudnn"
    assert stats.order == ["CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"]
    assert stats.torch_priority_order[:4] == stats.order
    assert stats.probe is None  # CPU


@pytest.fixture
def probed(monkeypatch: pytest.MonkeyPatch) -> list[torch.device]:
    """The devices install_attention probed, in order (the probe answers None, as on a CPU-only machine)."""
    seen: list[torch.device] = []

    def spy(device: torch.device) -> None:
        seen.append(device)

    monkeypatch.setattr(install_module, "probe_kernels", spy)
    return seen


def test_a_reinstall_on_another_device_probes_that_device(probed: list[torch.device]) -> None:
    install_attention("auto", device="cpu")
    first = F.scaled_dot_product_attention
    install_attention("auto", device="cuda:1")
    assert probed == [torch.device("cpu"), torch.device("cuda", 1)]
    assert attention_stats().device == "cuda:1"
    assert F.scaled_dot_product_attention is not first
    install_attention("auto", device="cuda:1")
    assert len(probed) == 2


def test_cuda_and_cuda_0_are_one_device(probed: list[torch.device]) -> None:
    install_attention("auto", device="cuda")
    wrapper = F.scaled_dot_product_attention
    install_attention("auto", device="cuda:0")
    install_attention("auto", device=torch.device("cuda", 0))
    assert probed == [torch.device("cuda", 0)]
    assert F.scaled_dot_product_attention is wrapper


def test_a_device_without_an_index_is_the_current_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert devices.canonical_device("cuda") == torch.device("cuda", 1)
    assert devices.canonical_device("cuda:0") == torch.device("cuda", 0)
    assert devices.canonical_device("cpu") == torch.device("cpu")
    assert devices.canonical_device(torch.device("mps")) == torch.device("mps")


def test_install_compares_devices_as_the_canonical_device_spells_them(
    probed: list[torch.device], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Whatever "the current device" is, install asks devices.canonical_device, so two spellings of it are one.
    monkeypatch.setattr(devices, "canonical_device", lambda device: torch.device("cuda", 1))
    install_attention("auto", device="cuda")
    wrapper = F.scaled_dot_product_attention
    install_attention("auto", device="cuda:1")
    assert probed == [torch.device("cuda", 1)]
    assert F.scaled_dot_product_attention is wrapper


def _binds_sdpa_at_import(tree: ast.Module) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and any(a.name == "scaled_dot_product_attention" for a in node.names):
            found.append(f"line {node.lineno}: from {node.module} import scaled_dot_product_attention")
    for node in tree.body:  # module level only: a function reading F.scaled_dot_product_attention at call time is fine
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        value = getattr(node, "value", None)
        if targets and isinstance(value, ast.Attribute) and value.attr == "scaled_dot_product_attention":
            found.append(f"line {node.lineno}: module-level alias of scaled_dot_product_attention")
    return found


def test_no_module_of_the_package_binds_sdpa_at_import_time() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): hits
        for path in PACKAGE.rglob("*.py")
        if (hits := _binds_sdpa_at_import(ast.parse(path.read_text(), str(path))))
    }
    assert offenders == {}


def test_the_import_check_catches_a_bound_name() -> None:
    tree = ast.parse(
        "from torch.nn.functional import scaled_dot_product_attention\nsdpa = F.scaled_dot_product_attention\n"
    )
    assert len(_binds_sdpa_at_import(tree)) == 2
