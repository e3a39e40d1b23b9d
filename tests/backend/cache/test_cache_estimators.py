"""Every registered working-memory estimator prices its attention: what the dispatcher would materialise moves the
total, by exactly the largest call's score matrix, for the demo configs and the real SD-1.5 / Krea-2 configs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from invokeai.backend.attention import install_attention, uninstall_attention
from invokeai.backend.attention.memory import PricedCall, bytes_per_score_element
from invokeai.backend.cache.estimate import AttentionCall
from invokeai.backend.cache.working_memory import (
    ESTIMATORS,
    CallFacts,
    WorkingMemory,
    estimate_working_memory,
    model_component,
)
from invokeai.backend.families import FAMILIES, config_variant

# Krea-2 ships no text-encoder config (it taps Qwen3-VL-4B, whose text width is the transformer's text_hidden_dim):
# these are that model's text-config values.
QWEN3_VL_4B_TEXT = {
    "text_config": dict(
        hidden_size=2560,
        intermediate_size=9728,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
    )
}
FUSED = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")
CPU = torch.device("cpu")
Dispatcher = Callable[..., Any]  # conftest's stand-in factory


def config_for(family: str, component: str, variant: str) -> Any:
    if (family, component, variant) == ("krea2", "text_encoder", "krea2"):
        return QWEN3_VL_4B_TEXT
    return config_variant(variant).component_config(model_component(family, component))


def _has_config(family: str, component: str, variant: Any) -> bool:
    return (family, component, variant.name) == ("krea2", "text_encoder", "krea2") or (
        variant.path / model_component(family, component)
    ).is_dir()


# Every estimator on every shipped config that has its component (a transformer-only variant has no VAE).
CASES = [
    pytest.param(family.name, operation, variant.name, id=f"{variant.name}/{operation}")
    for family in FAMILIES
    for operation in family.estimators
    for variant in family.config_variants
    if _has_config(family.name, operation, variant)
]


def facts(size: int = 512, **overrides: Any) -> CallFacts:
    return CallFacts(CPU, torch.float16, width=size, height=size, **overrides)


def priced(family: str, component: str, variant: str, size: int) -> WorkingMemory:
    return estimate_working_memory(family, component, config_for(family, component, variant), facts(size))


def independent_bytes(call: AttentionCall, dtype: torch.dtype) -> int:
    """The math kernel's bytes for one call, from the pricing constants, not through the dispatcher."""
    return PricedCall(
        device=CPU,
        dtype=dtype,
        num_heads=call.num_heads,
        kv_heads=call.kv_heads if call.kv_heads is not None else call.num_heads,
        query_len=call.query_len,
        key_len=call.key_len,
        head_dim=call.head_dim,
        has_attn_mask=call.has_attn_mask,
        is_causal=call.is_causal,
    ).math_bytes()


def test_every_family_component_has_an_estimator() -> None:
    for family in FAMILIES:
        covered = {model_component(family.name, c) for f, c in ESTIMATORS if f == family.name}
        assert covered == set(family.module_components), family.name


@pytest.mark.parametrize(("family", "component", "variant"), CASES)
def test_math_costs_more_than_a_fused_kernel(dispatcher: Dispatcher, family: str, component: str, variant: str) -> None:
    dispatcher("MATH")
    install_attention("auto")
    math = priced(family, component, variant, 512)
    math_total = math.total(CPU, torch.float16)
    uninstall_attention()  # the router binds the dispatcher when installed
    dispatcher(*FUSED)
    install_attention("auto")
    fused_total = priced(family, component, variant, 512).total(CPU, torch.float16)
    assert math.attention_calls, "an estimator without attention calls cannot price a score matrix"
    assert math_total > fused_total == math.activation_bytes > 0


@pytest.mark.parametrize(("family", "component", "variant"), CASES)
def test_pinned_math_adds_exactly_the_largest_score_matrix(
    dispatcher: Dispatcher, family: str, component: str, variant: str
) -> None:
    dispatcher(*FUSED)
    install_attention("auto")
    auto = priced(family, component, variant, 1024)
    auto_total = auto.total(CPU, torch.float16)  # totals ask the dispatcher installed when they are taken
    install_attention("math")
    pinned = priced(family, component, variant, 1024)
    assert pinned.attention_calls == auto.attention_calls
    expected = max(independent_bytes(call, torch.float16) for call in auto.attention_calls)
    assert pinned.total(CPU, torch.float16) - auto_total == expected


