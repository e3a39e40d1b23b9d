"""The VAE estimates price oneDNN's channel block of the CPU at hand: 16 channels where oneDNN may use AVX-512, 8
where AVX2 is the widest (or ONEDNN_MAX_CPU_ISA caps it there), both (the worse) where neither is known. Each kind
of machine is stood in for; tests/backend/cache/test_cache_calibration.py measures the real one."""

from __future__ import annotations

import pytest
import torch

from invokeai.backend.cache.clip_unet_vae import cpu_channel_blocks, vae_decode, vae_encode
from invokeai.backend.cache.estimate import CallFacts

# A VAE whose first level is 8 channels wide, as the demo SDXL VAE's: AVX-512's 16-channel blocks pad it to twice.
NARROW_VAE = {
    "block_out_channels": [8, 16, 16, 16],
    "layers_per_block": 2,
    "latent_channels": 4,
    "in_channels": 3,
    "out_channels": 3,
}


@pytest.mark.parametrize(
    ("avx512", "avx2", "environ", "blocks"),
    [
        (True, True, {}, (16,)),
        (True, True, {"ONEDNN_MAX_CPU_ISA": "AVX2"}, (8,)),
        (True, True, {"DNNL_MAX_CPU_ISA": "avx2_vnni"}, (8,)),
        (True, True, {"ONEDNN_MAX_CPU_ISA": "avx512_core_amx"}, (16,)),
        (True, True, {"ONEDNN_MAX_CPU_ISA": "ALL"}, (16,)),
        (True, True, {"ONEDNN_MAX_CPU_ISA": "  "}, (16,)),
        (False, True, {}, (8,)),
        (False, True, {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, (8,)),  # a cap cannot add what the CPU lacks
        (False, False, {}, (8, 16)),
    ],
)
def test_the_block_is_the_machines(avx512: bool, avx2: bool, environ: dict[str, str], blocks: tuple[int, ...]) -> None:
    assert cpu_channel_blocks(avx512=avx512, avx2=avx2, environ=environ) == blocks


def test_the_real_machine_answers_one_of_the_known_blocks() -> None:
    assert cpu_channel_blocks() in ((8,), (16,), (8, 16))


@pytest.mark.parametrize("estimate", [vae_encode, vae_decode])
def test_an_avx512_machine_is_priced_above_an_avx2_one_for_a_narrow_vae(
    estimate: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One image: fp32 batches of two or more leave the decoder channels-last after its attention (no blocked layout).
    facts = CallFacts(device=torch.device("cpu"), dtype=torch.float32, width=128, height=128, batch=1)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    totals = {}
    for avx512 in (False, True):
        monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda avx512=avx512: avx512)
        monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: True)
        totals[avx512] = estimate(NARROW_VAE, facts).activation_bytes  # type: ignore[operator]
    assert totals[True] > totals[False]
    # Other devices are not oneDNN's: they keep the worse block whatever the CPU.
    cuda = CallFacts(device=torch.device("cuda"), dtype=torch.float32, width=128, height=128, batch=1)
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: False)
    on_avx2 = estimate(NARROW_VAE, cuda).activation_bytes  # type: ignore[operator]
    monkeypatch.setattr(torch.cpu, "_is_avx512_supported", lambda: True)
    assert estimate(NARROW_VAE, cuda).activation_bytes == on_avx2  # type: ignore[operator]
