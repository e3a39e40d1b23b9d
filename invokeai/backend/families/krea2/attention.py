"""Krea-2 attention that keeps grouped-query K/V grouped only when that is the better kernel choice.

diffusers' Krea2AttnProcessor always repeats the key/value heads up to the query heads before SDPA: every kernel
accepts that, but it copies K/V on every call. PyTorch can instead take the grouped heads (`enable_gqa=True`), and
which of the two calls gets the better kernel depends on the build, the device, the installed attention order and
any INVOKE_KREA2_SDPA_BACKEND window. Per call shape this processor asks the dispatcher (`serving_kernel`) about both:

- expand when the expanded call is served by a kernel ranked higher than the grouped call's (e.g. a pinned
  memory-efficient kernel, which refuses `enable_gqa`, while cuDNN takes the grouped call);
- otherwise keep the heads grouped only when a fused kernel serves the grouped call; on math (or no kernel at all)
  expand, because math would re-expand K/V itself (on ROCm once per chunk) or materialise the score matrix.

The answer depends only on the call's shapes/dtypes/mask and on PyTorch's kernel flags, priority order and the SDPA
function in place, so it is cached per (shape signature, attention state) instead of asked on every call.
Everything else (projections, norms, rotary embedding, gate, output) is the stock processor's computation.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import Any

import torch
import torch.nn.functional as F
from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry, dispatch_attention_fn
from diffusers.models.embeddings import apply_rotary_emb
from diffusers.models.transformers.transformer_krea2 import Krea2Attention, Krea2AttnProcessor
from torch.nn.attention import SDPBackend

from invokeai.backend.attention import serving_kernel

GROUPED = "grouped"
EXPANDED = "expanded"

# The kernels whose grouped-query path avoids the K/V copy; MATH repeats K/V internally, ERROR means no kernel.
_NOT_FUSED = (SDPBackend.MATH, SDPBackend.ERROR)
_FLAG_READERS = (
    torch._C._get_flash_sdp_enabled,
    torch._C._get_cudnn_sdp_enabled,
    torch._C._get_mem_efficient_sdp_enabled,
    torch._C._get_math_sdp_enabled,
)


def attention_state() -> Hashable:
    """What the dispatcher's answer depends on besides the call: PyTorch's kernel flags and priority order, and the
    SDPA function in place (the attention policy rebinds it whenever its layers change). About 1 us to read."""
    return (
        tuple(read() for read in _FLAG_READERS),
        tuple(torch._C._get_sdp_priority_order()),
        id(F.scaled_dot_product_attention),
    )


def kernel_rank(kernel: SDPBackend | str, order: list[int]) -> int:
    """Position of a serving kernel in PyTorch's priority order (lower is better). Sage outranks every PyTorch
    kernel (the policy only routes a call to it when it is preferred); no kernel ranks last."""
    if kernel == "sage":
        return -1
    if not isinstance(kernel, SDPBackend) or kernel == SDPBackend.ERROR or int(kernel) not in order:
        return len(order)
    return order.index(int(kernel))


def choose_layout(grouped: SDPBackend | str, expanded: SDPBackend | str, order: list[int]) -> str:
    """GROUPED or EXPANDED from the kernels that would serve the grouped and the expanded call."""
    if kernel_rank(expanded, order) < kernel_rank(grouped, order):
        return EXPANDED
    return GROUPED if grouped not in _NOT_FUSED else EXPANDED


def _sdpa_layout(tensor: torch.Tensor) -> torch.Tensor:
    # The processor holds (batch, seq, heads, head_dim); diffusers' native backend hands SDPA (batch, heads, seq, dim).
    return tensor.permute(0, 2, 1, 3)


def _uses_torch_sdpa(processor: Krea2AttnProcessor) -> bool:
    """Only PyTorch's SDPA (diffusers' native backend, no context parallelism) takes grouped heads as asked here."""
    if processor._parallel_config is not None:
        return False
    backend = processor._attention_backend
    if backend is None:
        backend = _AttentionBackendRegistry.get_active_backend()[0]
    # A str enum: plain strings from set_attention_backend compare equal too.
    return backend == AttentionBackendName.NATIVE


class GroupedQueryPolicy:
    """The cached grouped/expanded decisions, shared by the processors of one transformer."""

    def __init__(self) -> None:
        self.decisions: dict[Hashable, str] = {}
        self.asked = 0  # dispatcher consultations, for tests and diagnostics
        self._state: Hashable = None
        self._lock = threading.Lock()

    def decide(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, groups: int
    ) -> tuple[str, tuple[torch.Tensor, torch.Tensor] | None]:
        """The layout for this call, and the expanded K/V when they had to be built to ask."""
        state = attention_state()
        signature = (
            tuple(query.shape),
            tuple(key.shape),
            query.dtype,
            query.device,
            None if mask is None else (tuple(mask.shape), mask.dtype),
        )
        if state != self._state:
            with self._lock:
                if state != self._state:
                    self.decisions = {}
                    self._state = state
        layout = self.decisions.get(signature)
        if layout is not None:
            return layout, None
        expanded_key = key.repeat_interleave(groups, dim=2)
        expanded_value = value.repeat_interleave(groups, dim=2)
        q, k, v, ek, ev = (_sdpa_layout(t) for t in (query, key, value, expanded_key, expanded_value))
        layout = choose_layout(
            serving_kernel(q, k, v, attn_mask=mask, enable_gqa=True),
            serving_kernel(q, ek, ev, attn_mask=mask),
            torch._C._get_sdp_priority_order(),
        )
        self.asked += 1
        self.decisions[signature] = layout
        return layout, (expanded_key, expanded_value)


class Krea2GroupedQueryAttnProcessor(Krea2AttnProcessor):
    """Krea2AttnProcessor with the grouped/expanded K/V choice of `GroupedQueryPolicy`."""

    def __init__(self, policy: GroupedQueryPolicy | None = None) -> None:
        self.policy = policy if policy is not None else GroupedQueryPolicy()

    def __call__(
        self,
        attn: Krea2Attention,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        image_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        heads, kv_heads, head_dim = attn.num_heads, attn.num_kv_heads, attn.head_dim
        query = attn.norm_q(attn.to_q(hidden_states).unflatten(-1, (heads, head_dim)))
        key = attn.norm_k(attn.to_k(hidden_states).unflatten(-1, (kv_heads, head_dim)))
        value = attn.to_v(hidden_states).unflatten(-1, (kv_heads, head_dim))
        gate = attn.to_gate(hidden_states)
        if image_rotary_emb is not None:
            query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
            key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)

        groups = heads // kv_heads
        grouped = False
        if groups > 1:
            layout, expanded = (EXPANDED, None)
            if _uses_torch_sdpa(self):
                layout, expanded = self.policy.decide(query, key, value, attention_mask, groups)
            grouped = layout == GROUPED
            if not grouped:
                key, value = expanded or (key.repeat_interleave(groups, dim=2), value.repeat_interleave(groups, dim=2))

        attended = dispatch_attention_fn(
            query,
            key,
            value,
            attn_mask=attention_mask,
            enable_gqa=grouped,
            backend=self._attention_backend,
            parallel_config=self._parallel_config,
        )
        return attn.to_out[0](attended.flatten(2, 3) * torch.sigmoid(gate))


def install_krea2_attention(transformer: torch.nn.Module) -> GroupedQueryPolicy:
    """Give every Krea-2 attention module of `transformer` the grouped-query processor (idempotent), keeping each
    module's diffusers attention backend and parallel config. Returns the policy the processors share."""
    policy: GroupedQueryPolicy | None = None
    modules = [module for module in transformer.modules() if isinstance(module, Krea2Attention)]
    for module in modules:
        if isinstance(module.processor, Krea2GroupedQueryAttnProcessor):
            policy = module.processor.policy
            break
    policy = policy or GroupedQueryPolicy()
    for module in modules:
        current: Any = module.processor
        if isinstance(current, Krea2GroupedQueryAttnProcessor) and current.policy is policy:
            continue
        processor = Krea2GroupedQueryAttnProcessor(policy)
        processor._attention_backend = getattr(current, "_attention_backend", None)
        processor._parallel_config = getattr(current, "_parallel_config", None)
        module.set_processor(processor)
    return policy
