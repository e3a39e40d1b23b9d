"""One forward pass of each SDXL operation, called the way StableDiffusionXLPipeline calls it, with seeded inputs
shaped by `CallFacts`: the calibration script measures these against the estimators, and the tests record their
SDPA calls against the calls the estimators list."""

from __future__ import annotations

from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts, config_dict
from invokeai.backend.cache.run_inputs import Run, randn

from .constants import CLIP_TOKENS, LATENT_SCALE

TIME_IDS = 6  # original size, crop corner, target size


def _text(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    tokens = facts.prompt_tokens or CLIP_TOKENS
    ids = torch.randint(0, c["vocab_size"], (facts.batch, tokens), generator=generator).to(facts.device)
    return lambda: model(ids, output_hidden_states=True)


def unet(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    batch = facts.batch * (2 if facts.guidance else 1)
    sample = randn(generator, facts, batch, c["in_channels"], facts.height // LATENT_SCALE, facts.width // LATENT_SCALE)
    text = randn(generator, facts, batch, facts.prompt_tokens or CLIP_TOKENS, c["cross_attention_dim"])
    pooled_width = c["projection_class_embeddings_input_dim"] - TIME_IDS * c["addition_time_embed_dim"]
    added = {
        "text_embeds": randn(generator, facts, batch, pooled_width),
        "time_ids": torch.tensor([[facts.height, facts.width, 0, 0, facts.height, facts.width]] * batch).to(
            facts.device, facts.dtype
        ),
    }
    timestep = torch.full((batch,), 500, device=facts.device)
    return lambda: model(sample, timestep, encoder_hidden_states=text, added_cond_kwargs=added)


def vae_decode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    scale = 2 ** (len(c["block_out_channels"]) - 1)
    latents = randn(generator, facts, facts.batch, c["latent_channels"], facts.height // scale, facts.width // scale)
    return lambda: model.decode(latents)


def vae_encode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    image = randn(generator, facts, facts.batch, c["in_channels"], facts.height, facts.width)
    return lambda: model.encode(image)


RUNS = {
    "text_encoder": _text,
    "text_encoder_2": _text,
    "unet": unet,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
