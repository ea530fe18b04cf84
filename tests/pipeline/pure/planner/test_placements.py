"""The planners over several stages per rank: S = v * R stages, a rank's memory budget.

Brute force over every contiguous partition into S stages, written from the planners'
model (stage time = the sum of its layers' forward + backward; a rank's memory = the sum of
its stages'), against `TimePlanner` and `MemoryPlanner` under interleaved 1F1B and ZB-V.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.placement import Placement
from pipeline.pure.planner import InfeasibleBudgetError, get_planner
from pipeline.pure.planner.base import evaluate, in_flight_counts, placement_for
from pipeline.pure.schedule import get_schedule
from pipeline.pure.simulate import simulate, stage_costs


def random_costs(rng: random.Random, n: int) -> list[LayerCost]:
    return [
        LayerCost(
            f"l{i}",
            rng.uniform(0.5, 3.0),
            rng.uniform(1.0, 6.0),
            activation_bytes=rng.randint(1, 50) * 1000,
            output_bytes=1000,
            param_bytes=rng.randint(1, 20) * 1000,
            grad_bytes=1000,
        )
        for i in range(n)
    ]


def partitions(n_layers: int, n_stages: int) -> Iterator[list[int]]:
    for cuts in itertools.combinations(range(1, n_layers), n_stages - 1):
        edges = [0, *cuts, n_layers]
        yield [b - a for a, b in itertools.pairwise(edges)]


def bottleneck(costs: list[LayerCost], sizes: list[int]) -> float:
    out, start = 0.0, 0
    for size in sizes:
        out = max(out, sum(c.forward_s + c.backward_s for c in costs[start : start + size]))
        start += size
    return out


def test_placements_say_which_rank_holds_which_stage() -> None:
    assert placement_for("zbv", 6) == Placement("v", 3, 2)
    assert placement_for("1f1b", 3) == Placement.single(3)
    assert placement_for(get_schedule("interleaved_1f1b", 3), 6) == Placement("loop", 2, 3)
    with pytest.raises(ValueError, match="multiple of 2"):
        placement_for("zbv", 5)


def test_in_flight_counts_are_per_stage_and_zbv_ranks_hold_what_1f1b_stages_do() -> None:
    for n_ranks, m in [(2, 4), (3, 8), (4, 8)]:
        zbv = in_flight_counts("zbv", 2 * n_ranks, m)
        one = in_flight_counts("1f1b", n_ranks, m)
        assert len(zbv) == 2 * n_ranks and zbv[0] == min(2 * n_ranks, m)
        # a chunk holds half a 1F1B stage's activations: per rank, the sum of its two
        # chunks' peaks is within one chunk of twice 1F1B's first stage (the peaks of the
        # two chunks are not simultaneous, so the sum is a bound)
        for r in range(n_ranks):
            assert zbv[r] + zbv[2 * n_ranks - 1 - r] <= 2 * one[0] + 1


@pytest.mark.parametrize("schedule", ["interleaved_1f1b", "zbv"])
def test_the_time_planner_minimises_the_slowest_of_all_stages(schedule: str) -> None:
    rng = random.Random(5)
    for trial in range(12):
        n_ranks, n_layers = rng.choice([2, 3]), rng.randint(6, 9)
        costs = random_costs(rng, n_layers)
        plan = get_planner("time").plan(costs, 2 * n_ranks, schedule=schedule, n_microbatches=4)
        best = min(bottleneck(costs, s) for s in partitions(n_layers, 2 * n_ranks))
        assert len(plan.sizes) == 2 * n_ranks
        assert bottleneck(costs, list(plan.sizes)) == pytest.approx(best), trial


@pytest.mark.parametrize("planner", ["time", "memory"])
def test_a_memory_budget_holds_per_rank(planner: str) -> None:
    rng = random.Random(9)
    for _ in range(10):
        costs = random_costs(rng, 8)
        unlimited = get_planner(planner).plan(costs, 4, schedule="zbv", n_microbatches=4)
        budget = int(max(unlimited.predicted_rank_bytes) * 0.9)
        try:
            plan = get_planner(planner).plan(
                costs, 4, schedule="zbv", n_microbatches=4, memory_budget=budget
            )
        except InfeasibleBudgetError as error:
            assert error.budget == budget and error.min_budget > budget
            continue
        assert max(plan.predicted_rank_bytes) <= budget


def test_a_plan_predicts_the_simulated_time_of_its_placement() -> None:
    costs = random_costs(random.Random(2), 8)
    plan = get_planner("time").plan(costs, 4, schedule="interleaved_1f1b", n_microbatches=4)
    stages = stage_costs(costs, plan.sizes, plan.actions)
    replay = simulate("interleaved_1f1b", stages, 4)
    assert replay.n_ranks == 2
    assert plan.predicted_iteration_s == pytest.approx(replay.iteration_s)


@pytest.mark.parametrize("n_ranks,m", [(2, 4), (2, 8), (4, 8)])
def test_a_zbv_rank_holds_the_activations_of_a_1f1b_first_stage(n_ranks: int, m: int) -> None:
    """ZB-V's promise: each rank's activation peak (over time, its two chunks together) is
    1F1B's first stage's, though the sum of the chunks' own peaks is more."""
    layers = 4 * n_ranks
    costs = [LayerCost(f"l{i}", 1.0, 2.0, activation_bytes=100) for i in range(layers)]
    one = evaluate(costs, [4] * n_ranks, schedule="1f1b", n_microbatches=m)
    zbv = evaluate(costs, [2] * (2 * n_ranks), schedule="zbv", n_microbatches=m)
    assert max(zbv.predicted_rank_bytes) == max(one.predicted_stage_bytes)
    placement = placement_for("zbv", 2 * n_ranks)
    summed = [
        sum(zbv.predicted_stage_bytes[s] for s in placement.stages_of(r)) for r in range(n_ranks)
    ]
    assert all(held <= total for held, total in zip(zbv.predicted_rank_bytes, summed, strict=True))
