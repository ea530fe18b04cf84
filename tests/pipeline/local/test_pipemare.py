"""PipeMare's corrections as arithmetic: delays, the rescheduled step size, and the
discrepancy correction recovering the weights a forward used (no processes)."""

from __future__ import annotations

import itertools

import pytest
import torch

from pipeline.local.pipemare import DiscrepancyCorrection, PipeMareConfig, delay, rescaled_lr


def test_delays_under_asynchronous_1f1b() -> None:
    assert [delay(4, s) for s in range(4)] == [3, 2, 1, 0]
    assert [delay(4, s, update_every=2) for s in range(4)] == [2, 1, 1, 0]


def test_the_step_size_starts_divided_by_the_delay_and_returns_to_the_base() -> None:
    lrs = [rescaled_lr(0.1, k, stage_delay=4, warmup_updates=10) for k in range(12)]
    assert lrs[0] == pytest.approx(0.1 / 4)
    assert lrs[5] == pytest.approx(0.1 / 2)  # 4 ** -(1/2)
    assert lrs[10:] == [pytest.approx(0.1)] * 2
    assert all(a < b for a, b in itertools.pairwise(lrs[:11]))
    assert rescaled_lr(0.1, 0, stage_delay=0, warmup_updates=10) == 0.1  # the last stage


def test_the_correction_recovers_the_forward_weights_under_steady_motion() -> None:
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(3, 4))
    lag = 3
    correction = DiscrepancyCorrection([w], lag=lag, decay=0.1)
    velocity = torch.randn(3, 4) * 0.01
    history = [w.detach().clone()]  # the weights after each update
    for _ in range(60):  # an optimizer moving the weights steadily
        correction.before_update()
        with torch.no_grad():
            w.add_(velocity)
        correction.observe()
        history.append(w.detach().clone())
    (u,) = correction.backward_weights()
    forward_weights = history[-1 - lag]  # what a forward `lag` updates ago used
    assert torch.allclose(u, forward_weights, atol=1e-6)
    assert (history[-1] - forward_weights).abs().max() > 100 * (u - forward_weights).abs().max()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"warmup_updates": 0}, "warmup_updates=0 is not valid"),
        ({"update_every": 1.5}, "update_every=1.5 is not valid"),
        ({"correction_decay": 1.0}, r"correction_decay=1.0 is not valid; it must be in \(0, 1\)"),
    ],
)
def test_bad_parameters_are_named(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PipeMareConfig(**kwargs)  # type: ignore[arg-type]


def test_observe_needs_the_weights_before_the_update() -> None:
    correction = DiscrepancyCorrection([torch.zeros(2)], lag=1, decay=0.5)
    with pytest.raises(RuntimeError, match="before_update"):
        correction.observe()
