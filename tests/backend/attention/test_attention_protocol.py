"""SDPA's contract kept by the patched function: PyTorch's override protocol (`__torch_function__`), PyTorch's own
argument errors, routing and counting the call that really runs (against the CPU's real dispatcher), and
torch.compile / jit.trace / export of code that calls it."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend as B
from torch.nn.attention.bias import causal_lower_right, causal_upper_left
from torch.overrides import TorchFunctionMode
from torch.profiler import profile

from invokeai.backend.attention import attention_caller, attention_stats, install_attention, serving_kernel
from invokeai.backend.attention.benchmarking import sdpa_window
from invokeai.backend.attention.testing import StandInDispatcher

# PyTorch's own binding, whatever is in place of F.scaled_dot_product_attention when this module loads.
UNPATCHED = torch._C._nn.scaled_dot_product_attention

# The aten kernels the CPU runs; a profile names the one that served a call.
ATEN_KERNELS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "FLASH_ATTENTION",
    "aten::_scaled_dot_product_attention_math": "MATH",
}


def _kernels_that_ran(call: Callable[[], Any]) -> list[str]:
    with profile() as prof:
        call()
    return sorted({ATEN_KERNELS[e.name] for e in prof.events() if e.name in ATEN_KERNELS})


def _error_of(call: Callable[[], Any]) -> tuple[type[BaseException], str]:
    with pytest.raises(Exception) as error:
        call()
    return type(error.value), str(error.value)


@pytest.fixture(params=["auto", "pinned on a stand-in GPU"])
def install(request, dispatcher) -> Callable[[], None]:  # type: ignore[no-untyped-def]
    """Installs auto on the CPU's own dispatcher, or efficient pinned on a "GPU" whose dispatcher offers flash and
    math (the report layer is composed, and the pinned kernel cannot serve). A test computes its references before
    it installs: CausalBias computes its own attention only for the function in place of SDPA, so once the patch is
    in place, PyTorch's binding called with a CausalBias mask no longer applies the mask."""
    if request.param == "auto":
        return lambda: install_attention("auto", device="cpu")
    request.getfixturevalue("stand_in_gpu")
    dispatcher("FLASH_ATTENTION", "MATH")
    return lambda: install_attention("efficient", device="cpu")


def _total_calls() -> int:
    return sum(sum(per_node.values()) for per_node in attention_stats().counts.values())


# Override protocol.


