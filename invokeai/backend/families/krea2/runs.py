"""One forward pass of each Krea-2 operation, called the way Krea2Pipeline calls it (see
`invokeai.backend.cache.run_inputs`)."""

from __future__ import annotations

from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts, config_dict
from invokeai.backend.cache.run_inputs import Run, randn, token_ids
from invokeai.backend.families.krea2.constants import LATENT_SCALE, PATCH, PROMPT_TOKENS, TEMPLATE_PREFIX_TOKENS


def _text_mask(facts: CallFacts, length: int, valid: int) -> torch.Tensor:
    mask = torch.ones(facts.batch, length, dtype=torch.bool, device=facts.device)
    if facts.text_padded:
        mask[:, valid:] = False
    return mask


def text_encoder(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    text = config_dict(config_dict(model.config).get("text_config", model.config))
    prompt = facts.prompt_tokens or PROMPT_TOKENS
    length = prompt + TEMPLATE_PREFIX_TOKENS
    ids = token_ids(generator, facts, text["vocab_size"], facts.batch, length)
    # Krea2Pipeline's layout: [prefix | prompt | padding | 5-token suffix]; padding consumes no position.
    mask = _text_mask(facts, length, TEMPLATE_PREFIX_TOKENS + min(8, prompt))
    if facts.text_padded:
        mask[:, -5:] = True
    positions = (mask.long().cumsum(dim=-1) - 1).clamp(min=0).unsqueeze(0).expand(3, -1, -1)
    return lambda: model(input_ids=ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)


def transformer(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    from diffusers import Krea2Pipeline

    c = config_dict(model.config)
    text = facts.prompt_tokens or PROMPT_TOKENS
    side = LATENT_SCALE * PATCH
    grid_h, grid_w = facts.height // side, facts.width // side
    latents = randn(generator, facts, facts.batch, grid_h * grid_w, c["in_channels"])
    prompt = randn(generator, facts, facts.batch, text, c["num_text_layers"], c["text_hidden_dim"])
    mask = _text_mask(facts, text, min(8, text))
    timestep = torch.full((facts.batch,), 0.5, device=facts.device, dtype=facts.dtype)
    positions = Krea2Pipeline.prepare_position_ids(text, grid_h, grid_w, facts.device)
    return lambda: model(latents, prompt, timestep, positions, encoder_attention_mask=mask)


def vae_decode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    scale = LATENT_SCALE
    latents = randn(generator, facts, facts.batch, c["z_dim"], 1, facts.height // scale, facts.width // scale)
    return lambda: model.decode(latents)


RUNS = {"text_encoder": text_encoder, "transformer": transformer, "vae_decode": vae_decode}
