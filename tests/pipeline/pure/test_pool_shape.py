"""One model's pipeline on a pool (`pipeline.pure.pool_shape`): the fewest stages that fit,
more only where faster per process beyond the model's error, the counts a job may fall back
to, and a job alone taking the fastest."""

from __future__ import annotations

import dataclasses
import functools

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import InfeasibleBudgetError, TimePlanner, evaluate
from pipeline.pure.pool_shape import fastest_first, most_per_process, stages_for, with_fallbacks
from pipeline.pure.shape import Shape, ShapeLimits, ShapeOption, choose_shape
from tests.pipeline.pure.shape_models import (
    BATCH,
    OVERHEADS,
    Profiled,
    costs_at_for,
    model,
    per_process_option,
    same_options,
)


def test_on_a_pool_a_small_model_takes_one_process_and_a_large_one_the_fewest_that_fit() -> None:
    small = costs_at_for(model(6, 2e-3, 1 << 16))
    profiled: list[int] = []

    def recorded(threads: int, microbatch: int) -> list[LayerCost]:
        profiled.append(microbatch)
        return list(small(threads, microbatch))

    best, tried = stages_for(TimePlanner(), recorded, OVERHEADS, max_stages=4, batch_size=BATCH)
    assert best.shape == Shape(workers=1, n_stages=1, threads_per_stage=1, n_microbatches=1)
    assert tried == [best] and set(profiled) == {BATCH}  # one stage fits: nothing else sized
    large = costs_at_for(model(6, 2e-3, 8 << 20))
    one_stage = evaluate(large(1, BATCH), [6], n_microbatches=1)
    budget = int(0.7 * one_stage.predicted_stage_bytes[0])
    best, tried = stages_for(
        TimePlanner(), large, OVERHEADS, max_stages=4, batch_size=BATCH, memory_budget=budget
    )
    assert best.shape.n_stages == 2  # the fewest that fit: more would not be faster per process
    assert best.plan is not None and max(best.plan.predicted_stage_bytes) <= budget
    fits = [o for o in tried if o.plan is not None]
    per_process = {o.shape: o.predicted_samples_per_s / o.shape.n_stages for o in fits}
    assert per_process[best.shape] == max(per_process.values())  # brute force agrees


def test_a_pool_job_may_start_on_fewer_stages_that_lose_at_most_its_share_per_process() -> None:
    large = costs_at_for(model(6, 2e-3, 8 << 20))
    _, tried = stages_for(TimePlanner(), large, OVERHEADS, max_stages=3, batch_size=BATCH)
    planned = tried[0]
    assert planned.plan is not None

    def option(stages: int, microbatches: int, per_process: float) -> ShapeOption:
        return per_process_option(planned, stages, microbatches, per_process)

    best = option(3, 4, 100.0)
    options = [
        option(1, 4, 70.0),
        option(1, 8, 80.0),  # the fastest single stage
        option(2, 2, 90.0),
        dataclasses.replace(option(2, 8, 99.0), plan=None),  # not planned: never a fallback
        best,
        option(3, 8, 95.0),  # as many stages as the best: no fallback
    ]
    assert with_fallbacks(best, options, least_share=0.75) == [best, options[2], options[1]]
    assert with_fallbacks(best, options, least_share=0.85) == [best, options[2]]
    assert with_fallbacks(best, options, least_share=1.0) == [best]
    with pytest.raises(ValueError, match="least_share=0"):
        with_fallbacks(best, options, least_share=0)


def test_more_stages_only_where_faster_per_process_by_more_than_the_models_error() -> None:
    """A pool's job takes more stages only where the cost model can rank them ahead per
    process: within its error, the fewest stages (they leave the other processes free)."""
    large = costs_at_for(model(6, 2e-3, 8 << 20))
    _, tried = stages_for(TimePlanner(), large, OVERHEADS, max_stages=3, batch_size=BATCH)
    planned = tried[0]

    def option(stages: int, microbatches: int, per_process: float) -> ShapeOption:
        return per_process_option(planned, stages, microbatches, per_process)

    one, one_more = option(1, 4, 100.0), option(1, 8, 104.0)
    two, three = option(2, 4, 112.0), option(3, 4, 120.0)
    options = [one, one_more, two, three]
    assert most_per_process(options) is three  # no error: the most per process
    assert most_per_process(options, error=0.10) is two  # 3 stages within 10% of 2
    assert most_per_process(options, error=0.20) is one_more  # all within: the fewest
    assert most_per_process([two, one], error=0.12) is one  # exactly at the error: fewer
    with pytest.raises(ValueError, match="error must be >= 0"):
        most_per_process(options, error=-0.1)
    with pytest.raises(ValueError, match="no planned option"):
        most_per_process([])


def test_a_job_alone_on_the_pool_tries_every_count_and_takes_the_fastest_first() -> None:
    small = costs_at_for(model(6, 2e-3, 1 << 16))
    best, tried = stages_for(TimePlanner(), small, OVERHEADS, max_stages=3, batch_size=BATCH)
    assert [o.shape.n_stages for o in tried] == [1]  # one stage fits: nothing else sized
    best, tried = stages_for(
        TimePlanner(), small, OVERHEADS, max_stages=3, batch_size=BATCH, exhaustive=True
    )
    assert best.shape.n_stages == 1  # still the best per process
    assert {o.shape.n_stages for o in tried} == {1, 2, 3}
    alone = fastest_first(tried)
    speeds = [o.predicted_samples_per_s for o in alone]
    assert speeds == sorted(speeds, reverse=True)  # the fastest first
    assert sorted(o.shape.n_stages for o in alone) == [1, 2, 3]  # one option per count
    for option in alone:  # each count's fastest planned option (brute force)
        same = [o for o in tried if o.shape.n_stages == option.shape.n_stages and o.plan]
        assert option.predicted_samples_per_s == max(o.predicted_samples_per_s for o in same)
    assert alone[0].shape.n_stages > 1  # six equal layers: more stages end sooner


