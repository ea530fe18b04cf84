"""MemoryPlanner (CAPSlog) against brute force over every contiguous partition."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import InfeasibleBudgetError, MemoryPlanner, get_planner


def in_flight(schedule: str, n_stages: int, n_microbatches: int, stage: int) -> int:
    return n_microbatches if schedule == "gpipe" else min(n_stages - stage, n_microbatches)


def stage_peak(costs: Sequence[LayerCost], a: int, e: int, k: int) -> int:
    """isolated(first) + added(rest) + (k - 1) more micro-batches of activations."""
    isolated = costs[a].isolated_peak_bytes
    if isolated is None:
        isolated = (
            costs[a].activation_bytes
            + costs[a].param_bytes
            + costs[a].grad_bytes
            + costs[a].optimizer_bytes
            + costs[a].output_bytes
        )
    peak = isolated
    for c in costs[a + 1 : e]:
        added = c.added_peak_bytes
        if added is None:
            added = c.activation_bytes + c.param_bytes + c.grad_bytes + c.optimizer_bytes
        peak += added
    return peak + (k - 1) * sum(c.activation_bytes for c in costs[a:e])


def brute_force(
    costs: Sequence[LayerCost], n_stages: int, schedule: str, m: int, use_in_flight: bool = True
) -> int:
    best = None
    n = len(costs)
    for cuts in itertools.combinations(range(1, n), n_stages - 1):
        edges = [0, *cuts, n]
        worst = max(
            stage_peak(costs, a, e, in_flight(schedule, n_stages, m, s) if use_in_flight else 1)
            for s, (a, e) in enumerate(itertools.pairwise(edges))
        )
        best = worst if best is None else min(best, worst)
    assert best is not None
    return best


def random_costs(rng: random.Random, n: int, explicit_peaks: bool) -> list[LayerCost]:
    out = []
    for i in range(n):
        act, out_bytes = rng.randint(0, 300), rng.randint(0, 300)
        iso = added = None
        if explicit_peaks:  # measured peaks need not be consistent with the other numbers
            added = rng.randint(0, 400)
            iso = added + rng.randint(0, 600)
        out.append(
            LayerCost(
                f"l{i}",
                rng.uniform(0.1, 2.0),
                rng.uniform(0.1, 4.0),
                activation_bytes=act,
                output_bytes=out_bytes,
                param_bytes=rng.randint(0, 50),
                grad_bytes=rng.randint(0, 50),
                optimizer_bytes=rng.randint(0, 100),
                isolated_peak_bytes=iso,
                added_peak_bytes=added,
            )
        )
    return out


@pytest.mark.parametrize("explicit_peaks", [False, True])
@pytest.mark.parametrize("use_in_flight", [True, False])
def test_largest_stage_equals_brute_force(explicit_peaks: bool, use_in_flight: bool) -> None:
    rng = random.Random(int(explicit_peaks) * 2 + int(use_in_flight))
    planner = MemoryPlanner(in_flight=use_in_flight)
    for _ in range(80):
        n_stages = rng.randint(1, 4)
        n = rng.randint(n_stages, min(12, n_stages + 8))
        costs = random_costs(rng, n, explicit_peaks)
        schedule, m = rng.choice(["gpipe", "1f1b"]), rng.randint(1, 6)
        plan = planner.plan(costs, n_stages, schedule=schedule, n_microbatches=m)
        expected = brute_force(costs, n_stages, schedule, m, use_in_flight)
        assert max(plan.predicted_stage_bytes) == expected
        for s, (a, e) in enumerate(plan.bounds()):  # the plan's claims are its real peaks
            k = in_flight(schedule, n_stages, m, s) if use_in_flight else 1
            assert plan.predicted_stage_bytes[s] == stage_peak(costs, a, e, k)
        assert set(plan.actions) == {"keep"}


def test_a_larger_instance_equals_a_dynamic_program() -> None:
    """Both search paths (greedy fill, reachable ends) at sizes brute force cannot reach."""
    rng = random.Random(5)
    for explicit in (False, True):
        n, n_stages, m = 60, 5, 4
        costs = random_costs(rng, n, explicit)
        k = [in_flight("1f1b", n_stages, m, s) for s in range(n_stages)]
        best = [[float("inf")] * (n + 1) for _ in range(n_stages + 1)]
        best[0][0] = 0
        for s in range(n_stages):
            for e in range(1, n + 1):
                for a in range(e):
                    value = max(best[s][a], stage_peak(costs, a, e, k[s]))
                    best[s + 1][e] = min(best[s + 1][e], value)
        plan = MemoryPlanner().plan(costs, n_stages, schedule="1f1b", n_microbatches=m)
        assert max(plan.predicted_stage_bytes) == best[n_stages][n]


def test_capslog_balances_peaks_not_times() -> None:
    # two heavy-memory layers that are fast, six light ones that are slow
    costs = [LayerCost(f"l{i}", 5.0, 5.0, activation_bytes=10) for i in range(6)]
    costs[2:2] = [
        LayerCost("h0", 0.1, 0.1, activation_bytes=1000),
        LayerCost("h1", 0.1, 0.1, activation_bytes=1000),
    ]
    plan = get_planner("memory", in_flight=False).plan(costs, 2, schedule="gpipe", n_microbatches=1)
    assert plan.sizes == (3, 5)  # one heavy layer each
    by_time = get_planner("time").plan(costs, 2, schedule="gpipe", n_microbatches=1)
    assert by_time.sizes == (5, 3)  # 30.4 s and 30 s
    assert by_time.bottleneck_s < plan.bottleneck_s
    peaks = MemoryPlanner(in_flight=False).evaluate(
        costs, by_time.sizes, schedule="gpipe", n_microbatches=1
    )
    assert max(plan.predicted_stage_bytes) < max(peaks.predicted_stage_bytes)


def test_budget_below_the_least_peak_is_infeasible() -> None:
    costs = random_costs(random.Random(1), 8, explicit_peaks=False)
    best = MemoryPlanner().plan(costs, 3)
    least = max(best.predicted_stage_bytes)
    assert MemoryPlanner().plan(costs, 3, memory_budget=least).sizes == best.sizes
    with pytest.raises(InfeasibleBudgetError) as caught:
        MemoryPlanner().plan(costs, 3, memory_budget=least - 1)
    assert caught.value.min_budget == least
