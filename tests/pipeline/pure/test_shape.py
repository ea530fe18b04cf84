"""The machine's shape from costs alone: `choose_shape` against the planner and brute force."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import Plan, TimePlanner, evaluate
from pipeline.pure.shape import (
    RuntimeOverheads,
    Shape,
    ShapeLimits,
    choose_shape,
    predicted_step_s,
    shapes,
)
from tests.pipeline.pure.shape_models import (
    BATCH,
    OVERHEADS,
    Profiled,
    costs_at_for,
    model,
    same_options,
)


def test_a_small_model_gets_one_single_stage_worker_per_core() -> None:
    small = costs_at_for(model(6, 2e-3, 1 << 16), thread_speedup=1.3)
    best, tried = choose_shape(
        TimePlanner(), small, ShapeLimits(cores=4, batch_size=BATCH), OVERHEADS
    )
    assert best.shape == Shape(workers=4, n_stages=1, threads_per_stage=1, n_microbatches=1)
    assert best.predicted_samples_per_s == max(o.predicted_samples_per_s for o in tried)
    # every shape fills the cores it may, and each was planned
    assert all(o.shape.cores <= 4 and o.plan is not None for o in tried)


def test_a_model_too_large_for_one_stage_stays_pipelined() -> None:
    layers = model(6, 2e-3, 8 << 20)
    large = costs_at_for(layers, thread_speedup=1.3)
    one_stage = evaluate(large(1, BATCH), [6], n_microbatches=1)
    budget = int(0.7 * one_stage.predicted_stage_bytes[0])
    best, tried = choose_shape(
        TimePlanner(),
        large,
        ShapeLimits(cores=4, batch_size=BATCH),
        OVERHEADS,
        memory_budget=budget,
    )
    assert best.shape.n_stages >= 2
    assert best.plan is not None and max(best.plan.predicted_stage_bytes) <= budget
    single = [o for o in tried if o.shape.n_stages == 1]
    assert single and all(o.plan is None and "budget" in o.reason for o in single)


def test_shapes_the_bytes_rule_out_under_a_budget_are_never_timed() -> None:
    large = costs_at_for(model(6, 2e-3, 1 << 16), thread_speedup=1.3)
    one_stage = evaluate(large(1, BATCH), [6], n_microbatches=1)
    budget = int(0.3 * one_stage.predicted_stage_bytes[0])
    limits = ShapeLimits(cores=4, batch_size=BATCH)
    runs = {}
    for given in (False, True):
        timed = Profiled(large)
        sizes = timed.sizes if given else None
        best, tried = choose_shape(
            TimePlanner(), timed, limits, OVERHEADS, memory_budget=budget, sizes_at=sizes
        )
        runs[given] = (best, tried, set(timed.asked))
    assert runs[True][0] == runs[False][0] and same_options(runs[True][1], runs[False][1])
    refused = {
        (o.shape.threads_per_stage, BATCH // o.shape.n_microbatches) for o in runs[False][1]
    } - {
        (o.shape.threads_per_stage, BATCH // o.shape.n_microbatches)
        for o in runs[False][1]
        if o.plan
    }
    assert refused and not refused & runs[True][2]  # some sizes fit nothing: never timed
    assert runs[True][2] < runs[False][2]


class _MeasuredOnly(TimePlanner):
    """A planner that refuses costs whose seconds are not measured (a user's may)."""

    def plan(self, costs: Sequence[LayerCost], *args: Any, **kwargs: Any) -> Plan:
        if all(c.forward_s == 0 for c in costs):
            raise ValueError("every layer's seconds are 0")
        return super().plan(costs, *args, **kwargs)


def test_a_planner_that_wants_measured_seconds_decides_on_them() -> None:
    large = costs_at_for(model(6, 2e-3, 1 << 16))
    one_stage = evaluate(large(1, BATCH), [6], n_microbatches=1)
    budget = int(0.3 * one_stage.predicted_stage_bytes[0])
    limits = ShapeLimits(cores=2, batch_size=BATCH, workers=1)
    timed = Profiled(large)
    got = choose_shape(
        _MeasuredOnly(), timed, limits, OVERHEADS, memory_budget=budget, sizes_at=timed.sizes
    )
    want = choose_shape(TimePlanner(), large, limits, OVERHEADS, memory_budget=budget)
    assert got[0] == want[0] and same_options(got[1], want[1])


def test_with_one_worker_allowed_a_pipeline_beats_threads_that_scale_badly() -> None:
    # one run to train (a retraining): 2 stages use both cores; 2 threads barely help
    poor_threads = costs_at_for(model(6, 4e-3, 1 << 16), thread_speedup=1.05)
    best, _ = choose_shape(
        TimePlanner(),
        poor_threads,
        ShapeLimits(cores=2, batch_size=BATCH, max_workers=1),
        OVERHEADS,
    )
    assert (best.shape.workers, best.shape.n_stages, best.shape.threads_per_stage) == (1, 2, 1)
    assert best.shape.n_microbatches > 1  # a pipeline needs micro-batches to overlap


def test_the_prediction_is_the_plan_plus_the_runtime_overheads() -> None:
    costs_at = costs_at_for(model(4, 1e-3, 1 << 16))
    _, tried = choose_shape(
        TimePlanner(), costs_at, ShapeLimits(cores=2, batch_size=BATCH), OVERHEADS
    )
    for option in tried:
        assert option.plan is not None
        shape, plan = option.shape, option.plan
        expected = (
            plan.predicted_iteration_s
            + (shape.n_microbatches + shape.n_stages - 1) * OVERHEADS.microbatch_s
            + OVERHEADS.step_s
        )
        assert predicted_step_s(plan, OVERHEADS) == pytest.approx(expected)
        assert option.predicted_samples_per_s == pytest.approx(shape.workers * BATCH / expected)


def test_the_two_stage_plans_are_the_best_cut_by_brute_force() -> None:
    uneven = [
        LayerCost(f"l{i}", f, 2 * f, 1 << 10, 1 << 10, 1 << 10, 1 << 10, 2 << 10)
        for i, f in enumerate([1e-3, 5e-3, 2e-3, 1e-3, 4e-3, 1e-3])
    ]
    link = OVERHEADS.link()
    _, tried = choose_shape(
        TimePlanner(),
        lambda threads, microbatch: uneven,
        ShapeLimits(cores=2, batch_size=8, threads_per_stage=1, n_stages=2),
        OVERHEADS,
    )
    for option in tried:  # the time planner's objective: the slowest stage per micro-batch
        m = option.shape.n_microbatches
        brute = min(
            evaluate(uneven, [k, 6 - k], n_microbatches=m, link=link).bottleneck_s
            for k in range(1, 6)
        )
        assert option.plan is not None
        assert option.plan.bottleneck_s == pytest.approx(brute)


def test_values_a_user_fixed_are_kept() -> None:
    limits = ShapeLimits(cores=4, batch_size=BATCH, n_stages=2, n_microbatches=4)
    found = shapes(limits, n_layers=6)
    assert {(s.n_stages, s.n_microbatches) for s in found} == {(2, 4)}
    assert {(s.workers, s.threads_per_stage) for s in found} == {(2, 1), (1, 2)}
    workers_fixed = shapes(ShapeLimits(cores=4, batch_size=BATCH, workers=3), n_layers=6)
    assert {s.workers for s in workers_fixed} == {3}
    # the cores left per worker bound its stages and threads (at least one each)
    assert {(s.n_stages, s.threads_per_stage) for s in workers_fixed} == {(1, 1)}


def test_max_workers_bounds_the_workers() -> None:
    found = shapes(ShapeLimits(cores=4, batch_size=BATCH, max_workers=2), n_layers=6)
    assert max(s.workers for s in found) == 2


@pytest.mark.parametrize(
    "kwargs,words",
    [
        ({"cores": 0, "batch_size": 8}, "cores=0"),
        ({"cores": 2, "batch_size": 8, "n_microbatches": 3}, "n_microbatches=3"),
        ({"cores": 2, "batch_size": 8, "workers": True}, "workers=True"),
    ],
)
def test_bad_limits_are_refused_by_name(kwargs: dict[str, int], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        ShapeLimits(**kwargs)


def test_no_shape_that_fits_says_which_values_to_change() -> None:
    with pytest.raises(ValueError, match="n_stages=8"):
        shapes(ShapeLimits(cores=2, batch_size=8, n_stages=8), n_layers=6)


def test_overheads_are_checked_and_round_trip() -> None:
    assert RuntimeOverheads.from_dict(OVERHEADS.to_dict()) == OVERHEADS
    assert OVERHEADS.link().latency_s == OVERHEADS.message_s
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="microbatch_s"):
            RuntimeOverheads(microbatch_s=bad)


def test_shapes_read_as_words() -> None:
    assert str(Shape(2, 1, 1, 1)) == "2 workers x 1 stage x 1 thread, 1 micro-batch"
    assert str(Shape(1, 2, 2, 4)) == "1 worker x 2 stages x 2 threads, 4 micro-batches"
    assert list(itertools.chain(Shape(1, 2, 2, 4).to_dict().values())) == [1, 2, 2, 4]
