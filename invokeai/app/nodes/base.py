"""Node base classes and the registry that maps each node's `type` string to its class."""

from __future__ import annotations

import inspect
import typing
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field

from invokeai.app.nodes.context import CanceledError, InvocationContext
from invokeai.app.nodes.fields import ImageField, Input, InputField, InputSpec, OutputField

__all__ = [
    "BaseInvocation",
    "BaseInvocationOutput",
    "CanceledError",
    "ImageField",
    "Input",
    "InputField",
    "InputSpec",
    "InvocationContext",
    "NodeRegistrationError",
    "OutputField",
    "invocation_classes",
    "output_classes",
]

# Fields every node has that are not inputs.
NODE_FIELDS = frozenset({"id", "type", "is_intermediate", "use_cache"})

_INVOCATIONS: dict[str, type[BaseInvocation]] = {}
_OUTPUTS: dict[str, type[BaseInvocationOutput]] = {}


class NodeRegistrationError(TypeError):
    """A node or output class that cannot be registered (duplicate type, missing type, undeclared input)."""


def _type_tag(cls: type[BaseModel]) -> str | None:
    field = cls.model_fields.get("type")
    if field is None or get_origin(field.annotation) is not Literal:
        return None
    args = get_args(field.annotation)
    return args[0] if len(args) == 1 and isinstance(args[0], str) else None


def _require_type(schema: dict[str, Any]) -> None:
    # `type` has a default so that nodes can be built in Python without repeating it, but a graph must name
    # each node's type (it is the union's discriminator), so the schema says it is required.
    required = schema.setdefault("required", [])
    if "type" in schema.get("properties", {}) and "type" not in required:
        required.insert(0, "type")


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _register(registry: dict[str, Any], cls: type[BaseModel], kind: str) -> None:
    tag = _type_tag(cls)
    if tag is None:
        raise NodeRegistrationError(f'{_qualified(cls)} must declare its {kind} type as `type: Literal["..."] = "..."`')
    if cls.model_fields["type"].default != tag:
        raise NodeRegistrationError(f"{_qualified(cls)}: the default of `type` must be {tag!r}")
    existing = registry.get(tag)
    if existing is not None:
        raise NodeRegistrationError(
            f"{kind} type {tag!r} of {_qualified(cls)} is already registered by {_qualified(existing)}"
        )
    registry[tag] = cls


class BaseInvocationOutput(BaseModel):
    """What a node returns. Subclasses declare `type: Literal["..._output"] = "..._output"` and output fields."""

    # A non-finite float would be stored as null and could not be read back: a node that returns one fails.
    model_config = ConfigDict(extra="forbid", json_schema_extra=_require_type, allow_inf_nan=False)

    type: str

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        _register(_OUTPUTS, cls, "output")

    @classmethod
    def output_fields(cls) -> dict[str, Any]:
        """Field name -> type, for every field an edge may read."""
        return {name: field.annotation for name, field in cls.model_fields.items() if name != "type"}


class BaseInvocation(BaseModel, ABC):
    """A node. Subclasses declare `type: Literal["name"] = "name"`, inputs with InputField, and `invoke`,
    whose return annotation is the output class. Concrete subclasses register themselves when defined."""

    # allow_inf_nan=False: the request body's decoder refuses NaN and Infinity as numbers, but pydantic would still
    # read the strings "NaN", "inf" or "1e999" into a float field; JSON cannot carry the result.
    model_config = ConfigDict(extra="forbid", json_schema_extra=_require_type, allow_inf_nan=False)

    id: str = Field(description="The id of this node; unique within its graph", min_length=1)
    type: str
    # InvokeAI's clients send both on every node; both are kept and returned with the graph as InvokeAI does.
    is_intermediate: bool = Field(
        default=False, description="Accepted and stored for InvokeAI's clients; this server does nothing with it."
    )
    # A node type whose output must not be reused (a random one) declares the field again with default False, as
    # InvokeAI's do; a graph may still set it either way.
    use_cache: bool = Field(
        default=True,
        description="Whether the node may take its output from the invocation cache (node_cache_size): the output "
        "a node of the same type with the same input values made before. An output that holds an image is never "
        "cached.",
    )

    _output_class: ClassVar[type[BaseInvocationOutput] | None] = None

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        # A template (family_nodes.py) says so in its own namespace: its subclasses inherit the attribute, not the
        # status.
        if inspect.isabstract(cls) or cls.__dict__.get("__node_template__", False):
            return
        for name, field in cls.model_fields.items():
            if name not in NODE_FIELDS and not isinstance(field.json_schema_extra, InputSpec):
                raise NodeRegistrationError(f"{_qualified(cls)}.{name}: declare node inputs with InputField(...)")
        _register(_INVOCATIONS, cls, "node")
        cls._output_class = None

    @abstractmethod
    def invoke(self, context: InvocationContext) -> BaseInvocationOutput: ...

    @classmethod
    def output_class(cls) -> type[BaseInvocationOutput]:
        """The class `invoke` returns, from its return annotation (read on first use: it may be defined later)."""
        if cls._output_class is None:
            try:
                output = typing.get_type_hints(cls.invoke).get("return")
            except NameError as error:
                raise NodeRegistrationError(
                    f"{_qualified(cls)}.invoke: its return annotation must name a module-level class ({error})"
                ) from error
            if not (isinstance(output, type) and issubclass(output, BaseInvocationOutput)):
                raise NodeRegistrationError(
                    f"{_qualified(cls)}.invoke must be annotated to return a BaseInvocationOutput subclass"
                )
            cls._output_class = output
        return cls._output_class

    @classmethod
    def input_specs(cls) -> dict[str, InputSpec]:
        """Field name -> how that input may be given, for every input field."""
        return {
            name: field.json_schema_extra
            for name, field in cls.model_fields.items()
            if isinstance(field.json_schema_extra, InputSpec)
        }

    @classmethod
    def input_types(cls) -> dict[str, Any]:
        return {name: cls.model_fields[name].annotation for name in cls.input_specs()}

    def missing_inputs(self) -> list[str]:
        """Required inputs that are neither set nor filled in (by prepare_node) from an edge."""
        return [
            name for name, spec in self.input_specs().items() if spec.required and name not in self.model_fields_set
        ]


def invocation_classes() -> list[type[BaseInvocation]]:
    """Every registered node class, in registration order."""
    return list(_INVOCATIONS.values())


def output_classes() -> list[type[BaseInvocationOutput]]:
    return list(_OUTPUTS.values())


def invocation_class(node_type: str) -> type[BaseInvocation] | None:
    return _INVOCATIONS.get(node_type)
