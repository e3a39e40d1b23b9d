"""One forward pass of each SD-1 operation, called the way StableDiffusionPipeline calls it (see
`invokeai.backend.cache.run_inputs`)."""

from __future__ import annotations

from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts, config_dict
from invokeai.backend.cache.run_inputs import Run, randn, token_ids
from invokeai.backend.families.sd1.constants import CLIP_TOKENS, LATENT_SCALE


def text_encoder(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    tokens = facts.prompt_tokens or CLIP_TOKENS
    ids = token_ids(generator, facts, c["vocab_size"], facts.batch, tokens)
    return lambda: model(ids)


def unet(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    batch = facts.batch * (2 if facts.guidance else 1)
    scale = LATENT_SCALE
    sample = randn(generator, facts, batch, c["in_channels"], facts.height // scale, facts.width // scale)
    text = randn(generator, facts, batch, facts.prompt_tokens or CLIP_TOKENS, c["cross_attention_dim"])
    timestep = torch.full((batch,), 500, device=facts.device)
    return lambda: model(sample, timestep, encoder_hidden_states=text)


def vae_decode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    scale = 2 ** (len(c["block_out_channels"]) - 1)
    latents = randn(generator, facts, facts.batch, c["latent_channels"], facts.height // scale, facts.width // scale)
    return lambda: model.decode(latents)


def vae_encode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    image = randn(generator, facts, facts.batch, c["in_channels"], facts.height, facts.width)
    return lambda: model.encode(image)


RUNS = {"text_encoder": text_encoder, "unet": unet, "vae_decode": vae_decode, "vae_encode": vae_encode}
