"""A one-pipeline shape kept among the predicted best by measured steps
(`nas.study.shape_trials`): which shapes contend (in-process), and the fastest measured
kept (each contender trained in stage processes of its own)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nas.study import shape, shape_trials
from nas.study.space import configured_space
from pipeline.pure.shape import Shape
from tests.nas.harness.common import machine_cache, small_space


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cost cache of the test's own, holding given runtime overheads."""
    machine_cache(monkeypatch, tmp_path / "cache")


def test_the_contenders_are_the_one_worker_shapes_predicted_near_the_best(machine: None) -> None:
    _, choice = shape.resolve_one(small_space())
    assert choice is not None
    shapes = shape_trials.contenders(choice, share=0.01, most=100)
    rates = {
        (r["n_stages"], r["threads_per_stage"], r["n_microbatches"]): r["predicted_samples_per_s"]
        for r in choice.tried
    }
    predicted = [rates[s.n_stages, s.threads_per_stage, s.n_microbatches] for s in shapes]
    assert shapes[0] == choice.shape and predicted == sorted(predicted, reverse=True)
    assert all(s.workers == 1 for s in shapes) and len(shapes) == len(set(shapes)) > 1
    near = shape_trials.contenders(choice, share=0.9, most=2)
    assert len(near) <= 2 and all(
        rates[s.n_stages, s.threads_per_stage, s.n_microbatches] >= 0.9 * predicted[0] for s in near
    )
    assert shape_trials.contenders(choice, share=1.0) == [choice.shape]
    with pytest.raises(ValueError, match="share=0"):
        shape_trials.contenders(choice, share=0)


def test_a_measurement_that_overturns_the_prediction_is_told_apart() -> None:
    predicted, other = Shape(1, 2, 1, 4), Shape(1, 1, 2, 4)
    assert not shape_trials.overturned({predicted: [0.10, 0.11], other: [0.14, 0.15]}, predicted)
    assert shape_trials.overturned({predicted: [0.16, 0.17], other: [0.14, 0.15]}, predicted)
    # a slow spell in one of two rounds of the best predicted: the median over all its steps
    rounds = {predicted: [0.16, 0.17, 0.10, 0.10, 0.11], other: [0.14, 0.15, 0.14, 0.15]}
    assert not shape_trials.overturned(rounds, predicted)


def test_the_contenders_are_measured_only_where_the_run_ahead_pays_for_it(machine: None) -> None:
    _, choice = shape.resolve_one(small_space())
    assert choice is not None
    shapes = shape_trials.contenders(choice, share=0.01, most=100)
    best = shapes[0]
    same = [
        s
        for s in shapes
        if (s.n_stages, s.threads_per_stage) == (best.n_stages, best.threads_per_stage)
    ]
    other = [s for s in shapes if s not in same]
    assert len(same) >= 2 and other, "the small space weighs micro-batches and stage counts"
    step_s = 32 / choice.predicted_samples_per_s
    cost_s = 2 * shape_trials.LAUNCH_S + shape_trials.STEPS * step_s  # at least, for two
    # a run too short to pay for even the launches is never measured
    for pair in ([best, same[1]], [best, other[0]]):
        assert not shape_trials.worth_measuring(choice, pair, 32, 1, 0.15)
        assert shape_trials.worth_measuring(choice, pair, 32, 10**6, 0.15)
    # between them: a run that pays for a contender of another structure, not for one that
    # only splits the batch otherwise (within the prediction's error of 15%)
    steps = int(cost_s / step_s / shape_trials.STRUCTURE_MISS * 1.5)
    assert shape_trials.worth_measuring(choice, [best, other[0]], 32, steps, 0.15)
    assert not shape_trials.worth_measuring(choice, [best, same[1]], 32, steps, 0.15)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_the_fastest_measured_contender_is_kept(machine: None) -> None:
    settings = small_space("pipeline.n_microbatches=auto")
    _, choice = shape.resolve_one(settings)
    assert choice is not None
    arch = next(iter(configured_space(settings).seeds().values()))
    kept, seconds = shape_trials.fastest(settings, choice, arch, run_steps=10**6)
    measured = [str(s) for s in shape_trials.contenders(choice)]
    assert list(seconds) == measured and len(measured) >= 2
    assert all(0 < s < 60 for s in seconds.values())
    assert seconds[str(kept)] == min(seconds.values())
