"""The family descriptor: everything the generic code (probe, loaders, records, demo install, estimators, nodes)
needs to know about one model family, declared once in the family's own folder.

The generic modules hold no table keyed by family names: they iterate `invokeai.backend.families.FAMILIES` and read
these fields. A descriptor module imports no diffusers or transformers at import time (the server imports every
descriptor at startup, and the records' family names come from them); builders, loaders and schedulers import
what they need when called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from invokeai.backend.models.config_variants import ConfigVariant, Signature

# (config, CallFacts) -> WorkingMemory, and (model, CallFacts, generator) -> a no-argument forward pass; typed
# loosely here so that this module does not import the cache package.
Estimator = Callable[[Any, Any], Any]
RunBuilder = Callable[[Any, Any, torch.Generator], Callable[[], Any]]
# (single file, its config variant, component, dtype) -> the loaded component (module, tokenizer or scheduler).
FileLoader = Callable[[Path, ConfigVariant, str, torch.dtype], Any]
# A component's config (as loaded: private keys such as `_diffusers_version` included) -> the config the stock
# pipeline's __init__ leaves it with; a new dict, equal to the old one where nothing needs rewriting.
ConfigRewrite = Callable[[Mapping[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Constants:
    """Numbers that the generation code, the estimators, the calibration runs and the nodes share.

    `latent_scale`: pixels a latent spans on a side (the VAE's factor); `size_multiple`: what width and height must
    be multiples of (the latent scale times the transformer's patch side); `latent_channels`: the VAE's latent
    channels; `text_lengths`: token lengths the pipeline pads prompts to, by text encoder.
    """

    latent_scale: int
    latent_channels: int
    size_multiple: int
    text_lengths: Mapping[str, int]


@dataclass(frozen=True)
class FileRule:
    """How one kind of single file of the family is recognised, checked and loaded.

    `container` is what the bytes are ("safetensors" or "gguf"); `format` what records call the result
    ("checkpoint" or "gguf"); `type` "main" (a whole pipeline in one file) or the type of the one component it holds,
    as records and clients call it (InvokeAI's model types: "transformer", "vae", "qwen3_encoder" ...); a family's
    rules differ in (format, type), which is how the loader finds a record's rule. `components` are the pipeline
    components the file provides (a lone component's others, such as a text encoder's tokenizer, come from the
    installed pipeline the model manager pairs it with).
    `matches(names)` says whether a file with these tensor names is this kind (markers only, no shapes);
    `canonical_name` maps a tensor name to the names `signature` uses (the file may be in the original layout);
    `signature(variant)` gives the shapes a file made for that shipped config has. `refusal(shapes)` (canonical
    names) may say in words what a file this rule recognises by name but no shipped config fits is instead (a VAE
    of 4 latent channels, a text encoder of another size); the probe's refusal leads with it. When another rule
    also recognises the file, the probe tries it before refusing.
    """

    container: str
    format: str
    type: str
    what: str
    components: tuple[str, ...]
    matches: Callable[[Iterable[str]], bool]
    signature: Callable[[ConfigVariant], Signature]
    load: FileLoader
    canonical_name: Callable[[str], str] = str
    refusal: Callable[[Mapping[str, tuple[int, ...]]], str | None] | None = None


@dataclass(frozen=True)
class DemoModel:
    """A tiny random-weight model of the family, built on first start. `filename` is the folder or file name the
    builder writes under the destination; `build(path)` writes it there, deterministically."""

    name: str
    description: str
    type: str
    format: str
    filename: str
    build: Callable[[Path], None]


@dataclass(frozen=True)
class GraphFacts:
    """How a client (the web UI, GET /api/v1/app/families) builds this family's text-to-image and image-to-image
    graph from its node types: prompt -> text encoder -> denoise -> decode, and image -> encode -> denoise.

    Without a `loader`, every node names the model itself in its `model` input. With one (InvokeAI's
    `<family>_model_loader` style), only the loader names it, and `loader_links` says which loader output feeds
    which input of each node (by role: text_encoder, denoise, decode, encode). `negative` says when a negative
    prompt's encoder is wired in: always (unless guidance is at `guidance_off`), only when one is given, or never.
    `strength_field` is the denoise input of image-to-image: `denoising_strength` (how much of the schedule runs) or
    InvokeAI's `denoising_start` (where in the schedule it starts: 1 - strength). `steps_field` is the denoise input
    of the step count (InvokeAI's FLUX.1 node calls it `num_steps`). `pipeline_guidance_offset` is what
    the stock diffusers pipeline's `guidance_scale` adds to the node's guidance value for the same image (InvokeAI's
    CFG scale, 1 for none, against a pipeline whose 0 is none: -1); `pipeline_guidance_argument` is the pipeline's
    argument that takes it (`guidance_scale`, or Qwen-Image's `true_cfg_scale`).
    """

    text_encoder: str
    denoise: str
    decode: str
    encode: str | None = None
    loader: str | None = None
    loader_links: Mapping[str, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    conditioning_field: str = "positive_conditioning"
    negative: Literal["always", "when_given", "never"] = "always"
    second_prompt_label: str | None = None
    steps_field: str = "steps"
    guidance_field: str = "cfg_scale"
    guidance_label: str = "CFG scale"
    guidance_off: float = 1.0
    strength_field: Literal["denoising_strength", "denoising_start"] = "denoising_strength"
    pipeline_guidance_offset: float = 0.0
    pipeline_guidance_argument: str = "guidance_scale"

    def node_types(self) -> tuple[str, ...]:
        return tuple(t for t in (self.loader, self.text_encoder, self.denoise, self.decode, self.encode) if t)


@dataclass(frozen=True)
class RecordFacts:
    """What InvokeAI's model records say of one model beyond what its files' layout says: its `variant` (InvokeAI's
    value for the family: "normal", "dev", "turbo" ...), the scheduler's `prediction_type` where the family's
    records carry one, and the `default_settings` InvokeAI's probe gives it (MainModelDefaultSettings fields)."""

    variant: str | None = None
    prediction_type: str | None = None
    default_settings: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ModelOnDisk:
    """One model as a family's `describe` sees it: `read(part)` gives a config of it ({} where it has none): a
    component's config.json, "scheduler" its scheduler_config.json, "model_index" its model_index.json (a single
    file's: those of its shipped config); `type` is the record's type ("main" or the one component's FileRule.type),
    `name` its file or folder name, `single_file` whether it is one file."""

    read: Callable[[str], Mapping[str, Any]]
    type: str
    name: str
    single_file: bool


def _no_facts(model: ModelOnDisk) -> RecordFacts:
    return RecordFacts()


@dataclass(frozen=True)
class InvokeAIFacts:
    """How InvokeAI 6.14.2's model records (GET /api/v2/models/) describe the family's models.

    `base` is InvokeAI's BaseModelType value for the family ("sd-1", "flux", "z-image" ...), or, for a family
    InvokeAI has no base for, this server's own value. `describe(model)` works out a model's RecordFacts from its
    configs, as InvokeAI's probe does.
    """

    base: str
    describe: Callable[[ModelOnDisk], RecordFacts] = _no_facts


@dataclass(frozen=True)
class Family:
    """One model family.

    `operations` maps every estimator operation to the model component it runs (a component maps to itself;
    vae_decode and vae_encode run the vae); `estimators` and `runs` are keyed by operation. `folder_check(configs)`
    lists how a diffusers folder of one of `pipeline_classes` differs from what the family's nodes run (configs:
    component -> parsed config.json, scheduler -> scheduler_config.json, and "model_index" -> the folder's
    `pipeline_options`); empty means it runs.
    `make_scheduler(name, base_config)` builds one of `scheduler_names` on the model's own noise schedule.
    `node_module` is the dotted name of the module holding the family's nodes (imported by the app, never here);
    `graph` how clients wire them into a generation graph. `lookalikes` are single files that look like the
    family's but that it does not run: (what the file is, tensor-name prefixes that tell it), so that the probe's
    refusal says what a file looks like rather than only that no rule fits it.

    What the stock pipeline does to a model's configs, the server does through two declarations (docs/api.md,
    Pipeline flags and config rewrites): `config_rewrites` maps a component to the function that rewrites its loaded
    config as the pipeline's `__init__` does (legacy values it corrects; the loader applies it to whatever it loads
    for the component, so its nodes and schedulers see the config the pipeline runs); `pipeline_options` maps each
    model_index.json key the family's nodes honour to the pipeline's default for a model whose file has none.
    `invokeai` says how InvokeAI's records describe the family's models: their base, variant and defaults.
    """

    name: str
    title: str
    pipeline_classes: tuple[str, ...]
    components: tuple[str, ...]
    module_components: tuple[str, ...]
    constants: Constants
    operations: Mapping[str, str]
    estimators: Mapping[str, Estimator]
    runs: Mapping[str, RunBuilder]
    scheduler_names: tuple[str, ...]
    make_scheduler: Callable[[str, Mapping[str, Any]], Any]
    node_module: str
    graph: GraphFacts
    config_variants: tuple[ConfigVariant, ...] = ()
    files: tuple[FileRule, ...] = ()
    demos: tuple[DemoModel, ...] = ()
    folder_check: Callable[[Mapping[str, dict[str, Any]]], list[str]] | None = None
    lookalikes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Components read from the folder's configs for folder_check (scheduler_config.json for the scheduler).
    checked_configs: tuple[str, ...] = field(default=())
    config_rewrites: Mapping[str, ConfigRewrite] = field(default_factory=dict)
    pipeline_options: Mapping[str, Any] = field(default_factory=dict)
    # Keyword-only so that it can follow the defaults and still be required: every family names its base.
    invokeai: InvokeAIFacts = field(kw_only=True)

    def options_in(self, model_index: Mapping[str, Any]) -> dict[str, Any]:
        """The `pipeline_options` a parsed model_index.json gives, the pipeline's defaults for those it lacks."""
        return {key: model_index.get(key, default) for key, default in self.pipeline_options.items()}

    def component_of(self, operation: str) -> str:
        try:
            return self.operations[operation]
        except KeyError:
            known = ", ".join(sorted(self.operations))
            raise KeyError(f"the {self.name} family has no operation {operation!r}; known: {known}") from None
