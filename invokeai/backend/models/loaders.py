"""Load one component of a probed model, whatever its format, onto a device in a dtype.

A diffusers folder loads the same way for every family (the classes its model_index.json names); a single file
loads through the family's file rule for its format, with configs from its shipped variant.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from invokeai.backend.families import FileRule, config_variant, get_family
from invokeai.backend.models.config_variants import ConfigVariant

from .errors import UnsupportedModelError
from .probe import WEIGHT_SUFFIXES, ProbeResult


def _file_rule(probe: ProbeResult) -> FileRule:
    family = get_family(probe.family)
    for rule in family.files:
        if rule.format == probe.format and rule.type == probe.type:
            return rule
    raise UnsupportedModelError(
        f"{probe.path.name}: no loader for {probe.family} {probe.type} in {probe.format} format"
    )


def components_of(probe: ProbeResult) -> tuple[str, ...]:
    """The components this model provides: a whole pipeline all of its family's, a lone component file (a
    transformer, a VAE, a text encoder) those of its file rule."""
    if probe.format == "diffusers":
        return get_family(probe.family).components
    return _file_rule(probe).components


def architecture(probe: ProbeResult, component: str) -> dict[str, Any]:
    """The component's config without diffusers' bookkeeping (`_class_name`, `_diffusers_version` ...), read from
    the files, no weights loaded: two components with equal architectures are interchangeable in a pipeline."""
    if component not in components_of(probe):
        raise UnsupportedModelError(f"{probe.path.name}: a {probe.family} {probe.format} model has no {component}")
    if probe.format == "diffusers":
        config = json.loads((probe.path / component / "config.json").read_text(encoding="utf-8"))
    else:
        config = _variant(probe).component_config(component)
    # Rewritten before the bookkeeping goes: a rewrite may depend on it (the version that wrote the file).
    config = _as_the_pipeline_runs(probe, component, config)
    return {key: value for key, value in config.items() if not key.startswith("_")}


# What a transformers config.json says about who wrote it and the dtype it was saved in, not what the model computes.
_WRITER_KEYS = frozenset({"architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path"})


def comparable_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A component's config in a form in which two configs of one architecture are equal. A transformers model's
    (its config names a `model_type`) is read through its config class, which brings a config.json that another
    transformers version wrote to this version's form (`rope_theta` -> `rope_parameters`, `layer_types` filled in),
    without the keys that say who wrote it and in what dtype (`architectures` included: a base model and its
    language-model head share the body); any other config is returned as it is."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str):
        return dict(config)
    from transformers import AutoConfig

    try:
        normalised = AutoConfig.for_model(**config).to_dict()
    except (ValueError, TypeError, KeyError):
        return dict(config)  # a model type this transformers does not know: compared as written
    return {key: value for key, value in normalised.items() if key not in _WRITER_KEYS}


def pipeline_options(probe: ProbeResult) -> dict[str, Any]:
    """The model_index.json keys the family's nodes honour (its `pipeline_options`), as the stock pipeline takes
    them from a folder's file (a single file's: its shipped config's): the pipeline's default where the file has
    none."""
    family = get_family(probe.family)
    if not family.pipeline_options:
        return {}
    folder = probe.path if probe.format == "diffusers" else _variant(probe).path
    index_file = folder / "model_index.json"
    return family.options_in(json.loads(index_file.read_text(encoding="utf-8")) if index_file.is_file() else {})


def _as_the_pipeline_runs(probe: ProbeResult, component: str, config: dict[str, Any]) -> dict[str, Any]:
    """`config` as the stock pipeline's __init__ leaves it (the family's `config_rewrites`)."""
    rewrite = get_family(probe.family).config_rewrites.get(component)
    return config if rewrite is None else rewrite(config)


def config_defaults(probe: ProbeResult, component: str) -> dict[str, Any]:
    """The init arguments, with their defaults, of the diffusers class the model's model_index.json names for
    `component` (a single file's: its shipped config's); {} where none is named or the class keeps no config. A
    folder diffusers saved lists every argument, a published config.json only those that differ from the defaults:
    with these filled in, the two describe one architecture the same way."""
    import inspect

    from .load_diffusers import component_class

    folder = probe.path if probe.format == "diffusers" else _variant(probe).path
    try:
        cls = component_class(folder, component)
    except (OSError, ValueError, UnsupportedModelError):
        return {}
    if not (cls.__module__.startswith("diffusers") and hasattr(cls, "config_name")):
        return {}
    parameters = inspect.signature(cls.__init__).parameters.values()
    defaults = {p.name: p.default for p in parameters if p.default is not inspect.Parameter.empty}
    # As JSON would hold them: tuples become lists, so a default compares equal to the value a config.json gives.
    return json.loads(json.dumps(defaults, default=str))


def import_classes(probe: ProbeResult) -> list[str]:
    """Import the class of every component of the model (the classes its model_index.json names; a single file's:
    its shipped config's), reading no weights; the names of the classes imported. What a first load pays beside
    the read: diffusers' and transformers' imports take seconds of CPU, while a small model reads in a fraction of
    one (docs/performance.md). A component whose class cannot be named is skipped: its load will say why."""
    from .load_diffusers import component_class

    folder = probe.path if probe.format == "diffusers" else _variant(probe).path
    imported = []
    for component in components_of(probe):
        try:
            imported.append(component_class(folder, component).__name__)
        except (OSError, ValueError, UnsupportedModelError):
            continue
    return imported


def expected_bytes(probe: ProbeResult, component: str, dtype: torch.dtype) -> int:
    """An upper estimate of the RAM the component takes once loaded in `dtype`, from file sizes only: its weight
    files (a single file: the whole file, whatever else it holds), widened as if they were stored in 16 bits. The
    warm-up loads a component only where this fits beside what the cache holds."""
    if probe.format == "diffusers":
        folder = probe.path / component
        files = folder.iterdir() if folder.is_dir() else ()
        stored = sum(f.stat().st_size for f in files if f.suffix in WEIGHT_SUFFIXES)
    else:
        stored = probe.size
    return stored * max(1, dtype.itemsize // 2)


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
    else:
        loaded = _file_rule(probe).load(probe.path, _variant(probe), component, dtype)
    if hasattr(loaded, "_internal_dict"):
        # A diffusers scheduler or model: its config replaced as the pipeline's __init__ replaces it (the object is
        # not rebuilt; whatever reads the config, a step or a scheduler made from it, reads the new one).
        from diffusers.configuration_utils import FrozenDict

        config = dict(loaded.config)
        rewritten = _as_the_pipeline_runs(probe, component, config)
        if rewritten != config:
            loaded._internal_dict = FrozenDict(rewritten)
    if isinstance(loaded, torch.nn.Module):
        loaded = loaded.to(device).eval()
    return loaded


def _variant(probe: ProbeResult) -> ConfigVariant:
    if probe.config_variant is None:
        raise UnsupportedModelError(f"{probe.path.name}: a single file needs a config variant; probe it first")
    try:
        return config_variant(probe.config_variant)
    except KeyError as error:
        raise UnsupportedModelError(f"{probe.path.name}: {error.args[0]}") from None
