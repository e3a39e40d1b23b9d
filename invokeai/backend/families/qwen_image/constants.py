"""Qwen-Image's name and the numbers its generation code, estimators, runs and nodes share (diffusers'
QwenImagePipeline sets them)."""

from __future__ import annotations

from invokeai.backend.families.family import Constants

NAME = "qwen-image"
LATENT_SCALE = 8  # AutoencoderKLQwenImage: three stride-2 downsamplings
LATENT_CHANNELS = 16
PATCH = 2  # the transformer packs 2x2 latent cells into one 64-channel token
SIZE_MULTIPLE = LATENT_SCALE * PATCH
TIMESTEP_SCALE = 1000  # the transformer gets t / 1000

# The prompt goes inside this chat template; the text encoder's last hidden state of the first
# TEMPLATE_PREFIX_TOKENS tokens (the system prompt and the user turn's opening) is dropped. The tokenizer must encode
# the prefix to exactly that many tokens, or the prompt is cut (tokenizer.check_template).
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, text, "
    "spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
TEMPLATE_PREFIX = PROMPT_TEMPLATE.split("{}")[0]
TEMPLATE_PREFIX_TOKENS = 34
TOKENIZER_MAX_LENGTH = 1024  # tokens after the prefix the tokenizer keeps (it truncates the rest)
MAX_SEQUENCE_LENGTH = 512  # the pipeline's default: the prompt embeddings are cut to this many tokens
# Tokens of the template around an empty prompt, after the prefix ("<|im_end|>\n<|im_start|>assistant\n" in Qwen's
# tokenizer): what a short prompt adds to the words.
TEMPLATE_SUFFIX_TOKENS = 5

# The pipeline's resolution-dependent shift mu (calculate_shift's defaults, read from the scheduler's config).
SHIFT_DEFAULTS = {"base_image_seq_len": 256, "max_image_seq_len": 4096, "base_shift": 0.5, "max_shift": 1.15}

# QwenImagePipeline's defaults: 50 steps, true CFG 4 against a negative prompt (its docs: " " when there is none to
# give), 1328 x 1328 for a square image.
STEPS = 50
TRUE_CFG_SCALE = 4.0
NEGATIVE_PROMPT = " "
SIDE = 1328

CONSTANTS = Constants(
    latent_scale=LATENT_SCALE,
    latent_channels=LATENT_CHANNELS,
    size_multiple=SIZE_MULTIPLE,
    text_lengths={"text_encoder": MAX_SEQUENCE_LENGTH},
)

# Qwen-Image-Edit (QwenImageEditPipeline) and Edit-Plus (QwenImageEditPlusPipeline): the text encoder sees the
# reference images through Qwen2.5-VL's vision tower, inside another system prompt whose prefix (everything before
# the user turn's content) is EDIT_TEMPLATE_PREFIX_TOKENS tokens; the image tokens stay in the embeddings. Edit puts
# one image in the template; Edit-Plus puts "Picture i: <image>" before the prompt for each of its images.
EDIT_PIPELINE = "QwenImageEditPipeline"
EDIT_PLUS_PIPELINE = "QwenImageEditPlusPipeline"
EDIT_SYSTEM_PROMPT = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n"
)
VISION_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
EDIT_TEMPLATE = EDIT_SYSTEM_PROMPT + VISION_PLACEHOLDER + "{}<|im_end|>\n<|im_start|>assistant\n"
EDIT_PLUS_TEMPLATE = EDIT_SYSTEM_PROMPT + "{}<|im_end|>\n<|im_start|>assistant\n"
EDIT_PLUS_PICTURE = "Picture {}: " + VISION_PLACEHOLDER
EDIT_TEMPLATE_PREFIX_TOKENS = 64
# The pixel areas the Edit pipelines resize a reference image to, at its aspect ratio with sides rounded to
# multiples of REFERENCE_SIDE_MULTIPLE: what the VAE encodes (both; Edit's vision tower sees that image too) and what
# Edit-Plus's vision tower sees.
REFERENCE_VAE_AREA = 1024 * 1024
REFERENCE_CONDITION_AREA = 384 * 384
REFERENCE_SIDE_MULTIPLE = 32
