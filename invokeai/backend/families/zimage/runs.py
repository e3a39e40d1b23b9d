"""One forward pass of each Z-Image operation, called the way ZImagePipeline calls it (see
`invokeai.backend.cache.component_runs`): the text encoder on the padded prompt with its mask and every hidden state,
the transformer on lists of (C, 1, h, w) latents and caption features (the CFG batch: positives, then the empty
negative's EMPTY_PROMPT_TOKENS features), the VAE's decode and encode."""

from __future__ import annotations

from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts, config_dict
from invokeai.backend.cache.run_inputs import Run, randn, token_ids
from invokeai.backend.families.zimage.constants import EMPTY_PROMPT_TOKENS, LATENT_SCALE, TEXT_TOKENS


def text_encoder(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    length = facts.prompt_tokens or TEXT_TOKENS
    ids = token_ids(generator, facts, c["vocab_size"], facts.batch, length)
    mask = torch.ones(facts.batch, length, dtype=torch.bool, device=facts.device)
    if facts.text_padded:
        mask[:, min(EMPTY_PROMPT_TOKENS + 8, length - 1) :] = False
    return lambda: model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-2]


def transformer(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    caption = facts.prompt_tokens or TEXT_TOKENS
    h, w = facts.height // LATENT_SCALE, facts.width // LATENT_SCALE
    latents = randn(generator, facts, facts.batch, c["in_channels"], 1, h, w)
    captions = [randn(generator, facts, caption, c["cap_feat_dim"]) for _ in range(facts.batch)]
    timestep = torch.full((facts.batch,), 0.5, device=facts.device, dtype=facts.dtype)
    inputs = list(latents.unbind(dim=0))
    if facts.guidance:
        negative = randn(generator, facts, EMPTY_PROMPT_TOKENS, c["cap_feat_dim"])
        inputs = inputs + inputs
        captions = captions + [negative] * facts.batch
        timestep = timestep.repeat(2)
    return lambda: model(inputs, timestep, captions, return_dict=False)[0]


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
    "transformer": transformer,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
