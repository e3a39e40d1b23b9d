"""Load one component of a probed model, whatever its format, onto a device in a dtype."""

from __future__ import annotations

import json
from typing import Any

import torch

from . import krea2, sd1
from .config_variants import ConfigVariant, get_variant
from .errors import UnsupportedModelError
from .probe import ProbeResult

COMPONENTS = {sd1.FAMILY: sd1.COMPONENTS, krea2.FAMILY: krea2.COMPONENTS}


def components_of(probe: ProbeResult) -> tuple[str, ...]:
    """The components this model provides: a whole pipeline all of its family's, a GGUF file its transformer."""
    if probe.format == "gguf":
        return ("transformer",)
    return COMPONENTS[probe.family]


def architecture(probe: ProbeResult, component: str) -> dict[str, Any]:
    """The component's config without diffusers' bookkeeping (`_class_name`, `_diffusers_version` ...), read from
    the files, no weights loaded: two components with equal architectures are interchangeable in a pipeline."""
    if component not in components_of(probe):
        raise UnsupportedModelError(f"{probe.path.name}: a {probe.family} {probe.format} model has no {component}")
    if probe.format == "diffusers":
        config = json.loads((probe.path / component / "config.json").read_text(encoding="utf-8"))
    else:
        config = _variant(probe).component_config(component)
    return {key: value for key, value in config.items() if not key.startswith("_")}


def load_component(
    probe: ProbeResult,
    component: str,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Any:
    """A model (eval mode, on `device`, in `dtype`), tokenizer or scheduler."""
    if component not in components_of(probe):
        raise UnsupportedModelError(
            f"{probe.path.name}: a {probe.family} {probe.format} model has no {component}; "
            f"it has {', '.join(components_of(probe))}"
        )
    if probe.format == "diffusers":
        from .load_diffusers import load_diffusers_component

        loaded = load_diffusers_component(probe.path, component, dtype)
    elif probe.format == "checkpoint" and probe.family == sd1.FAMILY:
        from .load_single_file import load_sd1_checkpoint_component

        loaded = load_sd1_checkpoint_component(probe.path, _variant(probe), component, dtype)
    elif probe.format == "gguf" and probe.family == krea2.FAMILY:
        from .load_gguf import load_krea2_gguf_transformer

        loaded = load_krea2_gguf_transformer(probe.path, _variant(probe), dtype)
    else:
        raise UnsupportedModelError(f"{probe.path.name}: no loader for {probe.family} in {probe.format} format")
    if isinstance(loaded, torch.nn.Module):
        loaded = loaded.to(device).eval()
    return loaded


def _variant(probe: ProbeResult) -> ConfigVariant:
    if probe.config_variant is None:
        raise UnsupportedModelError(f"{probe.path.name}: a single file needs a config variant; probe it first")
    return get_variant(probe.config_variant)
