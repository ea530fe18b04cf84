"""Type checks of values read from users: an integer that is not a bool, a number.

Python's `bool` is an `int`, so `isinstance(True, int)` holds and a setting given as `true`
would pass for 1. Every boundary that validates a count or a rate asks these two instead of
spelling the pair of `isinstance` calls again; the narrowing (`TypeGuard`) lets the check
and the comparison after it read as one expression: `if not is_int(n) or n < 1: raise ...`.
"""

from __future__ import annotations

from typing import TypeGuard

__all__ = ["is_int", "is_number"]


def is_int(value: object) -> TypeGuard[int]:
    """`value` is an `int` and not a `bool`."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """`value` is an `int` or a `float` and not a `bool` (NaN and infinities included)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
