"""One forward pass of each FLUX.1 operation with seeded inputs shaped by `CallFacts`, called the way FluxPipeline
calls it: CLIP on the 77-token prompt (pooled output), T5 on the padded prompt without a mask, the transformer on
packed latents with image and text ids (and the guidance embedding when the model has one), the VAE's decode and
encode. The calibration script measures these against the estimators; the tests record their SDPA calls against the
calls the estimators list.
"""

from __future__ import annotations

from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts, config_dict
from invokeai.backend.cache.run_inputs import Run, randn, token_ids
from invokeai.backend.families.flux.constants import CLIP_TOKENS, LATENT_SCALE, PATCH, T5_TOKENS_DEV
from invokeai.backend.families.flux.generation import image_ids


def text_encoder(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    ids = token_ids(generator, facts, c["vocab_size"], facts.batch, facts.prompt_tokens or CLIP_TOKENS)
    return lambda: model(ids, output_hidden_states=False).pooler_output


def text_encoder_2(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    ids = token_ids(generator, facts, c["vocab_size"], facts.batch, facts.prompt_tokens or T5_TOKENS_DEV)
    return lambda: model(ids, output_hidden_states=False)[0]


def transformer(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    text = facts.prompt_tokens or T5_TOKENS_DEV
    grid_h, grid_w = facts.height // (LATENT_SCALE * PATCH), facts.width // (LATENT_SCALE * PATCH)
    latents = randn(generator, facts, facts.batch, grid_h * grid_w, c["in_channels"])
    prompt = randn(generator, facts, facts.batch, text, c["joint_attention_dim"])
    pooled = randn(generator, facts, facts.batch, c["pooled_projection_dim"])
    timestep = torch.full((facts.batch,), 0.5, device=facts.device, dtype=facts.dtype)
    guidance = torch.full((facts.batch,), 3.5, device=facts.device) if c.get("guidance_embeds") else None
    txt_ids = torch.zeros(text, 3, device=facts.device, dtype=facts.dtype)
    img_ids = image_ids(grid_h, grid_w, facts.device, facts.dtype)
    return lambda: model(
        hidden_states=latents,
        timestep=timestep,
        guidance=guidance,
        pooled_projections=pooled,
        encoder_hidden_states=prompt,
        txt_ids=txt_ids,
        img_ids=img_ids,
        return_dict=False,
    )[0]


def vae_decode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    h, w = facts.height // LATENT_SCALE, facts.width // LATENT_SCALE
    latents = randn(generator, facts, facts.batch, c["latent_channels"], h, w)
    return lambda: model.decode(latents)


def vae_encode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    image = randn(generator, facts, facts.batch, c["in_channels"], facts.height, facts.width)
    return lambda: model.encode(image)


RUNS = {
    "text_encoder": text_encoder,
    "text_encoder_2": text_encoder_2,
    "transformer": transformer,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
