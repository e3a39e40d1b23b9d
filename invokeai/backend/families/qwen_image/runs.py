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
    config = config_dict(model.config)
    text = config_dict(config.get("text_config", model.config))
    length = facts.prompt_tokens or TOKENIZER_MAX_LENGTH + TEMPLATE_PREFIX_TOKENS
    ids = token_ids(generator, facts, text["vocab_size"], facts.batch, length)
    mask = _mask(facts, length, min(TEMPLATE_PREFIX_TOKENS + 8, length - 1))
    if not facts.vision_patches:
        return lambda: text_model(model)(input_ids=ids, attention_mask=mask).last_hidden_state
    # Qwen-Image-Edit: each prompt holds every image's tokens (one per merged 2x2 patches) after the template prefix,
    # and the vision tower gets the images' patches.
    vision = config_dict(config["vision_config"])
    merge = vision["spatial_merge_size"]
    specials = [config[key] for key in ("image_token_id", "vision_start_token_id", "vision_end_token_id")]
    ids[torch.isin(ids, torch.tensor(specials, device=ids.device))] = 0
    start = TEMPLATE_PREFIX_TOKENS
    for rows, columns in facts.vision_patches:
        tokens = rows * columns // merge**2
        ids[:, start] = config["vision_start_token_id"]
        ids[:, start + 1 : start + 1 + tokens] = config["image_token_id"]
        ids[:, start + 1 + tokens] = config["vision_end_token_id"]
        start += tokens + 2
    if start > length:
        raise ValueError(f"{length} prompt tokens cannot hold the images' {start - TEMPLATE_PREFIX_TOKENS} tokens")
    grid = torch.tensor([[1, rows, columns] for rows, columns in facts.vision_patches] * facts.batch)
    width = vision.get("in_channels", 3) * vision["temporal_patch_size"] * vision["patch_size"] ** 2
    pixels = randn(generator, facts, int(grid.prod(dim=1).sum()), width)
    return lambda: (
        text_model(model)(
            input_ids=ids, attention_mask=mask, pixel_values=pixels, image_grid_thw=grid.to(facts.device)
        ).last_hidden_state
    )


def transformer(model: Any, facts: CallFacts, generator: torch.Generator) -> Run:
    c = config_dict(model.config)
    text = facts.prompt_tokens or MAX_SEQUENCE_LENGTH
    side = LATENT_SCALE * PATCH
    grid_h, grid_w = facts.height // side, facts.width // side
    references = [(1, height // side, width // side) for width, height in facts.reference_sizes]
    tokens = grid_h * grid_w + sum(rows * columns for _, rows, columns in references)
    latents = randn(generator, facts, facts.batch, tokens, c["in_channels"])
    prompt = randn(generator, facts, facts.batch, text, c["joint_attention_dim"])
    mask = _mask(facts, text, min(8, text - 1)) if facts.text_padded else None
    timestep = torch.full((facts.batch,), 0.5, device=facts.device, dtype=facts.dtype)
    shapes = [[(1, grid_h, grid_w), *references]] * facts.batch
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
