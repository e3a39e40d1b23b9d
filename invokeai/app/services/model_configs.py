"""Model records as InvokeAI's clients read them (its `AnyModelConfig`): InvokeAI's `base`, `type`, `format`,
`file_size`, `variant`, `prediction_type`, `source_type`, `default_settings` and `trigger_phrases` beside this
server's own `family`, `size`, `config_variant` and `pipeline`.

The database keeps this server's words (model_records): a family, and a type that says which component a single
file holds. InvokeAI's words follow from them: the base is the family's (its descriptor), a lone transformer is a
"main" model (InvokeAI's loaders take its text encoders and VAE as separate models), a GGUF file's format is
"gguf_quantized"; the variant, prediction type and default settings come from the model's configs (describe_model).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from invokeai.app.invokeai_taxonomy import BaseModelType, ModelFormat, ModelType
from invokeai.app.services.model_records import MODEL_NAME_PATTERN, ModelFamily, ModelRecord
from invokeai.backend.families import RecordFacts, get_family
from invokeai.backend.models.describe import describe_model
from invokeai.backend.models.probe import ProbeResult

logger = logging.getLogger(__name__)

# This server's format -> InvokeAI's ModelFormat, where the words differ.
_FORMATS = {"gguf": "gguf_quantized"}
# This server's type of a lone component file -> InvokeAI's ModelType, where the words differ: InvokeAI records a
# transformer alone as a main model, whose loader takes the text encoders and VAE as other models.
_TYPES = {"transformer": "main"}
# Memo of each record's configs-derived facts (its files do not change under one key): bounded, least recent out.
_FACTS_CACHE = 1024

TriggerPhrase = Annotated[str, StringConstraints(min_length=1, max_length=200)]
TriggerPhrases = Annotated[list[TriggerPhrase], Field(max_length=100)]


class MainModelDefaultSettings(BaseModel):
    """InvokeAI's default settings of a main model: what its UI fills in when the model is picked."""

    model_config = ConfigDict(extra="forbid")

    vae: str | None = Field(default=None, max_length=200, description="Default VAE for this model (model key)")
    vae_precision: Literal["fp16", "fp32"] | None = Field(default=None, description="Default VAE precision")
    scheduler: str | None = Field(
        default=None, max_length=64, pattern=r"^[a-z0-9_]+$", description="Default scheduler for this model"
    )
    steps: int | None = Field(default=None, gt=0, le=10_000, description="Default number of steps")
    cfg_scale: float | None = Field(default=None, ge=1, le=1000, description="Default CFG scale")
    cfg_rescale_multiplier: float | None = Field(default=None, ge=0, lt=1, description="Default CFG rescale")
    width: int | None = Field(default=None, multiple_of=8, ge=64, le=65536, description="Default width")
    height: int | None = Field(default=None, multiple_of=8, ge=64, le=65536, description="Default height")
    guidance: float | None = Field(default=None, ge=1, le=1000, description="Default guidance")
    cpu_only: bool | None = Field(default=None, description="Whether this model should run on the CPU only")
    fp8_storage: bool | None = Field(default=None, description="Store weights in FP8 (not done here)")


class ModelConfig(BaseModel):
    """One installed model, in InvokeAI's fields (its AnyModelConfig) and this server's."""

    key: str = Field(description="Unique, made by the server at install.")
    hash: str = Field(description="sha256:<hex> of the files; empty when hash_models is off.")
    path: str = Field(description="Where the model is on the server's disk.")
    file_size: int = Field(description="Bytes on disk.")
    name: str = Field(description="Unique (case-insensitively); graphs may name the model by it.")
    description: str | None = Field(description="What the model is.")
    source: str = Field(description="What it was installed from: a path on the server.")
    source_type: Literal["path", "url", "hf_repo_id"] = Field(description="What `source` is.")
    source_api_response: str | None = Field(default=None, description="Always null here (no remote sources yet).")
    source_url: str | None = Field(default=None, description="Always null here (no remote sources yet).")
    cover_image: str | None = Field(default=None, description="Always null here (no cover images).")
    type: ModelType = Field(  # type: ignore[valid-type]
        description="InvokeAI's model type: main (a pipeline, or a transformer alone), vae, qwen3_encoder ..."
    )
    format: ModelFormat = Field(  # type: ignore[valid-type]
        description="InvokeAI's format: diffusers (a pipeline folder), checkpoint (one safetensors), gguf_quantized."
    )
    base: BaseModelType = Field(  # type: ignore[valid-type]
        description="InvokeAI's base architecture: the family's (its BaseModelType value, docs/families.md)."
    )
    variant: str | None = Field(
        description="InvokeAI's variant of the base, as its probe reads the model's configs (normal, inpaint, dev, "
        "schnell, turbo ...); null where InvokeAI's record has none."
    )
    prediction_type: str | None = Field(
        description="What the UNet predicts (epsilon, v_prediction), for SD models; null for the others."
    )
    repo_variant: str | None = Field(description='"" for a diffusers folder (its default weights); null otherwise.')
    config_path: str | None = Field(default=None, description="Always null: see config_variant.")
    cpu_only: bool | None = Field(default=None, description="Always null here.")
    trigger_phrases: list[str] | None = Field(description="Phrases that bring out what the model was tuned on.")
    default_settings: MainModelDefaultSettings | None = Field(
        description="The settings the user gave the model, else those InvokeAI gives its base and variant."
    )
    family: ModelFamily = Field(description="This server's model family: which nodes can use it.")  # type: ignore[valid-type]
    size: int = Field(description="Bytes on disk (as file_size).")
    config_variant: str | None = Field(
        description="The shipped config a single file loads with; null for a diffusers folder."
    )
    pipeline: bool = Field(
        description="true: a whole pipeline. false: one component's file (a transformer, VAE or text encoder), used "
        "with the text encoders and VAE of an installed pipeline of its family."
    )


