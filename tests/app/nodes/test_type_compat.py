"""can_connect: which output types may feed which input types."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

from invokeai.app.nodes.base import ImageField
from invokeai.app.nodes.compat import can_connect


class SpecialImage(ImageField):
    pass


class Other(BaseModel):
    image_name: str


@pytest.mark.parametrize(
    ("source", "destination", "expected"),
    [
        (int, int, True),
        (int, float, True),
        (float, int, False),
        (bool, int, False),
        (bool, bool, True),
        (str, int, False),
        (int, int | None, True),
        (int | None, int, True),
        (int | str, int, False),
        (int | str, float | str, True),
        (ImageField, ImageField, True),
        (SpecialImage, ImageField, True),
        (ImageField, SpecialImage, False),
        (Other, ImageField, False),
        (str, Any, True),
        (ImageField, Any, True),
        (Any, int, True),
        (list[int], list[float], True),
        (list[str], list[int], False),
        (list[int], int, False),
        (int, list[int], False),
        (dict[str, int], dict[str, float], True),
        (Literal["a", "b"], str, True),
        (Literal["a", "b"], Literal["a", "b", "c"], True),
        (Literal["a", "z"], Literal["a", "b"], False),
        (str, Literal["a"], False),
        (Annotated[int, Field(ge=0)], float, True),
        (type(None), int, False),
    ],
)
def test_can_connect(source: Any, destination: Any, expected: bool) -> None:
    assert can_connect(source, destination) is expected
