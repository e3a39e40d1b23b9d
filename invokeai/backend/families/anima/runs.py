"""One forward pass of each Anima operation, called the way the nodes call it (see
`invokeai.backend.cache.component_runs`): the Qwen3 text model on a prompt (with its mask, all true unless padded:
transformers drops an all-true mask), the adapter on Qwen3 states and T5 query ids (both masks passed, as the
pipeline always passes them), one DiT call on one frame of latents against the 512-token context (unmasked, with
the pipeline's padding mask), the VAE's decode and encode of one frame."""

from __future__ import annotations

from typing import Any

import torch

from invokeai.backend.cache.estimate import CallFacts, config_dict
from invokeai.backend.cache.run_inputs import Run, randn, token_ids
from invokeai.backend.families.anima.constants import CONDITIONING_TOKENS, LATENT_SCALE, MAX_SEQUENCE_LENGTH
from invokeai.backend.families.anima.generation import padding_mask_resize


def _mask(facts: CallFacts, length: int) -> torch.Tensor:
    """All true, or (padded) the first entry's prompt 8 tokens long and the others whole."""
    mask = torch.ones(facts.batch, length, dtype=torch.long, device=facts.device)
    if facts.text_padded:
        mask[0, min(8, length - 1) :] = 0
    return mask


def text_encoder(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    length = facts.prompt_tokens or MAX_SEQUENCE_LENGTH
    ids = token_ids(generator, facts, c["vocab_size"], facts.batch, length)
    mask = _mask(facts, length)
    return lambda: model(input_ids=ids, attention_mask=mask, output_hidden_states=False).last_hidden_state


def text_conditioner(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    length = facts.prompt_tokens or MAX_SEQUENCE_LENGTH
    source = randn(generator, facts, facts.batch, length, c["source_dim"])
    ids = token_ids(generator, facts, c["target_vocab_size"], facts.batch, length)
    mask = _mask(facts, length)
    return lambda: model(
        source_hidden_states=source, target_input_ids=ids, target_attention_mask=mask, source_attention_mask=mask
    )


def transformer(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    if c.get("concat_padding_mask"):
        padding_mask_resize()
    h, w = facts.height // LATENT_SCALE, facts.width // LATENT_SCALE
    latents = randn(generator, facts, facts.batch, c["in_channels"], 1, h, w)
    context = randn(generator, facts, facts.batch, CONDITIONING_TOKENS, c["text_embed_dim"])
    timestep = torch.full((facts.batch,), 0.5, device=facts.device, dtype=facts.dtype)
    padding = torch.zeros(1, 1, facts.height, facts.width, device=facts.device, dtype=facts.dtype)
    return lambda: model(
        hidden_states=latents, timestep=timestep, encoder_hidden_states=context, padding_mask=padding, return_dict=False
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
    "text_conditioner": text_conditioner,
    "transformer": transformer,
    "vae_decode": vae_decode,
    "vae_encode": vae_encode,
}
