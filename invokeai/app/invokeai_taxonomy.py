"""InvokeAI 6.14.2's model vocabulary (backend/model_manager/taxonomy.py): the values its clients may send in a
model filter or a model identifier. A value of InvokeAI's that no model here has is a filter that matches nothing,
not an error; one that InvokeAI does not have either is refused (422, naming the values allowed).

This is InvokeAI's word list, not this server's list of families: what a family's models are called comes from its
descriptor (`Family.invokeai.base`), once. The bases below are InvokeAI's others (those of the families it runs and
this server does not); BASES adds every registered family's."""

from __future__ import annotations

from typing import Literal

from invokeai.backend.families import FAMILIES

# InvokeAI 6.14.2's BaseModelType values besides the registered families' own.
INVOKEAI_OTHER_BASES = (
    "any",
    "sd-2",
    "sd-3",
    "sdxl-refiner",
    "flux2",
    "cogview4",
    "ernie-image",
    "ideogram-4",
    "external",
    "qwen-image",
    "anima",
    "wan",
    "unknown",
)
INVOKEAI_MODEL_TYPES = (
    "onnx",
    "main",
    "vae",
    "lora",
    "control_lora",
    "controlnet",
    "embedding",
    "ip_adapter",
    "clip_vision",
    "clip_embed",
    "t2i_adapter",
    "t5_encoder",
    "qwen3_encoder",
    "qwen_vl_encoder",
    "qwen3_vl_encoder",
    "mistral_encoder",
    "wan_t5_encoder",
    "gemma2_encoder",
    "spandrel_image_to_image",
    "siglip",
    "flux_redux",
    "llava_onevision",
    "prompt_enhancer",
    "text_llm",
    "external_image_generator",
    "pid_decoder",
    "unknown",
)
INVOKEAI_MODEL_FORMATS = (
    "omi",
    "diffusers",
    "checkpoint",
    "lycoris",
    "onnx",
    "olive",
    "embedding_file",
    "embedding_folder",
    "invokeai",
    "t5_encoder",
    "qwen3_encoder",
    "qwen_vl_encoder",
    "qwen3_vl_encoder",
    "mistral_encoder",
    "wan_t5_encoder",
    "gemma2_encoder",
    "bnb_quantized_int8b",
    "bnb_quantized_nf4b",
    "gguf_quantized",
    "external_api",
    "sdnq_quantized",
    "unknown",
)


def _with_families(values: tuple[str, ...]) -> tuple[str, ...]:
    own = tuple(family.invokeai.base for family in FAMILIES if family.invokeai.base not in values)
    return values + tuple(dict.fromkeys(own))


BASES = _with_families(INVOKEAI_OTHER_BASES)
BaseModelType = Literal[BASES]  # type: ignore[valid-type]
ModelType = Literal[INVOKEAI_MODEL_TYPES]  # type: ignore[valid-type]
ModelFormat = Literal[INVOKEAI_MODEL_FORMATS]  # type: ignore[valid-type]
