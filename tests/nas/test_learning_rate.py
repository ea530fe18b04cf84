"""The learning-rate schedule: warm-up, constant or cosine, and the factory that follows it."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from nas.learning_rate import ScheduledOptimizer, learning_rate


def test_warmup_rises_linearly_then_the_cosine_ends_at_the_floor() -> None:
    rates = [
        learning_rate(s, base=1.0, total=110, warmup=10, schedule="cosine", min_ratio=0.1)
        for s in range(110)
    ]
    assert rates[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert rates[10] == pytest.approx(1.0) and rates[-1] == pytest.approx(0.1)
    assert rates[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 50 / 99)))
    assert all(a >= b for a, b in itertools.pairwise(rates[10:]))  # decays only
    assert learning_rate(
        500, base=1.0, total=110, schedule="cosine", min_ratio=0.1
    ) == pytest.approx(0.1)  # past the end: the floor


def test_constant_after_warmup_and_a_bad_name_is_refused() -> None:
    assert learning_rate(3, base=0.5, total=10, warmup=2) == 0.5
    assert learning_rate(0, base=0.5, total=10, warmup=2) == 0.25
    with pytest.raises(ValueError, match="schedule='linear' is not valid; valid: constant"):
        learning_rate(0, base=1.0, total=10, schedule="linear")


def test_the_factory_builds_at_the_current_rate_and_moves_a_live_optimizer() -> None:
    factory = ScheduledOptimizer(1e-2, 100, warmup=4, schedule="cosine")
    layer = torch.nn.Linear(2, 2)
    optimizer = factory([{"params": list(layer.parameters())}])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2.5e-3)  # step 0 of the warm-up
    factory.set_step(50, [optimizer])
    assert optimizer.param_groups[0]["lr"] == pytest.approx(factory.rate(50)) and factory(
        [{"params": list(layer.parameters())}]
    ).param_groups[0]["lr"] == pytest.approx(factory.rate(50))
