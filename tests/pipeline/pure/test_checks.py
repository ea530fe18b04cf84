"""`pipeline.pure.checks`: a bool is neither an integer nor a number for a setting."""

from __future__ import annotations

import math

import pytest

from pipeline.pure.checks import is_int, is_number


@pytest.mark.parametrize(
    ("value", "integer", "number"),
    [
        (3, True, True),
        (0, True, True),
        (2.5, False, True),
        (math.inf, False, True),
        (True, False, False),
        (False, False, False),
        ("3", False, False),
        (None, False, False),
    ],
)
def test_a_bool_is_neither_an_integer_nor_a_number(
    value: object, integer: bool, number: bool
) -> None:
    assert is_int(value) is integer and is_number(value) is number
