"""The learning-rate schedule: warm-up, constant or cosine, and the torch scheduler that runs it."""

from __future__ import annotations

import itertools
import math
import pickle

import pytest
import torch

from nas.learning_rate import LrSchedule, learning_rate


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


def test_the_scheduler_runs_each_update_at_its_steps_rate_and_resumes_from_its_state() -> None:
    schedule = LrSchedule(1e-2, 12, warmup=4, schedule="cosine", min_ratio=0.1)
    layer = torch.nn.Linear(2, 2)
    optimizer = schedule.optimizer()([{"params": list(layer.parameters())}])
    scheduler = pickle.loads(pickle.dumps(schedule))(optimizer)  # crosses processes
    seen = []
    for step in range(12):
        seen.append(optimizer.param_groups[0]["lr"])
        layer(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
        if step == 5:  # a checkpoint: a new scheduler, its state loaded, goes on alike
            state, lr = scheduler.state_dict(), optimizer.param_groups[0]["lr"]
    expected = [
        learning_rate(s, base=1e-2, total=12, warmup=4, schedule="cosine", min_ratio=0.1)
        for s in range(12)
    ]
    assert seen == expected == [schedule.rate(s) for s in range(12)]  # to the last bit
    assert seen[0] == pytest.approx(2.5e-3) and seen[-1] == pytest.approx(1e-3)
    again = torch.optim.AdamW(layer.parameters(), lr=1e-2)
    resumed = schedule(again)
    again.param_groups[0]["lr"] = lr
    resumed.load_state_dict(state)
    resumed.step()
    assert again.param_groups[0]["lr"] == expected[7]


def test_a_bad_schedule_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="total=0 is not valid"):
        LrSchedule(1e-3, 0)
    with pytest.raises(ValueError, match="schedule='step' is not valid"):
        LrSchedule(1e-3, 10, schedule="step")