def test_calls_run_one_at_a_time_so_only_the_largest_is_reserved(dispatcher: Dispatcher) -> None:
    dispatcher("MATH")
    install_attention("auto")
    calls = [AttentionCall(8, 1024, 1024, 64, count=10), AttentionCall(8, 512, 512, 64, count=3)]
    memory = WorkingMemory(1000, calls)
    largest = independent_bytes(calls[0], torch.float32)
    assert memory.total(CPU, torch.float32) == 1000 + largest
    # The score matrix, and math's copies of its operands on top.
    assert largest > 8 * 1024 * 1024 * bytes_per_score_element("cpu", torch.float32)


def largest(memory: WorkingMemory) -> AttentionCall:
    return max(memory.attention_calls, key=lambda c: c.num_heads * c.query_len * c.key_len)


def test_real_sd15_unet_self_attention_at_512() -> None:
    """The review's example: 8 heads x 4096^2 per self-attention call at the first level, doubled by guidance."""
    unet = priced("sd-1", "unet", "sd-1", 512)
    call = largest(unet)
    assert (call.num_heads, call.query_len, call.key_len, call.head_dim) == (2 * 8, 4096, 4096, 40)
    # Two down-block and three up-block transformers at the first level.
    assert call.count == 5
    # On CUDA (17 bytes per element) that is 16 x 4096^2 x 17 bytes, 4.25 GiB, per call, and math's copies of its
    # operands (a few MiB) on top.
    scores = 16 * 4096**2 * 17
    priced_bytes = call.score_matrix_bytes("cuda", torch.float16)
    assert scores < priced_bytes < scores * 1.02


@pytest.mark.parametrize(
    ("family", "component", "shape"),
    [
        ("sd-1", "text_encoder", (12, 77, 77, 64, False, True, 12)),
        ("sd-1", "unet", (16, 16384, 16384, 40, False, False, 5)),
        ("sd-1", "vae_decode", (1, 16384, 16384, 512, False, False, 1)),
        ("sd-1", "vae_encode", (1, 16384, 16384, 512, False, False, 1)),
        ("krea2", "text_encoder", (32, 546, 546, 128, True, False, 36)),
        ("krea2", "transformer", (48, 4608, 4608, 128, True, False, 28)),
        ("krea2", "vae_decode", (1, 16384, 16384, 384, False, False, 1)),
        # Anima: Qwen3-0.6B's 16 query heads (K/V repeated from 8 under a mask), the adapter's 16 heads of 64, the
        # DiT's self-attention over 64 x 64 image tokens (its cross-attention to 512 is smaller).
        ("anima", "text_encoder", (16, 512, 512, 128, True, False, 28)),
        ("anima", "text_conditioner", (16, 512, 512, 64, True, False, 6)),
        ("anima", "transformer", (16, 4096, 4096, 128, False, False, 28)),
    ],
)
def test_real_configs_at_1024_attend_where_the_models_do(family: str, component: str, shape: tuple) -> None:
    call = largest(priced(family, component, family, 1024))
    assert (
        call.num_heads,
        call.query_len,
        call.key_len,
        call.head_dim,
        call.has_attn_mask,
        call.is_causal,
        call.count,
    ) == shape


