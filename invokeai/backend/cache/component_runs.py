"""One forward pass of each (family, component) with seeded inputs shaped by `CallFacts`, called the way the family's
diffusers pipeline calls it. The calibration script measures these runs against the estimators, and the tests
record their SDPA calls against the calls the estimators list, so both check the estimate against the real code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from invokeai.backend.cache import estimators_krea2, estimators_sd1
from invokeai.backend.cache.estimate import CallFacts, config_dict

Run = Callable[[], Any]
RunBuilder = Callable[[Any, CallFacts, torch.Generator], Run]


def _randn(generator: torch.Generator, facts: CallFacts, *shape: int) -> torch.Tensor:
    # Drawn on the CPU (one generator for every device), then moved: the baseline holds only the final inputs.
    return torch.randn(shape, generator=generator).to(facts.device, facts.dtype)


def _token_ids(generator: torch.Generator, facts: CallFacts, vocab_size: int, batch: int, length: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (batch, length), generator=generator).to(facts.device)


def _sd1_text_encoder(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    tokens = facts.prompt_tokens or estimators_sd1.CLIP_TOKENS
    ids = _token_ids(generator, facts, c["vocab_size"], facts.batch, tokens)
    return lambda: model(ids)


def _sd1_unet(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    batch = facts.batch * (2 if facts.guidance else 1)
    scale = estimators_sd1.LATENT_SCALE
    sample = _randn(generator, facts, batch, c["in_channels"], facts.height // scale, facts.width // scale)
    text = _randn(generator, facts, batch, facts.prompt_tokens or estimators_sd1.CLIP_TOKENS, c["cross_attention_dim"])
    timestep = torch.full((batch,), 500, device=facts.device)
    return lambda: model(sample, timestep, encoder_hidden_states=text)


def _sd1_vae_decode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    scale = 2 ** (len(c["block_out_channels"]) - 1)
    latents = _randn(generator, facts, facts.batch, c["latent_channels"], facts.height // scale, facts.width // scale)
    return lambda: model.decode(latents)


def _sd1_vae_encode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    image = _randn(generator, facts, facts.batch, c["in_channels"], facts.height, facts.width)
    return lambda: model.encode(image)


def _krea2_text_mask(facts: CallFacts, length: int, valid: int) -> torch.Tensor:
    mask = torch.ones(facts.batch, length, dtype=torch.bool, device=facts.device)
    if facts.text_padded:
        mask[:, valid:] = False
    return mask


def _krea2_text_encoder(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    text = config_dict(config_dict(model.config).get("text_config", model.config))
    prompt = facts.prompt_tokens or estimators_krea2.PROMPT_TOKENS
    length = prompt + estimators_krea2.TEMPLATE_PREFIX_TOKENS
    ids = _token_ids(generator, facts, text["vocab_size"], facts.batch, length)
    # Krea2Pipeline's layout: [prefix | prompt | padding | 5-token suffix]; padding consumes no position.
    mask = _krea2_text_mask(facts, length, estimators_krea2.TEMPLATE_PREFIX_TOKENS + min(8, prompt))
    if facts.text_padded:
        mask[:, -5:] = True
    positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
    return lambda: model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)


def _krea2_transformer(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    from diffusers import Krea2Pipeline

    c = config_dict(model.config)
    text = facts.prompt_tokens or estimators_krea2.PROMPT_TOKENS
    side = estimators_krea2.LATENT_SCALE * estimators_krea2.PATCH
    grid_h, grid_w = facts.height // side, facts.width // side
    latents = _randn(generator, facts, facts.batch, grid_h * grid_w, c["in_channels"])
    prompt = _randn(generator, facts, facts.batch, text, c["num_text_layers"], c["text_hidden_dim"])
    mask = _krea2_text_mask(facts, text, min(8, text))
    timestep = torch.full((facts.batch,), 0.5, device=facts.device, dtype=facts.dtype)
    positions = Krea2Pipeline.prepare_position_ids(text, grid_h, grid_w, facts.device)
    return lambda: model(latents, prompt, timestep, positions, encoder_attention_mask=mask)


def _krea2_vae_decode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    scale = estimators_krea2.LATENT_SCALE
    latents = _randn(generator, facts, facts.batch, c["z_dim"], 1, facts.height // scale, facts.width // scale)
    return lambda: model.decode(latents)


RUNS: dict[tuple[str, str], RunBuilder] = {
    ("sd-1", "text_encoder"): _sd1_text_encoder,
    ("sd-1", "unet"): _sd1_unet,
    ("sd-1", "vae_decode"): _sd1_vae_decode,
    ("sd-1", "vae_encode"): _sd1_vae_encode,
    ("krea2", "text_encoder"): _krea2_text_encoder,
    ("krea2", "transformer"): _krea2_transformer,
    ("krea2", "vae_decode"): _krea2_vae_decode,
}


def component_run(family: str, component: str, model: Any, facts: CallFacts, seed: int = 0) -> Run:
    """A no-argument function running one forward pass; inputs are built now, so calling it allocates only what
    the forward pass itself does. Call it under torch.inference_mode()."""
    return RUNS[(family, component)](model, facts, torch.Generator().manual_seed(seed))
