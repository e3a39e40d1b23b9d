"""Single-file layouts of models this server does not run (yet), recognised by tensor names only, so that a refusal
can say what a file looks like rather than only that no family's layout fits it."""

from __future__ import annotations

from collections.abc import Iterable

UNSUPPORTED_LAYOUTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "an SDXL refiner checkpoint (OpenCLIP-G as its only text encoder, under conditioner.embedders.0.model)",
        ("conditioner.embedders.0.model.",),
    ),
    (
        # The flux family's rule wants every marker of a whole transformer; a file with only some is not one it runs.
        "a FLUX.1 transformer (double_blocks / single_blocks) without the tensors a whole one has",
        ("double_blocks.", "model.diffusion_model.double_blocks."),
    ),
    (
        "a Stable Diffusion 2.x checkpoint (an OpenCLIP text encoder under cond_stage_model.model)",
        ("cond_stage_model.model.",),
    ),
)


def unsupported_layout(names: Iterable[str]) -> str | None:
    names = list(names)
    for description, prefixes in UNSUPPORTED_LAYOUTS:
        if any(name.startswith(prefixes) for name in names):
            return description
    return None
