"""Primitive value nodes (integer, float, string, boolean) and a seeded random integer."""

from __future__ import annotations

import random
from typing import Literal

from pydantic import Field, model_validator

from invokeai.app.nodes.base import BaseInvocation, BaseInvocationOutput, InputField, InvocationContext, OutputField


class IntegerOutput(BaseInvocationOutput):
    type: Literal["integer_output"] = "integer_output"
    value: int = OutputField(description="The output integer")


class FloatOutput(BaseInvocationOutput):
    type: Literal["float_output"] = "float_output"
    value: float = OutputField(description="The output float")


class StringOutput(BaseInvocationOutput):
    type: Literal["string_output"] = "string_output"
    value: str = OutputField(description="The output string")


class BooleanOutput(BaseInvocationOutput):
    type: Literal["boolean_output"] = "boolean_output"
    value: bool = OutputField(description="The output boolean")


class IntegerInvocation(BaseInvocation):
    """An integer value."""

    type: Literal["integer"] = "integer"
    value: int = InputField(default=0, description="The integer value")

    def invoke(self, context: InvocationContext) -> IntegerOutput:
        return IntegerOutput(value=self.value)


class FloatInvocation(BaseInvocation):
    """A float value."""

    type: Literal["float"] = "float"
    value: float = InputField(default=0.0, description="The float value")

    def invoke(self, context: InvocationContext) -> FloatOutput:
        return FloatOutput(value=self.value)


class StringInvocation(BaseInvocation):
    """A string value."""

    type: Literal["string"] = "string"
    value: str = InputField(default="", description="The string value")

    def invoke(self, context: InvocationContext) -> StringOutput:
        return StringOutput(value=self.value)


class BooleanInvocation(BaseInvocation):
    """A boolean value."""

    type: Literal["boolean"] = "boolean"
    value: bool = InputField(default=False, description="The boolean value")

    def invoke(self, context: InvocationContext) -> BooleanOutput:
        return BooleanOutput(value=self.value)


class RandomIntInvocation(BaseInvocation):
    """A random integer with low <= value < high. Unseeded (InvokeAI's node) it is a new number each run, and never
    cached; with a seed (this server's addition) the same seed gives the same value."""

    type: Literal["rand_int"] = "rand_int"
    # False by default, as InvokeAI's rand_int (which draws without a seed) declares it: a graph built for InvokeAI
    # that leaves it out expects a run of its own each time.
    use_cache: bool = Field(
        default=False,
        description="Whether the node may take its output from the invocation cache; false unless the graph sets "
        "it, as InvokeAI's rand_int.",
    )
    low: int = InputField(default=0, description="The inclusive low value")
    high: int = InputField(default=2_147_483_647, description="The exclusive high value")
    seed: int | None = InputField(
        default=None, ge=0, description="The seed of the random number generator; unset: a new number each run"
    )

    @model_validator(mode="after")
    def _range_is_not_empty(self) -> RandomIntInvocation:
        # Either bound may arrive by edge (None until then); prepare_node validates again with both in place.
        if self.low is not None and self.high is not None and self.high <= self.low:
            raise ValueError(f"high ({self.high}) must be greater than low ({self.low})")
        return self

    def invoke(self, context: InvocationContext) -> IntegerOutput:
        # A private generator: the global one is shared by every thread, and its state is not the seed's alone.
        generator = random.SystemRandom() if self.seed is None else random.Random(self.seed)
        return IntegerOutput(value=generator.randrange(self.low, self.high))
