"""Stage sizes: how many consecutive layers each stage holds.

A partition of L layers over S stages is a list of S positive sizes that sum to L; stage s
holds layers [start(s), start(s) + sizes[s]). This module validates user-given sizes and
provides the equal split used when nothing better is known.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

__all__ = ["bounds", "check_sizes", "equal_sizes"]


def equal_sizes(n_layers: int, n_stages: int) -> list[int]:
    """Equal layer counts; the first `n_layers % n_stages` stages get one more."""
    if n_stages > n_layers:
        raise ValueError(
            f"cannot split {n_layers} layers over {n_stages} stages: every stage needs at "
            f"least one layer (use at most {n_layers} stages)"
        )
    base, extra = divmod(n_layers, n_stages)
    return [base + (s < extra) for s in range(n_stages)]


def check_sizes(sizes: Sequence[int], n_layers: int, n_stages: int) -> list[int]:
    sizes = list(sizes)
    if len(sizes) != n_stages:
        raise ValueError(f"partition {sizes} has {len(sizes)} stages, the pipeline has {n_stages}")
    if any(not isinstance(n, int) or n < 1 for n in sizes):
        raise ValueError(f"partition {sizes}: every stage needs a positive int number of layers")
    if sum(sizes) != n_layers:
        raise ValueError(f"partition {sizes} holds {sum(sizes)} layers, the model has {n_layers}")
    return sizes


def bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """[(start, stop)] of each stage's layer range."""
    ends = list(accumulate(sizes))
    return [(end - size, end) for size, end in zip(sizes, ends, strict=True)]
