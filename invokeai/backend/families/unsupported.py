"""Single-file layouts of models this server does not run (yet), recognised by tensor names only, so that a refusal
can say what a file looks like rather than only that no family's layout fits it. Files that look like a registered
family's but that it does not run are that family's to name (`Family.lookalikes`); this list holds those of no
registered family."""

from __future__ import annotations

from collections.abc import Iterable

UNSUPPORTED_LAYOUTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "a Stable Diffusion 2.x checkpoint (an OpenCLIP text encoder under cond_stage_model.model)",
        ("cond_stage_model.model.",),
    ),
)


def unsupported_layout(names: Iterable[str], lookalikes: Iterable[tuple[str, tuple[str, ...]]] = ()) -> str | None:
    """What the file with these tensor names looks like: the first of `lookalikes` (the families'), then of
    UNSUPPORTED_LAYOUTS, whose prefixes a name starts with; None when none fits."""
    names = list(names)
    for description, prefixes in (*lookalikes, *UNSUPPORTED_LAYOUTS):
        if any(name.startswith(prefixes) for name in names):
            return description
    return None