def test_krea2_transformer_lists_all_three_attention_kinds() -> None:
    calls = priced("krea2", "transformer", "krea2", 1024).attention_calls
    layerwise, refiner, main = calls
    assert (layerwise.num_heads, layerwise.query_len, layerwise.head_dim, layerwise.count) == (512 * 20, 12, 128, 2)
    assert (refiner.num_heads, refiner.query_len, refiner.has_attn_mask, refiner.count) == (20, 512, True, 2)
    assert main.query_len == 512 + (1024 // 16) ** 2


def test_guidance_doubles_the_sd_unet_batch_but_not_krea2s() -> None:
    sd = config_variant("sd-1").component_config("unet")
    k2 = config_variant("krea2").component_config("transformer")
    for guidance in (True, False):
        sd_call = largest(ESTIMATORS[("sd-1", "unet")](sd, facts(guidance=guidance)))
        k2_call = largest(ESTIMATORS[("krea2", "transformer")](k2, facts(guidance=guidance)))
        assert sd_call.num_heads == (16 if guidance else 8)
        assert k2_call.num_heads == 48


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize(("family", "component"), sorted(ESTIMATORS))
def test_activation_grows_with_resolution_and_batch(device: str, family: str, component: str) -> None:
    """Twice the batch at least doubles the activations, less what is made once per call, not per image: on the
    CPU the SD convolutions' weight copies (FLUX's and Z-Image's VAE is SD's), T5's position bias, and the float32
    weights an SDXL float16 VAE is upcast to. Text encoders (and Anima's text conditioner) do not see the
    resolution."""
    config = config_for(family, component, family)

    def at(size: int, batch: int = 1) -> int:
        call = CallFacts(torch.device(device), torch.float16, width=size, height=size, batch=batch)
        return ESTIMATORS[(family, component)](config, call).activation_bytes

    small, batched = at(512), at(512, batch=2)
    convolutions = (
        device == "cpu"
        and family in ("sd-1", "flux", "sdxl", "z-image")
        and component in ("unet", "vae_decode", "vae_encode")
    )
    upcast_vae = family == "sdxl" and component.startswith("vae")
    if convolutions or upcast_vae or (family, component) == ("flux", "text_encoder_2"):
        assert batched > small
    else:
        assert batched >= 2 * small - 2
    if not component.startswith("text_"):
        assert at(1024) > 2 * small


def test_configs_as_loaded_objects_and_as_dicts_agree() -> None:
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextConfig

    unet_dict = config_variant("sd-1-demo").component_config("unet")
    frozen = UNet2DConditionModel.load_config(config_variant("sd-1-demo").path / "unet")
    assert ESTIMATORS[("sd-1", "unet")](frozen, facts()) == ESTIMATORS[("sd-1", "unet")](unet_dict, facts())
    text_dict = config_variant("sd-1").component_config("text_encoder")
    text_config = CLIPTextConfig(**text_dict)
    assert ESTIMATORS[("sd-1", "text_encoder")](text_config, facts()) == ESTIMATORS[("sd-1", "text_encoder")](
        text_dict, facts()
    )


def test_an_unknown_component_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="sd-1/unet"):
        estimate_working_memory("sd-1", "controlnet", {}, facts())


def test_full_size_sd15_unet_on_cpu_reserves_the_weight_copy_of_its_largest_conv() -> None:
    """oneDNN reorders a convolution's weight on every CPU call; at 256 px the copy of up_blocks.1's first conv1
    (2560 to 1280 channels, 3x3, 113 MiB in fp32) outweighs the UNet's activations. `calibrate_working_memory.py
    --full-size` measured 129.6 MiB for this call; the activation-only walk reserved 74 MiB."""
    unet = config_variant("sd-1").component_config("unet")
    memory = estimate_working_memory("sd-1", "unet", unet, CallFacts(CPU, torch.float32, width=256, height=256))
    largest_conv_weight = 2560 * 1280 * 9 * 4
    assert memory.activation_bytes >= largest_conv_weight + 16 * 2**20  # and the activations held meanwhile
    assert memory.activation_bytes >= 129.6 * 2**20


@pytest.mark.parametrize(("component", "measured_mib"), [("vae_encode", 95.9), ("vae_decode", 152.0)])
def test_full_size_sd15_vae_in_bfloat16_on_cpu_covers_onednn_channels_last_copies(
    component: str, measured_mib: float
) -> None:
    """oneDNN's 16-bit convolutions copy the NCHW input to NHWC and the NHWC result back, beside each other: the
    fp32 layout's terms gave 0.88 (encode) and 0.85 (decode) of what `calibrate_working_memory.py --full-size
    --dtype bfloat16` measured at 256 px on an AMX machine."""
    vae = config_variant("sd-1").component_config("vae")
    memory = estimate_working_memory("sd-1", component, vae, CallFacts(CPU, torch.bfloat16, width=256, height=256))
    assert memory.activation_bytes >= measured_mib * 2**20
