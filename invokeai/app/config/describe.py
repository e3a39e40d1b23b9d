"""Settings described in words, for error messages, the YAML template, the docs and the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args, get_origin

from pydantic.fields import FieldInfo

from invokeai.app.config.settings import ENV_PREFIX, InvokeAIAppConfig

SETTINGS: dict[str, FieldInfo] = InvokeAIAppConfig.model_fields


def _extra(name: str) -> dict[str, Any]:
    extra = SETTINGS[name].json_schema_extra
    return extra if isinstance(extra, dict) else {}


def description(name: str) -> str:
    return SETTINGS[name].description or ""


def is_startup_only(name: str) -> bool:
    return bool(_extra(name)["startup_only"])


def is_common(name: str) -> bool:
    return bool(_extra(name)["common"])


def is_secret(name: str) -> bool:
    return bool(_extra(name)["secret"])


def secret_settings() -> set[str]:
    return {name for name in SETTINGS if is_secret(name)}


def startup_only_settings() -> list[str]:
    return [name for name in SETTINGS if is_startup_only(name)]


def env_var(name: str) -> str:
    return f"{ENV_PREFIX}{name.upper()}"


def choices(name: str) -> tuple[str, ...] | None:
    """The values a setting is limited to, or None where the type alone bounds it."""
    annotation = SETTINGS[name].annotation
    return get_args(annotation) if get_origin(annotation) is Literal else None


def type_name(name: str) -> str:
    annotation = SETTINGS[name].annotation
    if get_origin(annotation) is Literal:
        return "choice"
    if name == "generation_devices":
        return "auto or a list"
    if get_origin(annotation) is list:
        return "list"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", Path: "path"}
    if annotation not in names:
        raise TypeError(f"no words for the type of setting {name!r}: {annotation!r}")
    return names[annotation]


def _bounds(field: FieldInfo) -> tuple[Any, Any]:
    # pydantic keeps ge=/le= as annotated_types.Ge/Le objects in the field's metadata.
    low = next((m.ge for m in field.metadata if hasattr(m, "ge")), None)
    high = next((m.le for m in field.metadata if hasattr(m, "le")), None)
    return low, high


def allowed_values(name: str) -> str:
    """What a setting accepts, e.g. "auto, sage, cudnn" or "an integer from 0 to 65535"."""
    if "allowed" in _extra(name):
        return str(_extra(name)["allowed"])
    limited_to = choices(name)
    if limited_to is not None:
        return ", ".join(limited_to)
    kind = type_name(name)
    if kind == "path":
        return "a path (relative to the root unless absolute)"
    if kind == "boolean":
        return "true or false"
    low, high = _bounds(SETTINGS[name])
    # Infinity and NaN are refused (see settings._as_written), which "a number" alone would not say.
    words = "an integer" if kind == "integer" else "a finite number" if kind == "number" else f"a {kind}"
    if low is not None and high is not None:
        return f"{words} from {low} to {high}"
    if low is not None:
        return f"{words} of at least {low}"
    if high is not None:
        return f"{words} of at most {high}"
    return words


def is_enumerated(name: str) -> bool:
    """Whether allowed_values lists the values (rather than describing a type)."""
    return "allowed" in _extra(name) or choices(name) is not None


def default_value(name: str) -> Any:
    """The default as it is written in YAML or JSON (paths as strings)."""
    default = SETTINGS[name].default
    return str(default) if isinstance(default, Path) else default
