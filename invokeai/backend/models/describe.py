"""What InvokeAI's records say of a probed model beyond its layout (variant, prediction type, default settings), from
its config files, by its family's `invokeai.describe`. No weights are read."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from invokeai.backend.families import ModelOnDisk, RecordFacts, config_variant, get_family

from .probe import ProbeResult

# A config file larger than this is not a config: it is not read (a model's are a few KiB).
_MAX_CONFIG_BYTES = 1024 * 1024


def _config_file(folder: Path, part: str) -> Path:
    if part == "model_index":
        return folder / "model_index.json"
    if part == "scheduler":
        return folder / "scheduler" / "scheduler_config.json"
    return folder / part / "config.json"


def _reader(folder: Path) -> Any:
    def read(part: str) -> Mapping[str, Any]:
        file = _config_file(folder, part)
        try:
            if file.stat().st_size > _MAX_CONFIG_BYTES:
                return {}
            config = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}  # missing or unreadable: the family's describe falls back as InvokeAI's probe does
        return config if isinstance(config, dict) else {}

    return read


def describe_model(probe: ProbeResult) -> RecordFacts:
    """The model's RecordFacts; those of its family's defaults where its configs cannot be read."""
    single_file = probe.format != "diffusers"
    folder = config_variant(probe.config_variant).path if single_file and probe.config_variant else probe.path
    model = ModelOnDisk(read=_cached(_reader(folder)), type=probe.type, name=probe.path.name, single_file=single_file)
    return get_family(probe.family).invokeai.describe(model)


def _cached(read: Any) -> Any:
    # A describe may ask for one config twice (a variant and its defaults): read each file once.
    return lru_cache(maxsize=8)(read)
