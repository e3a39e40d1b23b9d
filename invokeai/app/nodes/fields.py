"""How nodes declare inputs and outputs, and the value types that travel along edges."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import PydanticUndefined


class Input(StrEnum):
    """Where an input's value may come from."""

    ANY = "any"  # set in the graph, or fed by an edge
    DIRECT = "direct"  # only set in the graph
    CONNECTION = "connection"  # only fed by an edge


@dataclass(frozen=True)
class InputSpec:
    """What the graph needs to know about one input field; kept on the field as its json_schema_extra.

    `required` is the field's real requiredness. A required input that an edge may feed is parsed as optional
    (default None), since a graph that connects it leaves it out; validate_graph and prepare_node enforce it.
    """

    input: Input
    required: bool

    def __call__(self, schema: dict[str, Any]) -> None:
        # The parse-time default None is an implementation detail: the schema shows the real type, no default,
        # and says the input must be set or connected.
        if self.required and self.input is not Input.DIRECT:
            schema.pop("default", None)
        schema["input"] = self.input.value
        schema["orig_required"] = self.required


def _is_none(value: object) -> bool:
    return value is None


@dataclass(frozen=True)
class _Equals:
    default: Any

    def __call__(self, value: object) -> bool:
        return value is self.default or (type(value) is type(self.default) and value == self.default)


def InputField(  # named like pydantic's Field, which it wraps
    default: Any = PydanticUndefined,
    *,
    description: str | None = None,
    title: str | None = None,
    input: Input = Input.ANY,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    multiple_of: int | None = None,
    min_length: int | None = None,
    max_length: int | None = None,
    pattern: str | None = None,
) -> Any:
    """An input of a node. Without a default it is required: set in the graph or, unless DIRECT, connected."""
    required = default is PydanticUndefined
    deferred = required and input is not Input.DIRECT
    exclude_if = _is_none if deferred else None
    if input is Input.CONNECTION and not required:
        # An optional input only an edge feeds holds its default in any graph that is stored: left out of dumps
        # there, so that the graph read back does not seem to set it (which a connection-only input refuses).
        exclude_if = _Equals(default)
    return Field(
        # An unset connectable input parses as None without being validated (defaults are not validated), while an
        # explicit null is still refused by the field's real type.
        default=None if deferred else default,
        description=description,
        title=title,
        ge=ge,
        gt=gt,
        le=le,
        lt=lt,
        multiple_of=multiple_of,
        min_length=min_length,
        max_length=max_length,
        pattern=pattern,
        json_schema_extra=InputSpec(input=input, required=required),  # type: ignore[arg-type]
        # Left out of dumps while unset, so a stored or returned graph reads like the one that was sent.
        exclude_if=exclude_if,
    )


def OutputField(  # named like pydantic's Field
    default: Any = PydanticUndefined, *, description: str | None = None, title: str | None = None
) -> Any:
    """An output of a node; the name is what edges use as `source.field`."""
    return Field(default=default, description=description, title=title)


class ImageField(BaseModel):
    """An image passed between nodes: the name of an image the images service holds."""

    model_config = ConfigDict(extra="forbid")

    image_name: str = Field(description="The name of the image")
