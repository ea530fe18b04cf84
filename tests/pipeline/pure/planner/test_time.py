"""TimePlanner against brute force: every contiguous partition, every recompute subset.

The brute force (`tests.pipeline.pure.planner.brute_force`) is written from the model in
`pipeline.pure.planner.time`'s docstring and shares no code with the planner: in-flight counts
from the closed forms, kept bytes from the previous layer's output, memory and time summed
layer by layer.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest

from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.planner import InfeasibleBudgetError, Plan, TimePlanner, get_planner
from pipeline.pure.schedule import Action, gpipe
from tests.pipeline.pure.planner.brute_force import (
    INF,
    brute_force,
    in_flight,
    least_budget,
    medium_dp,
    random_budgeted_instance,
    random_costs,
    random_instance,
    stage_memory,
    stage_time,
)


# -- checks against the brute force ---------------------------------------------------------
def check_plan(
    plan: Plan,
    costs: Sequence[LayerCost],
    schedule: str,
    m: int,
    budget: int | None,
    swap: LinkCost | None = None,
) -> float:
    """The plan is well-formed and fits; its own claims match the brute-force model."""
    assert sum(plan.sizes) == len(costs) and all(n >= 1 for n in plan.sizes)
    worst = 0.0
    for s, (a, e) in enumerate(plan.bounds()):
        layers = range(a, e)
        reduced = {i for i in layers if plan.actions[i] != "keep"}
        k = in_flight(schedule, plan.n_stages, m, s)
        memory = stage_memory(costs, layers, reduced, k)
        assert plan.predicted_stage_bytes[s] == memory
        assert budget is None or memory <= budget  # recompute choices never exceed it
        t = stage_time(costs, layers, reduced, swap)
        assert plan.predicted_stage_s[s] == pytest.approx(t, rel=1e-9, abs=1e-12)
        worst = max(worst, t)
    return worst


def plan_or_infeasible(
    planner: TimePlanner,
    costs: Sequence[LayerCost],
    n_stages: int,
    schedule: str,
    m: int,
    budget: int,
    expected: float,
) -> float | None:
    """The checked plan's bottleneck; None where brute force fits nothing (and the planner
    raised InfeasibleBudgetError)."""
    if expected == INF:
        with pytest.raises(InfeasibleBudgetError):
            planner.plan(costs, n_stages, schedule=schedule, n_microbatches=m, memory_budget=budget)
        return None
    plan = planner.plan(costs, n_stages, schedule=schedule, n_microbatches=m, memory_budget=budget)
    return check_plan(plan, costs, schedule, m, budget)


# -- the tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(4))
def test_without_budget_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(40):
        costs, n_stages, schedule, m = random_instance(rng)
        plan = TimePlanner().plan(costs, n_stages, schedule=schedule, n_microbatches=m)
        got = check_plan(plan, costs, schedule, m, None)
        assert got == pytest.approx(brute_force(costs, n_stages, schedule, m, None), rel=1e-9)
        assert set(plan.actions) == {"keep"}


@pytest.mark.parametrize("seed", range(6))
def test_with_budget_equals_brute_force(seed: int) -> None:
    rng = random.Random(100 + seed)
    for _ in range(40):
        costs, n_stages, schedule, m, budget = random_budgeted_instance(rng)
        expected = brute_force(costs, n_stages, schedule, m, budget)
        got = plan_or_infeasible(TimePlanner(), costs, n_stages, schedule, m, budget, expected)
        assert got is None or got == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_greedy_recompute_equals_brute_force_of_the_greedy_model(seed: int) -> None:
    rng = random.Random(200 + seed)
    for _ in range(40):
        costs, n_stages, schedule, m, budget = random_budgeted_instance(rng)
        expected = brute_force(costs, n_stages, schedule, m, budget, greedy=True)
        if expected == INF:
            continue
        plan = TimePlanner(exact_limit=0).plan(
            costs, n_stages, schedule=schedule, n_microbatches=m, memory_budget=budget
        )
        got = check_plan(plan, costs, schedule, m, budget)
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
        # the greedy choice can only be slower than the optimal one
        assert got >= brute_force(costs, n_stages, schedule, m, budget) * (1 - 1e-9)


def test_swap_is_chosen_where_it_is_cheaper() -> None:
    rng = random.Random(7)
    host = LinkCost(bandwidth_bytes_per_s=400.0, latency_s=0.01)
    for _ in range(60):
        costs, n_stages, schedule, m, budget = random_budgeted_instance(rng)
        expected = brute_force(costs, n_stages, schedule, m, budget, swap=host)
        if expected == INF:
            continue
        plan = TimePlanner(allow_swap=True, host_link=host).plan(
            costs, n_stages, schedule=schedule, n_microbatches=m, memory_budget=budget
        )
        got = check_plan(plan, costs, schedule, m, budget, swap=host)
        assert got == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # 80 bytes must go: recomputing "a" (1 s) beats recomputing "b" (5 s), but swapping "b"
    # (2 x (0.01 + 90 / 400) = 0.47 s) beats both; "head" feeds the loss: it keeps all
    costs = [
        LayerCost("a", 1.0, 1.0, activation_bytes=100, output_bytes=10),
        LayerCost("b", 5.0, 5.0, activation_bytes=100, output_bytes=10),
        LayerCost("head", 0.5, 0.5, activation_bytes=0, output_bytes=10),
    ]
    plan = TimePlanner(allow_swap=True, host_link=host).plan(
        costs, 1, schedule="gpipe", n_microbatches=1, memory_budget=120
    )
    assert plan.actions == ("keep", "swap", "keep")
    assert plan.predicted_stage_s == pytest.approx((13.47,))
    assert TimePlanner().plan(
        costs, 1, schedule="gpipe", n_microbatches=1, memory_budget=120
    ).actions == ("recompute", "keep", "keep")


def test_the_layer_that_feeds_the_loss_is_never_recomputed() -> None:
    """The runtime keeps the last layer's activations (the loss is computed from its output
    in the forward), so a plan that recomputes it would promise memory it never saves."""
    costs = [
        LayerCost("a", 5.0, 5.0, activation_bytes=100, output_bytes=10),
        LayerCost("b", 1.0, 1.0, activation_bytes=100, output_bytes=10),
    ]
    plan = TimePlanner().plan(costs, 1, schedule="gpipe", n_microbatches=1, memory_budget=120)
    assert plan.actions == ("recompute", "keep")  # "b" would have been cheaper
    with pytest.raises(InfeasibleBudgetError):
        TimePlanner().plan(costs, 1, schedule="gpipe", n_microbatches=1, memory_budget=99)


def test_infeasible_budget_reports_the_least_feasible_one() -> None:
    rng = random.Random(3)
    for _ in range(60):
        costs, n_stages, schedule, m = random_instance(rng)
        least = least_budget(costs, n_stages, schedule, m)
        planner = TimePlanner()
        with pytest.raises(InfeasibleBudgetError) as caught:
            planner.plan(
                costs, n_stages, schedule=schedule, n_microbatches=m, memory_budget=least - 1
            )
        err = caught.value
        assert (err.budget, err.min_budget) == (least - 1, least)
        assert f"{least:,}" in str(err)
        plan = planner.plan(
            costs, n_stages, schedule=schedule, n_microbatches=m, memory_budget=err.min_budget
        )
        check_plan(plan, costs, schedule, m, err.min_budget)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_medium_instances_equal_a_dynamic_program(schedule: str) -> None:
    rng = random.Random(11)
    for _ in range(3):
        n_stages, n = rng.randint(3, 6), rng.randint(25, 40)
        costs = random_costs(rng, n)
        m = rng.randint(2, 8)
        keep_all = max(
            stage_memory(costs, range(a, e), set(), in_flight(schedule, n_stages, m, s))
            for s, (a, e) in enumerate(_equal(n, n_stages))
        )
        budget = int(keep_all * 0.6)
        expected = medium_dp(costs, n_stages, schedule, m, budget)
        got = plan_or_infeasible(
            TimePlanner(exact_limit=0), costs, n_stages, schedule, m, budget, expected
        )
        assert got is None or got == pytest.approx(expected, rel=1e-9)


def _equal(n: int, n_stages: int) -> list[tuple[int, int]]:
    edges = [round(n * s / n_stages) for s in range(n_stages + 1)]
    return list(itertools.pairwise(edges))


def test_uniform_layers_split_evenly_and_predict_the_iteration() -> None:
    costs = [LayerCost(f"l{i}", 1.0, 2.0, activation_bytes=10) for i in range(12)]
    plan = get_planner("time").plan(costs, 4, schedule="1f1b", n_microbatches=8)
    assert plan.sizes == (3, 3, 3, 3)
    assert plan.bottleneck_s == pytest.approx(9.0)
    assert plan.predicted_iteration_s == pytest.approx((8 + 4 - 1) * 9.0)
    assert plan.predicted_stage_bytes == (40 * 3, 30 * 3, 20 * 3, 10 * 3)
    assert Plan.from_dict(plan.to_dict()) == plan


def test_1f1b_puts_memory_heavy_layers_late() -> None:
    # stage 0 keeps 2 micro-batches in flight, stage 1 keeps 1: the big layer must go last
    # ("big" cannot be recomputed for less: its input is as large as its activations)
    costs = [
        LayerCost("small", 1.0, 1.0, activation_bytes=10, output_bytes=100),
        LayerCost("big", 1.0, 1.0, activation_bytes=100),
    ]
    plan = TimePlanner().plan(costs, 2, schedule="1f1b", n_microbatches=4, memory_budget=100)
    assert plan.sizes == (1, 1) and plan.actions == ("keep", "keep")
    with pytest.raises(InfeasibleBudgetError):
        TimePlanner().plan(costs, 2, schedule="gpipe", n_microbatches=4, memory_budget=100)


def test_bad_arguments() -> None:
    costs = [LayerCost("a", 1, 1), LayerCost("b", 1, 1)]
    with pytest.raises(ValueError, match="at least one layer"):
        TimePlanner().plan(costs, 3)
    with pytest.raises(ValueError, match="unique"):
        TimePlanner().plan([LayerCost("a", 1, 1)] * 2, 1)
    with pytest.raises(ValueError, match="unknown schedule"):
        TimePlanner().plan(costs, 2, schedule="nope")
    with pytest.raises(ValueError, match=r"valid planners: time, memory, bipartition, or a class"):
        get_planner("fastest")
    assert isinstance(get_planner("TIME", exact_limit=3), TimePlanner)


def test_infeasible_budget_error_survives_pickling() -> None:
    import pickle

    from pipeline.pure.planner import InfeasibleBudgetError

    err = pickle.loads(pickle.dumps(InfeasibleBudgetError(100, 250, " (3 stages)")))
    assert (err.budget, err.min_budget) == (100, 250) and "250" in str(err)


def _gpipe_under_another_name(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    return gpipe(n_stages, n_microbatches, stage)


def test_a_custom_schedule_is_planned_with_its_own_in_flight_counts() -> None:
    """Pure: a custom function plans like the built-in schedule it equals, not like 1F1B."""
    costs = [
        LayerCost(f"l{i}", 1e-3 * (1 + i % 3), 2e-3, 10_000 * (8 - i), 4_000, 2_000, 2_000, 4_000)
        for i in range(8)
    ]
    planner = TimePlanner()
    budget = 120_000
    custom = planner.plan(
        costs, 2, schedule=_gpipe_under_another_name, n_microbatches=4, memory_budget=budget
    )
    named = planner.plan(costs, 2, schedule="gpipe", n_microbatches=4, memory_budget=budget)
    flush = planner.plan(costs, 2, schedule="1f1b", n_microbatches=4, memory_budget=budget)
    assert custom.schedule == "_gpipe_under_another_name"
    assert (custom.sizes, custom.actions) == (named.sizes, named.actions)
    assert custom.predicted_stage_bytes == named.predicted_stage_bytes
    assert custom.predicted_stage_bytes != flush.predicted_stage_bytes