def _seeded(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# Query and key lengths differ, so the two causal variants differ from each other and from no mask.
Q, K, V = _seeded(1, 2, 4, 8, seed=0), _seeded(1, 2, 6, 8, seed=1), _seeded(1, 2, 6, 8, seed=2)


@pytest.mark.parametrize("bias", [causal_lower_right, causal_upper_left], ids=["lower_right", "upper_left"])
def test_causal_bias_masks_give_the_unpatched_result(bias, install) -> None:  # type: ignore[no-untyped-def]
    expected = UNPATCHED(Q, K, V, attn_mask=bias(4, 6))
    assert not torch.allclose(expected, UNPATCHED(Q, K, V)), "the mask must matter for the test to mean anything"
    install()
    torch.testing.assert_close(F.scaled_dot_product_attention(Q, K, V, attn_mask=bias(4, 6)), expected)
    # CausalBias calls SDPA back with a plain mask (or is_causal) on the CPU: that call is the one counted.
    assert _total_calls() == 1


class _Recorder(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.funcs: list[Any] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.funcs.append(func)
        return func(*args, **(kwargs or {}))


def test_a_torch_function_mode_sees_one_sdpa_call_per_call_and_no_dispatcher_query(install) -> None:  # type: ignore[no-untyped-def]
    install()
    mode = _Recorder()
    with mode:
        F.scaled_dot_product_attention(Q, K, V)
        F.scaled_dot_product_attention(Q, K, V, is_causal=True)
    names = [getattr(func, "__name__", str(func)) for func in mode.funcs]
    assert [func is F.scaled_dot_product_attention for func in mode.funcs] == [True, True], names
    assert not any("fused_sdp_choice" in name for name in names)
    # The mode handed each call on to the patched SDPA, which ran and counted it.
    assert _total_calls() == 2


class _SkipAttentionScores(TorchFunctionMode):
    """diffusers' AttentionScoreSkipFunctionMode (layer skip, perturbed-attention guidance), which this torch-only
    suite cannot import: an SDPA call whose query and value lengths match returns the value."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            query = kwargs.get("query", args[0] if args else None)
            value = kwargs.get("value", args[2] if len(args) > 2 else None)
            if query.shape[2] == value.shape[2]:
                return value
        return func(*args, **kwargs)


def test_the_layer_skip_mode_skips_the_attention_scores(install) -> None:  # type: ignore[no-untyped-def]
    q, k, v = (torch.randn(1, 2, 6, 8) for _ in range(3))
    expected = UNPATCHED(Q, K, V)
    install()
    with _SkipAttentionScores():
        assert F.scaled_dot_product_attention(q, k, v) is v
        # Unequal lengths: the mode lets the call through, and it computes what SDPA computes.
        torch.testing.assert_close(F.scaled_dot_product_attention(Q, K, V), expected)
    assert _total_calls() == 1  # the skipped call ran no kernel


class _Tagged(torch.Tensor):
    seen: ClassVar[list[Any]] = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


def test_a_tensor_subclass_gets_the_call(install) -> None:  # type: ignore[no-untyped-def]
    expected = UNPATCHED(Q, K, V)
    install()
    _Tagged.seen = []
    out = F.scaled_dot_product_attention(Q.as_subclass(_Tagged), K, V)
    assert _Tagged.seen and _Tagged.seen[0] is F.scaled_dot_product_attention
    assert not any("fused_sdp_choice" in getattr(func, "__name__", "") for func in _Tagged.seen)
    assert type(out) is _Tagged
    torch.testing.assert_close(out.as_subclass(torch.Tensor), expected)


# Argument checks.

BAD_FLAGS = {
    "is_causal=0": {"is_causal": 0},
    "enable_gqa=None": {"enable_gqa": None},
    "dropout_p=None": {"dropout_p": None},
}


@pytest.mark.parametrize("name", BAD_FLAGS)
def test_a_bad_flag_raises_pytorchs_own_type_error(name: str, install) -> None:  # type: ignore[no-untyped-def]
    expected = _error_of(lambda: UNPATCHED(Q, K, V, **BAD_FLAGS[name]))
    assert expected[0] is TypeError
    install()
    assert _error_of(lambda: F.scaled_dot_product_attention(Q, K, V, **BAD_FLAGS[name])) == expected
    assert _total_calls() == 0


@pytest.mark.parametrize("args", [(None, None), (None, 0.0, 0)], ids=["dropout_p=None", "is_causal=0"])
def test_a_bad_flag_passed_by_position_raises_the_same_type_error(args: tuple[Any, ...], install) -> None:  # type: ignore[no-untyped-def]
    # A Python function cannot tell how an argument was passed, and the patch passes the flags by keyword on the
    # error path, so PyTorch's message lacks the position it names for the unpatched call; the rest is word for word.
    expected = _error_of(lambda: UNPATCHED(Q, K, V, *args))
    install()
    got = _error_of(lambda: F.scaled_dot_product_attention(Q, K, V, *args))
    assert got[0] is expected[0] is TypeError
    assert got[1] == re.sub(r" \(position \d+\)", "", expected[1])


def test_numbers_pytorch_accepts_for_a_float_still_work(install) -> None:  # type: ignore[no-untyped-def]
    expected = UNPATCHED(Q, K, V, scale=1.0)
    install()
    for dropout_p in (0, torch.tensor(0.0)):
        torch.testing.assert_close(F.scaled_dot_product_attention(Q, K, V, dropout_p=dropout_p, scale=1), expected)


def test_a_shape_error_keeps_its_wording(install) -> None:  # type: ignore[no-untyped-def]
    bad_key = torch.randn(1, 2, 6, 7)
    expected = _error_of(lambda: UNPATCHED(Q, bad_key, V))
    install()
    assert _error_of(lambda: F.scaled_dot_product_attention(Q, bad_key, V)) == expected
    assert _total_calls() == 0


# The router asks PyTorch's dispatcher about the real call.

G8, G2 = torch.randn(1, 8, 16, 32), torch.randn(1, 2, 16, 32)
REAL_CALLS: dict[str, tuple[tuple[torch.Tensor, ...], dict[str, Any]]] = {
    "grouped-query": ((G8, G2, G2), {"enable_gqa": True}),
    "grouped-query causal": ((G8, G2, G2), {"enable_gqa": True, "is_causal": True}),
    "grouped-query bool mask": ((G8, G2, G2), {"enable_gqa": True, "attn_mask": torch.ones(16, 16).bool().tril()}),
    "additive mask": ((G8, G8, G8), {"attn_mask": torch.zeros(1, 1, 16, 16)}),
    "dropout": ((G8, G8, G8), {"dropout_p": 0.5}),
    "3-D": ((torch.randn(8, 16, 32),) * 3, {}),
}


@pytest.mark.parametrize("name", REAL_CALLS)
def test_serving_kernel_and_the_count_are_the_cpu_dispatchers_choice_and_the_kernel_that_ran(name: str) -> None:
    # No stand-in: the CPU's own dispatcher, which answers differently with and without enable_gqa.
    install_attention("auto", device="cpu")
    args, kwargs = REAL_CALLS[name]
    choice = B(torch._fused_sdp_choice(*args, **kwargs)).name
    assert serving_kernel(*args, **kwargs).name == choice
    with attention_caller("real_call"):
        ran = _kernels_that_ran(lambda: F.scaled_dot_product_attention(*args, **kwargs))
    assert ran == [choice]
    assert attention_stats().counts == {"real_call": {choice: 1}}


def test_the_cpu_dispatcher_answers_differently_without_enable_gqa() -> None:
    # What makes the tests above catch a router that drops enable_gqa.
    assert B(torch._fused_sdp_choice(G8, G2, G2)) == B.MATH
    assert B(torch._fused_sdp_choice(G8, G2, G2, enable_gqa=True)) == B.FLASH_ATTENTION


def _gpu_rules() -> dict[str, Callable[..., bool]]:
    """A GPU whose flash takes only unmasked, non-causal calls of equal heads and lengths; cuDNN takes bool masks
    and grouped-query calls; math takes everything."""
    return {
        "FLASH_ATTENTION": lambda call: (
            not call.enable_gqa
            and not call.is_causal
            and call.attn_mask is None
            and call.query.shape[-2] == call.key.shape[-2]
        ),
        "CUDNN_ATTENTION": lambda call: call.attn_mask is None or call.attn_mask.dtype == torch.bool,
        "MATH": lambda call: True,
    }


STAND_IN_CALLS: dict[str, tuple[tuple[torch.Tensor, ...], dict[str, Any], B]] = {
    "plain": ((G8, G8, G8), {}, B.FLASH_ATTENTION),
    "grouped-query": ((G8, G2, G2), {"enable_gqa": True}, B.CUDNN_ATTENTION),
    "causal": ((G8, G8, G8), {"is_causal": True}, B.CUDNN_ATTENTION),
    "bool mask": ((G8, G8, G8), {"attn_mask": torch.ones(16, 16).bool()}, B.CUDNN_ATTENTION),
    "additive mask": ((G8, G8, G8), {"attn_mask": torch.zeros(16, 16)}, B.MATH),
    "unequal lengths": ((G8, torch.randn(1, 8, 12, 32), torch.randn(1, 8, 12, 32)), {}, B.CUDNN_ATTENTION),
    "scale and dropout": ((G8, G8, G8), {"scale": 0.5, "dropout_p": 0.25}, B.FLASH_ATTENTION),
}


@pytest.mark.parametrize("name", STAND_IN_CALLS)
def test_the_router_passes_every_argument_to_the_dispatcher(name: str, dispatcher) -> None:  # type: ignore[no-untyped-def]
    stand_in: StandInDispatcher = dispatcher(_gpu_rules())
    install_attention("auto", device="cpu")
    args, kwargs, expected = STAND_IN_CALLS[name]
    assert serving_kernel(*args, **kwargs) is expected
    asked = stand_in.last
    assert asked is not None
    assert (asked.query, asked.key, asked.value) == args
    assert asked.attn_mask is kwargs.get("attn_mask")
    assert asked.dropout_p == kwargs.get("dropout_p", 0.0)
    assert asked.is_causal is kwargs.get("is_causal", False)
    assert asked.scale == kwargs.get("scale")
    assert asked.enable_gqa is kwargs.get("enable_gqa", False)


# torch.compile, jit.trace and export.


class _Attend(torch.nn.Module):
    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(query, key, value, is_causal=True) * 2.0


CAUSAL_QKV = tuple(_seeded(1, 2, 8, 16, seed=seed) for seed in range(3))


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compile_with_fullgraph_works_with_the_patch_and_matches_eager(fresh_dynamo) -> None:  # type: ignore[no-untyped-def]
    module = _Attend()
    eager = module(*CAUSAL_QKV)
    install_attention("auto", device="cpu")
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(*CAUSAL_QKV), eager)
    # The graph holds the kernel PyTorch's dispatcher chose under the installed flags. Compiled calls are not
    # counted (docs/attention.md).
    assert _kernels_that_ran(lambda: compiled(*CAUSAL_QKV)) == ["FLASH_ATTENTION"]
    assert attention_stats().counts == {}


def test_compiled_code_dispatches_under_the_flags_in_force(fresh_dynamo) -> None:  # type: ignore[no-untyped-def]
    # The eager backend keeps SDPA as one op in the graph, so PyTorch picks its kernel each time the graph runs.
    install_attention("auto", device="cpu")
    compiled = torch.compile(_Attend(), fullgraph=True, backend="eager")
    with sdpa_window("math"):
        assert _kernels_that_ran(lambda: compiled(*CAUSAL_QKV)) == ["MATH"]
    assert _kernels_that_ran(lambda: compiled(*CAUSAL_QKV)) == ["FLASH_ATTENTION"]


def test_compiled_code_does_not_take_a_windows_lock(fresh_dynamo) -> None:  # type: ignore[no-untyped-def]
    # docs/attention.md: a compiled graph's SDPA op is PyTorch's own, so another thread's compiled call runs while a
    # window is open (it does not wait for the window's lock), under the flags in force when its kernel is chosen.
    install_attention("auto", device="cpu")
    compiled = torch.compile(_Attend(), fullgraph=True, backend="eager")
    compiled(*CAUSAL_QKV)  # compiled outside the window
    done = threading.Event()

    def run_compiled() -> None:
        compiled(*CAUSAL_QKV)
        done.set()

    with sdpa_window("math"):
        other = threading.Thread(target=run_compiled)
        other.start()
        ran_inside_the_window = done.wait(5.0)
    other.join(5.0)
    assert ran_inside_the_window, "a compiled call waited for the window's lock"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.jit.trace is deprecated, and still in use
def test_jit_trace_records_the_aten_op() -> None:
    module = _Attend()
    eager = module(*CAUSAL_QKV)
    install_attention("auto", device="cpu")
    traced = torch.jit.trace(module, CAUSAL_QKV)
    assert "aten::scaled_dot_product_attention" in str(traced.graph)
    torch.testing.assert_close(traced(*CAUSAL_QKV), eager)


def test_export_records_the_aten_op() -> None:
    module = _Attend()
    eager = module(*CAUSAL_QKV)
    install_attention("auto", device="cpu")
    exported = torch.export.export(module, CAUSAL_QKV)
    ops = [node.target for node in exported.graph.nodes if node.op == "call_function"]
    assert torch.ops.aten.scaled_dot_product_attention.default in ops
    # Exporting (non-strict, torch's default) takes the compiled path: no dispatcher query left in the graph, and
    # nothing counted for the tracing call.
    assert torch.ops.aten._fused_sdp_choice.default not in ops
    assert attention_stats().counts == {}
    torch.testing.assert_close(exported.module()(*CAUSAL_QKV), eager)


def _random_calls(count: int, seed: int) -> Iterator[tuple[tuple[torch.Tensor, ...], dict[str, Any]]]:
    """Calls drawn at random over what SDPA takes: 3-D or 4-D, grouped or not, lengths that differ, bool, additive
    and broadcast masks, causal, scale, and some that PyTorch refuses (mismatched head_dims or batches, a mask with
    is_causal, grouped heads without enable_gqa)."""
    rng = torch.Generator().manual_seed(seed)

    def pick(*options: Any) -> Any:
        return options[int(torch.randint(len(options), (1,), generator=rng))]

    for _ in range(count):
        batch, heads, q_len, k_len, dim = pick(1, 2), pick(1, 2, 4), pick(1, 5, 16), pick(1, 7, 16), pick(4, 8, 33)
        kv_heads = pick(heads, 1, max(1, heads // 2))
        q = torch.randn(batch, heads, q_len, dim, generator=rng)
        k = torch.randn(pick(batch, batch + 1), kv_heads, k_len, pick(dim, dim, dim + 1), generator=rng)
        v = torch.randn(k.shape[0], kv_heads, k_len, dim, generator=rng)
        if pick(False, True, True, True):
            q, k, v = (t.flatten(0, 1) for t in (q, k, v)) if pick(False, True) else (q, k, v)
        kwargs: dict[str, Any] = {}
        mask_kind = pick(None, None, "bool", "additive", "broadcast")
        if mask_kind == "bool":
            kwargs["attn_mask"] = torch.rand(q_len, k_len, generator=rng) > 0.2
        elif mask_kind == "additive":
            kwargs["attn_mask"] = torch.randn(q_len, k_len, generator=rng)
        elif mask_kind == "broadcast":
            kwargs["attn_mask"] = torch.zeros(1, 1, 1, k_len)
        if pick(False, True):
            kwargs["is_causal"] = True
        if pick(False, True):
            kwargs["scale"] = float(pick(0.1, 1.0, 3.0))
        if kv_heads != heads and pick(True, True, False):
            kwargs["enable_gqa"] = True
        yield (q, k, v), kwargs


def _outcome(function: Callable[..., torch.Tensor], args: tuple[torch.Tensor, ...], kwargs: dict[str, Any]) -> Any:
    try:
        return function(*args, **kwargs)
    except Exception as error:  # the exact error is part of the contract
        return (type(error), str(error))


def test_random_calls_give_what_unpatched_sdpa_gives(install) -> None:  # type: ignore[no-untyped-def]
    calls = list(_random_calls(300, seed=15))
    expected = [_outcome(UNPATCHED, args, kwargs) for args, kwargs in calls]
    refused = sum(isinstance(outcome, tuple) for outcome in expected)
    assert 20 < refused < 280, "the draw must hold both calls PyTorch takes and calls it refuses"
    install()
    for (args, kwargs), want in zip(calls, expected, strict=True):
        got = _outcome(F.scaled_dot_product_attention, args, kwargs)
        if isinstance(want, tuple):
            assert got == want, kwargs
        else:
            assert isinstance(got, torch.Tensor), (got, kwargs)
            torch.testing.assert_close(got, want, msg=lambda m, kwargs=kwargs: f"{kwargs}: {m}")
    # Every call PyTorch took was counted once, and none it refused.
    assert _total_calls() == len(calls) - refused
