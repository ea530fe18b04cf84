"""The machine's shape from costs alone: `choose_shape` against the planner and brute force."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import TimePlanner, evaluate
from pipeline.pure.shape import (
    CostsAt,
    RuntimeOverheads,
    Shape,
    ShapeLimits,
    ShapeOption,
    choose_shape,
    fastest_first,
    most_per_process,
    predicted_step_s,
    shapes,
    stages_for,
    with_fallbacks,
)

OVERHEADS = RuntimeOverheads(microbatch_s=4e-4, message_s=8e-4, step_s=1e-3)
BATCH = 32


def model(n_layers: int, forward_s: float, param_bytes: int) -> list[LayerCost]:
    """Layers of equal cost per sample, `forward_s` for the whole batch."""
    return [
        LayerCost(
            key=f"layer{i}",
            forward_s=forward_s,
            backward_s=2 * forward_s,
            activation_bytes=1 << 20,
            output_bytes=1 << 16,
            param_bytes=param_bytes,
            grad_bytes=param_bytes,
            optimizer_bytes=2 * param_bytes,
        )
        for i in range(n_layers)
    ]


def costs_at_for(layers: list[LayerCost], thread_speedup: float = 1.0) -> CostsAt:
    """Costs proportional to the micro-batch; T threads divide compute by speedup**(T-1)."""

    def costs_at(threads: int, microbatch: int) -> list[LayerCost]:
        scale = microbatch / BATCH / thread_speedup ** (threads - 1)
        return [
            LayerCost(
                key=c.key,
                forward_s=c.forward_s * scale,
                backward_s=c.backward_s * scale,
                activation_bytes=int(c.activation_bytes * microbatch / BATCH),
                output_bytes=int(c.output_bytes * microbatch / BATCH),
                param_bytes=c.param_bytes,
                grad_bytes=c.grad_bytes,
                optimizer_bytes=c.optimizer_bytes,
            )
            for c in layers
        ]

    return costs_at


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


# -- one model's pipeline on a pool (`stages_for`) ---------------------------------------------
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
        return dataclasses.replace(
            planned,
            shape=Shape(1, stages, 1, microbatches),
            predicted_samples_per_s=per_process * stages,
        )

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
        return dataclasses.replace(
            planned,
            shape=Shape(1, stages, 1, microbatches),
            predicted_samples_per_s=per_process * stages,
        )

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
