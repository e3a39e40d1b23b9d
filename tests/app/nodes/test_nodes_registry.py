"""The node registry: every concrete node class is registered under its unique `type`."""

# No `from __future__ import annotations` here: the classes these tests define are local to a function, and the
# registry reads `invoke`'s return annotation, which as a string would not resolve outside the function.

from typing import Literal

import pytest

from invokeai.app.nodes.base import (
    BaseInvocation,
    BaseInvocationOutput,
    InputField,
    InvocationContext,
    NodeRegistrationError,
    OutputField,
    invocation_class,
    invocation_classes,
    output_classes,
)
from invokeai.app.nodes.primitives import IntegerInvocation, IntegerOutput

BUILT_IN = {"integer", "float", "string", "boolean", "rand_int", "blank_image", "image_resize", "image_blend"}


def test_built_in_nodes_are_registered_with_their_output_classes() -> None:
    types = {cls.model_fields["type"].default for cls in invocation_classes()}
    assert types >= BUILT_IN
    for cls in invocation_classes():
        assert cls.output_class() in output_classes()
    assert invocation_class("integer") is IntegerInvocation
    assert IntegerInvocation.output_class() is IntegerOutput


@pytest.mark.usefixtures("scratch_registry")
def test_duplicate_node_type_is_an_error_naming_both_classes() -> None:
    before = invocation_classes()
    with pytest.raises(NodeRegistrationError) as caught:

        class AnotherInteger(BaseInvocation):
            type: Literal["integer"] = "integer"

            def invoke(self, context: InvocationContext) -> IntegerOutput:
                return IntegerOutput(value=1)

    message = str(caught.value)
    assert "'integer'" in message
    assert "AnotherInteger" in message and "IntegerInvocation" in message
    assert invocation_classes() == before
    assert invocation_class("integer") is IntegerInvocation


@pytest.mark.usefixtures("scratch_registry")
def test_duplicate_output_type_is_an_error() -> None:
    with pytest.raises(NodeRegistrationError, match=r"'integer_output'.*IntegerOutput"):

        class AnotherIntegerOutput(BaseInvocationOutput):
            type: Literal["integer_output"] = "integer_output"


@pytest.mark.usefixtures("scratch_registry")
def test_new_node_class_registers_itself_and_abstract_ones_do_not() -> None:
    from abc import abstractmethod

    class Intermediate(BaseInvocation):
        @abstractmethod
        def invoke(self, context: InvocationContext) -> IntegerOutput: ...

    class Doubler(Intermediate):
        type: Literal["test_doubler"] = "test_doubler"
        value: int = InputField(description="a number")

        def invoke(self, context: InvocationContext) -> IntegerOutput:
            return IntegerOutput(value=2 * self.value)

    assert invocation_class("test_doubler") is Doubler
    assert Intermediate not in invocation_classes()


@pytest.mark.usefixtures("scratch_registry")
def test_node_without_a_literal_type_is_refused() -> None:
    with pytest.raises(NodeRegistrationError, match="must declare its node type"):

        class Untyped(BaseInvocation):
            def invoke(self, context: InvocationContext) -> IntegerOutput:
                return IntegerOutput(value=0)


@pytest.mark.usefixtures("scratch_registry")
def test_inputs_must_be_declared_with_input_field() -> None:
    with pytest.raises(NodeRegistrationError, match=r"PlainField\.value: declare node inputs with InputField"):

        class PlainField(BaseInvocation):
            type: Literal["test_plain"] = "test_plain"
            value: int = 3

            def invoke(self, context: InvocationContext) -> IntegerOutput:
                return IntegerOutput(value=self.value)


@pytest.mark.usefixtures("scratch_registry")
def test_output_class_comes_from_the_return_annotation() -> None:
    class Pair(BaseInvocationOutput):
        type: Literal["test_pair_output"] = "test_pair_output"
        first: int = OutputField()

    class MakesPair(BaseInvocation):
        type: Literal["test_makes_pair"] = "test_makes_pair"

        def invoke(self, context: InvocationContext) -> Pair:
            return Pair(first=1)

    class Unannotated(BaseInvocation):
        type: Literal["test_unannotated"] = "test_unannotated"

        def invoke(self, context):  # type: ignore[no-untyped-def]
            return Pair(first=1)

    assert MakesPair.output_class() is Pair
    assert Pair.output_fields() == {"first": int}
    with pytest.raises(NodeRegistrationError, match="must be annotated"):
        Unannotated.output_class()
