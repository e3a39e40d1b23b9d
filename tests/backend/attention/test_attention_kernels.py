"""The ranked kernel lists: auto's order, pins, and the setting names."""

from __future__ import annotations

import pytest
from torch.nn.attention import SDPBackend as B

from invokeai.backend.attention import ATTENTION_SETTINGS, kernel_order

FUSED_AND_MATH = {B.FLASH_ATTENTION, B.CUDNN_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH}


def test_auto_order_is_flash_cudnn_efficient_math() -> None:
    assert kernel_order("auto") == [B.FLASH_ATTENTION, B.CUDNN_ATTENTION, B.EFFICIENT_ATTENTION, B.MATH]


def test_auto_keeps_flash_even_where_a_build_lacks_it() -> None:
    # A dead entry costs nothing; a missing one costs ROCm and Linux CUDA their fastest kernel.
    assert kernel_order("auto")[0] is B.FLASH_ATTENTION


def test_auto_ranks_cudnn_ahead_of_memory_efficient() -> None:
    order = kernel_order("auto")
    assert order.index(B.CUDNN_ATTENTION) < order.index(B.EFFICIENT_ATTENTION)


@pytest.mark.parametrize("setting", ATTENTION_SETTINGS)
def test_every_setting_ranks_all_four_kernels_once_with_math_as_last_resort_unless_pinned(setting: str) -> None:
    order = kernel_order(setting)
    assert len(order) == 4 and set(order) == FUSED_AND_MATH
    if setting != "math":
        assert order[-1] is B.MATH


@pytest.mark.parametrize(
    ("setting", "pinned"),
    [
        ("cudnn", B.CUDNN_ATTENTION),
        ("flash", B.FLASH_ATTENTION),
        ("efficient", B.EFFICIENT_ATTENTION),
        ("math", B.MATH),
    ],
)
def test_a_pin_goes_first_followed_by_autos_order(setting: str, pinned: B) -> None:
    order = kernel_order(setting)
    assert order[0] is pinned
    assert order[1:] == [k for k in kernel_order("auto") if k is not pinned]


def test_sage_ranks_pytorchs_kernels_as_auto_does() -> None:
    assert kernel_order("sage") == kernel_order("auto")


def test_settings_are_the_documented_six() -> None:
    assert ATTENTION_SETTINGS == ("auto", "sage", "cudnn", "flash", "efficient", "math")


@pytest.mark.parametrize("bad", ["fast", "", "AUTO", "mem_efficient", "flash_attention"])
def test_an_unknown_setting_is_a_value_error_naming_the_valid_ones(bad: str) -> None:
    with pytest.raises(ValueError) as error:
        kernel_order(bad)
    message = str(error.value)
    assert repr(bad) in message
    assert all(name in message for name in ATTENTION_SETTINGS)
