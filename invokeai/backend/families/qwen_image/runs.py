"""One forward pass of each Qwen-Image operation, called the way the nodes call it (see
`invokeai.backend.cache.component_runs`): the Qwen2.5-VL text model on the templated prompt (a padded batch gets its
mask, an unpadded one an all-true mask, which transformers drops), one transformer call on packed latents (a padded
prompt batch with its key mask, an unpadded one without), the VAE's decode and encode of one frame."""

from __future__ import annotations

from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts, config_dict
from invokeai.backend.cache.run_inputs import Run, randn, token_ids
from invokeai.backend.families.qwen_image.constants import (
    LATENT_SCALE,
    MAX_SEQUENCE_LENGTH,
    PATCH,
    TEMPLATE_PREFIX_TOKENS,
    TOKENIZER_MAX_LENGTH,
)
from invokeai.backend.families.qwen_image.generation import text_model


def _mask(facts: CallFacts, length: int, valid: int) -> torch.Tensor:
    """All true, or (padded) the first entry's prompt `valid` tokens long and the others whole."""
    mask = torch.ones(facts.batch, length, dtype=torch.long, device=facts.device)
    if facts.text_padded:
        mask[0, valid:] = 0
    return mask


def text_encoder(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    text = config_dict(config_dict(model.config).get("text_config", model.config))
    length = facts.prompt_tokens or TOKENIZER_MAX_LENGTH + TEMPLATE_PREFIX_TOKENS
    ids = token_ids(generator, facts, text["vocab_size"], facts.batch, length)
    mask = _mask(facts, length, min(TEMPLATE_PREFIX_TOKENS + 8, length - 1))
    return lambda: text_model(model)(input_ids=ids, attention_mask=mask).last_hidden_state


def transformer(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    text = facts.prompt_tokens or MAX_SEQUENCE_LENGTH
    side = LATENT_SCALE * PATCH
    grid_h, grid_w = facts.height // side, facts.width // side
    latents = randn(generator, facts, facts.batch, grid_h * grid_w, c["in_channels"])
    prompt = randn(generator, facts, facts.batch, text, c["joint_attention_dim"])
    mask = _mask(facts, text, min(8, text - 1)) if facts.text_padded else None
    timestep = torch.full((facts.batch,), 0.5, device=facts.device, dtype=facts.dtype)
    shapes = [[(1, grid_h, grid_w)]] * facts.batch
    return lambda: model(
        hidden_states=latents,
        timestep=timestep,
        encoder_hidden_states=prompt,
        encoder_hidden_states_mask=mask,
        img_shapes=shapes,
        attention_kwargs={},
        return_dict=False,
    )[0]


def vae_decode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    latents = randn(
        generator, facts, facts.batch, c["z_dim"], 1, facts.height // LATENT_SCALE, facts.width // LATENT_SCALE
    )
    return lambda: model.decode(latents)


def vae_encode(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    image = randn(generator, facts, facts.batch, c.get("input_channels", 3), 1, facts.height, facts.width)
    return lambda: model.encode(image)


RUNS = {
    "text_encoder": text_encoder,
    "transformer": transformer,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