def invokeai_type(record: ModelRecord) -> str:
    return _TYPES.get(record.type, record.type)


def invokeai_format(record: ModelRecord) -> str:
    return _FORMATS.get(record.format, record.format)


def invokeai_base(record: ModelRecord) -> str:
    return get_family(record.family).invokeai.base


@lru_cache(maxsize=_FACTS_CACHE)
def _facts(key: str, path: str, family: str, type: str, format: str, config_variant: str | None) -> RecordFacts:
    probe = ProbeResult(Path(path), family, type, format, config_variant, 0)
    try:
        return describe_model(probe)
    except Exception as error:  # a record must list even where its configs cannot be read on this host
        logger.warning("Could not describe model %s at %s: %s", key, path, error)
        return RecordFacts()


def record_facts(record: ModelRecord) -> RecordFacts:
    """What the model's configs say in InvokeAI's words (variant, prediction type, default settings); read once per
    record and remembered."""
    return _facts(record.key, record.path, record.family, record.type, record.format, record.config_variant)


def model_config(record: ModelRecord) -> ModelConfig:
    facts = record_facts(record)
    settings = record.default_settings if record.default_settings is not None else facts.default_settings
    return ModelConfig(
        key=record.key,
        hash=record.hash or "",
        path=record.path,
        file_size=record.size,
        name=record.name,
        description=record.description,
        source=record.source,
        source_type=record.source_type,
        type=invokeai_type(record),
        format=invokeai_format(record),
        base=invokeai_base(record),
        variant=facts.variant,
        prediction_type=facts.prediction_type,
        repo_variant="" if record.format == "diffusers" else None,
        trigger_phrases=record.trigger_phrases,
        default_settings=MainModelDefaultSettings(**settings) if settings is not None else None,
        family=record.family,
        size=record.size,
        config_variant=record.config_variant,
        pipeline=record.type == "main",
    )


def matching(
    records: Iterable[ModelRecord],
    *,
    base_models: Sequence[str] | None = None,
    model_type: str | None = None,
    model_name: str | None = None,
    model_format: str | None = None,
) -> list[ModelRecord]:
    """The records that InvokeAI's list filters keep: of one of `base_models` (any where none is given), of the
    type, the exact name (as InvokeAI: case-sensitive) and the format given."""
    bases = set(base_models or ())
    return [
        record
        for record in records
        if (not bases or invokeai_base(record) in bases)
        and (model_type is None or invokeai_type(record) == model_type)
        and (model_name is None or record.name == model_name)
        and (model_format is None or invokeai_format(record) == model_format)
    ]


def configs(records: Iterable[ModelRecord]) -> list[ModelConfig]:
    return [model_config(record) for record in records]


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


# The fields of InvokeAI's ModelRecordChanges that this server works out from the files: a client may send them
# (InvokeAI's UI sends a record back whole), but only with the values the files give.
PROBED_FIELDS = ("base", "type", "format", "variant", "prediction_type")


class ModelRecordChanges(BaseModel):
    """InvokeAI's ModelRecordChanges, as far as this server takes it: the fields a user sets (name, description,
    trigger phrases, default settings), and the ones the files decide (base, type, format, variant,
    prediction_type), which are refused when they differ from what the files say. Others InvokeAI has (key, path,
    hash, file_size, source ...) are refused: the server decides them."""

    model_config = ConfigDict(extra="forbid")

    # Not nullable: a model always has a name, so `"name": null` is refused (422), as the schema says. The default
    # only marks the field as left out; it is not a value, so the schema does not show it.
    name: str = Field(
        None,
        description="A unique name (the files are not renamed); at install: default the folder's or file's name.",
        pattern=MODEL_NAME_PATTERN,
        json_schema_extra=_no_default,
    )
    description: str | None = Field(None, max_length=2000, description="What the model is; null removes it.")
    trigger_phrases: TriggerPhrases | None = Field(None, description="Phrases that bring out what it was tuned on.")
    default_settings: MainModelDefaultSettings | None = Field(None, description="Defaults for the UI; null: none.")
    base: BaseModelType | None = Field(None, description="Must be the family's base, if given.")  # type: ignore[valid-type]
    type: ModelType | None = Field(None, description="Must be what the files are, if given.")  # type: ignore[valid-type]
    format: ModelFormat | None = Field(None, description="Must be the files' format, if given.")  # type: ignore[valid-type]
    variant: str | None = Field(None, max_length=64, description="Must be what the configs say, if given.")
    prediction_type: Literal["epsilon", "v_prediction", "sample"] | None = Field(
        None, description="Must be what the scheduler says, if given."
    )

    def stored(self) -> dict[str, Any]:
        """The changes to store: the fields set, but the probed ones (checked, never stored)."""
        values = self.model_dump(exclude_unset=True, exclude=set(PROBED_FIELDS))
        if self.default_settings is not None:
            values["default_settings"] = self.default_settings.model_dump(exclude_none=True)
        return values

    def mismatches(self, config: ModelConfig) -> list[str]:
        """The probed fields given with another value than the model's, each saying what the files give."""
        given = self.model_dump(exclude_unset=True, include=set(PROBED_FIELDS))
        return [
            f"{field} is {getattr(config, field)!r} (worked out from the files), not {value!r}"
            for field, value in given.items()
            if value is not None and value != getattr(config, field)
        ]