def test_what_the_pool_measured_per_stage_count_scales_its_predictions_before_ranking() -> None:
    """A pool's jobs on S stages that ran at a share of their prediction (the pool's load,
    which the model does not know) scale every S-stage option's prediction by it."""
    small = costs_at_for(model(6, 2e-3, 1 << 16))
    run = functools.partial(
        stages_for, TimePlanner(), small, OVERHEADS, max_stages=3, batch_size=BATCH
    )
    best, tried = run(exhaustive=True)
    assert best.shape.n_stages == 1
    slowed, scaled = run(exhaustive=True, measured={1: 0.4})
    for raw, seen in zip(tried, scaled, strict=True):
        share = 0.4 if raw.shape.n_stages == 1 else 1.0
        assert (seen.shape, seen.plan) == (raw.shape, raw.plan)
        assert seen.predicted_samples_per_s == pytest.approx(share * raw.predicted_samples_per_s)
        assert seen.predicted_step_s == pytest.approx(raw.predicted_step_s / share)
    per_process = {o.shape: o.predicted_samples_per_s / o.shape.n_stages for o in scaled if o.plan}
    assert slowed.shape.n_stages > 1 and per_process[slowed.shape] == max(per_process.values())
    assert run(exhaustive=True, measured={1: 1.0, 2: 1.0}) == (best, tried)
    with pytest.raises(ValueError, match=r"measured\[2\]=0.0"):
        run(measured={2: 0.0})


@pytest.mark.parametrize("activation_share", [0.3, 0.6, 1.0])
def test_on_a_pool_the_first_single_stage_that_keeps_its_activations_is_fastest_per_process(
    activation_share: float,
) -> None:
    """Brute force over every shape of the pool: none is faster per process than the one
    `stages_for` stops at, at that option's micro-batches."""
    layers = [
        dataclasses.replace(c, activation_bytes=8 << 20, param_bytes=1 << 16)
        for c in model(6, 2e-3, 1 << 16)
    ]
    costs_at = costs_at_for(layers)
    whole = evaluate(costs_at(1, BATCH), [6], n_microbatches=1).predicted_stage_bytes[0]
    budget = int(activation_share * whole)
    best, tried = stages_for(
        TimePlanner(), costs_at, OVERHEADS, max_stages=3, batch_size=BATCH, memory_budget=budget
    )
    assert best.plan is not None and max(best.plan.predicted_stage_bytes) <= budget
    _, every = choose_shape(
        TimePlanner(),
        costs_at,
        ShapeLimits(3, BATCH, workers=1, n_microbatches=best.shape.n_microbatches),
        OVERHEADS,
        memory_budget=budget,
    )
    fits = [o for o in every if o.plan is not None]
    best_rate = best.predicted_samples_per_s / best.shape.n_stages
    assert best_rate >= max(o.predicted_samples_per_s / o.shape.n_stages for o in fits) - 1e-9
    # the search stopped at the first single stage keeping everything, having sized only
    # single stages of fewer micro-batches before it
    assert all(o.shape.n_stages == 1 for o in tried) and best in tried
    last = tried[-1].plan
    assert last is not None and set(last.actions) == {"keep"}


def test_on_a_pool_a_model_that_fits_no_pipeline_names_every_reason() -> None:
    large = costs_at_for(model(2, 2e-3, 64 << 20))
    with pytest.raises(ValueError, match="no pipeline of at most 2 stages fits") as caught:
        stages_for(TimePlanner(), large, OVERHEADS, max_stages=2, batch_size=BATCH, memory_budget=1)
    assert "1 stages:" in str(caught.value) and "2 stages:" in str(caught.value)


def test_on_a_pool_sizes_the_bytes_rule_out_are_never_timed() -> None:
    large = costs_at_for(model(6, 2e-3, 1 << 16))
    with pytest.raises(InfeasibleBudgetError) as whole_batch:  # on 3 stages, at 1 micro-batch
        TimePlanner().plan(large(1, BATCH), 3, n_microbatches=1, memory_budget=1)
    budget = whole_batch.value.min_budget - 1
    runs = {}
    for given in (False, True):
        timed = Profiled(large)
        best, tried = stages_for(
            TimePlanner(),
            timed,
            OVERHEADS,
            max_stages=3,
            batch_size=BATCH,
            memory_budget=budget,
            exhaustive=True,
            sizes_at=timed.sizes if given else None,
        )
        runs[given] = (best, tried, {m for _, m in timed.asked})
    assert runs[True][0] == runs[False][0] and same_options(runs[True][1], runs[False][1])
    planned = {BATCH // o.shape.n_microbatches for o in runs[False][1] if o.plan is not None}
    assert runs[True][2] == planned < runs[False][2]  # timed only where something fits
