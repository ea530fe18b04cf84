"""One parameter mutated: a legal value of its distribution other than the parent's.

Regularized evolution (`nas.search.evolution`) changes exactly one answer of a parent; the
new value must differ from the old, or the child would be its parent again. A categorical
choice draws among the other choices; a numeric range redraws from the sampler that honours
its log scale and step, and where the old value keeps coming back (a wide log-int range at
its dense end) takes a uniform other grid point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

__all__ = ["other_value"]

_MAX_REDRAWS = 100  # random draws tried for a different numeric value before a grid step


def other_value(
    rng: np.random.RandomState,
    draw: Callable[[], Any],
    name: str,
    distribution: BaseDistribution,
    old: Any,
) -> Any:
    """A legal value of parameter `name`'s `distribution` other than `old`: another choice
    drawn with `rng`, or a numeric value from `draw` (a sampler's own draw of it)."""
    if isinstance(distribution, CategoricalDistribution):
        index = distribution.to_internal_repr(old)
        other = rng.randint(len(distribution.choices) - 1)
        return distribution.choices[other + (other >= index)]
    for _ in range(_MAX_REDRAWS):
        value = draw()
        if value != old:
            return value
    if isinstance(distribution, IntDistribution | FloatDistribution) and distribution.step:
        step, low = distribution.step, distribution.low
        n = round((distribution.high - low) / step) + 1
        index = round((old - low) / step)
        other = rng.randint(n - 1)
        value = low + (other + (other >= index)) * step
        return int(value) if isinstance(distribution, IntDistribution) else float(value)
    raise RuntimeError(  # a continuous range cannot return one point 100 times
        f"could not draw a value of {name!r} other than {old!r} from {distribution}"
    )
