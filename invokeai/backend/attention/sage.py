"""The SageAttention layer (`attention_backend: sage`): which calls it takes, and calling it without surprises.

Sage has no mask parameter (sageattention 1.0.6 swallows an `attn_mask=` into **kwargs), supports only some head
sizes, and 1.0.6 subtracts the key mean in place on the caller's tensor. So it takes a call only when every
condition below holds, and the key smoothing is done here out of place: subtracting a per-row constant from the
scores does not change the softmax, so the result is the same and the caller's key is never touched. If it fails
at run time (a Triton build error, an unsupported GPU), it is switched off for the process and the call runs on
auto's order.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from invokeai.backend import devices
from invokeai.backend.attention import stats
from invokeai.backend.attention.caller import current_node_type
from invokeai.backend.attention.layer import Call, Claim, Layer, Rebuild, is_out_of_memory
from invokeai.backend.attention.memory import PricedCall
from invokeai.backend.attention.state import AttentionState

logger = logging.getLogger(__name__)

SAGE = "sage"
SAGE_HEAD_DIMS = frozenset({64, 96, 128})
SAGE_DTYPES = frozenset({torch.float16, torch.bfloat16})
# Below this query length the kernel's quantisation setup outweighs its speed-up; not yet measured on a GPU
# here (see docs/attention.md), 1024 is the conservative starting point.
SAGE_MIN_QUERY_LEN = 1024
_REQUIRED_PARAMETERS = ("tensor_layout", "is_causal", "sm_scale")


class SageKernel:
    def __init__(self, function: Callable[..., torch.Tensor], version: str) -> None:
        self.function = function
        self.version = version
        parameters = inspect.signature(function).parameters
        missing = [name for name in _REQUIRED_PARAMETERS if name not in parameters]
        if missing:
            raise ImportError(f"sageattention {version}: sageattn has no parameter {', '.join(missing)}")
        self.smooths_key_in_place = "smooth_k" in parameters
        self.supports_gqa = int(version.split(".")[0]) >= 2 if version[:1].isdigit() else False

    def takes(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        dropout_p: float,
        is_causal: bool,
        enable_gqa: bool,
    ) -> bool:
        if attn_mask is not None or dropout_p or not devices.is_sage_tensor(query):
            return False
        if query.dim() != 4 or key.dim() != 4 or value.shape != key.shape or query.shape[0] != key.shape[0]:
            return False
        if key.dtype != query.dtype or value.dtype != query.dtype or key.shape[-1] != query.shape[-1]:
            return False
        _, q_heads, q_len, head_dim = query.shape
        return self.fits(query.dtype, head_dim, q_heads, key.shape[1], q_len, key.shape[2], is_causal, enable_gqa)

    def fits(
        self,
        dtype: torch.dtype,
        head_dim: int,
        q_heads: int,
        kv_heads: int,
        q_len: int,
        k_len: int,
        is_causal: bool,
        enable_gqa: bool,
    ) -> bool:
        """The shape rules, for an unmasked CUDA call without dropout (also what the memory pricing asks)."""
        if dtype not in SAGE_DTYPES or head_dim not in SAGE_HEAD_DIMS:
            return False
        if q_heads != kv_heads and not (enable_gqa and self.supports_gqa and q_heads % kv_heads == 0):
            return False
        # Sage and PyTorch align a causal mask differently when the lengths differ; only equal lengths agree.
        if is_causal and q_len != k_len:
            return False
        return q_len >= SAGE_MIN_QUERY_LEN

    def __call__(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, is_causal: bool, scale: float | None
    ) -> torch.Tensor:
        if self.smooths_key_in_place:
            key = key - key.mean(dim=-2, keepdim=True)
            return self.function(
                query, key, value, tensor_layout="HND", is_causal=is_causal, sm_scale=scale, smooth_k=False
            )
        return self.function(query, key, value, tensor_layout="HND", is_causal=is_causal, sm_scale=scale)


def load_sage() -> SageKernel | None:
    """The installed sageattention, or None (with the reason logged) when it does not import or does not fit."""
    try:
        module: Any = importlib.import_module("sageattention")
        try:
            version = importlib.metadata.version("sageattention")
        except importlib.metadata.PackageNotFoundError:
            version = str(getattr(module, "__version__", "0"))
        return SageKernel(module.sageattn, version)
    except Exception as error:
        logger.warning(
            "attention_backend 'sage' is set but sageattention is not usable (%s); every call uses auto's order "
            "(install it with: pip install 'invokeai[sage]')",
            error,
        )
        return None


def give_up_sage(
    state: AttentionState, error: Exception, rebuild: Rebuild, installation: int
) -> Callable[..., torch.Tensor]:
    """Sage failed at run time: auto's order serves every call from now on. Returns the SDPA to retry with.

    `installation` is the install the failed call ran under: if it is gone (uninstalled or replaced while the call
    ran), rebuilding would put a patched SDPA back after an exact undo, so the call is retried on whatever SDPA is
    in place now."""
    with state.lock:
        if state.installation != installation:
            return F.scaled_dot_product_attention
        if state.sage is not None:
            first_line = stats.record_event("sage_disabled", error)
            logger.warning(
                "SageAttention failed in %s: %s. It is switched off for the rest of this process; attention "
                "runs on auto's order.",
                current_node_type(),
                first_line,
            )
            state.sage = None
            return rebuild()
        assert state.public is not None
        return state.public


class Sage(Layer):
    name = "sage"

    def active(self, state: AttentionState) -> bool:
        return state.sage is not None

    def claim(self, state: AttentionState) -> Claim | None:
        assert state.sage is not None
        takes = state.sage.takes

        def sage_route(q, k, v, m, d, c, g):  # type: ignore[no-untyped-def]
            return SAGE if takes(q, k, v, m, d, c, g) else None

        return sage_route

    def wrap(self, state: AttentionState, inner: Call, rebuild: Rebuild) -> Call:
        sage = state.sage
        count = stats.count
        installation = state.installation

        def sage_call(route, q, k, v, m, d, c, s, g):  # type: ignore[no-untyped-def]
            if route is not SAGE:
                return inner(route, q, k, v, m, d, c, s, g)
            try:
                out = sage(q, k, v, c, s)
            except Exception as error:
                if is_out_of_memory(error):
                    raise
                retry = give_up_sage(state, error, rebuild, installation)
            else:
                count(SAGE)
                return out
            return retry(q, k, v, m, d, c, scale=s, enable_gqa=g)

        return sage_call

    def price(self, state: AttentionState, call: PricedCall, inner: Callable[[], int]) -> int:
        """Sage materialises no score matrix; a call it would not take is priced on the kernel that serves it."""
        sage = state.sage
        if (
            sage is not None
            and not call.has_attn_mask
            and devices.is_sage_device(call.device)
            and sage.fits(
                call.dtype,
                call.head_dim,
                call.num_heads,
                call.kv_heads,
                call.query_len,
                call.key_len,
                call.is_causal,
                call.grouped,
            )
        ):
            return 0
        return inner()
