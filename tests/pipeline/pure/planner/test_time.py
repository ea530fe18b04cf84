"""TimePlanner against brute force: every contiguous partition, every recompute subset.

The brute force here is written from the model in `pipeline.pure.planner.time`'s docstring and
shares no code with the planner: in-flight counts from the closed forms, kept bytes from
the previous layer's output, memory and time summed layer by layer.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence

import pytest

from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.planner import InfeasibleBudgetError, Plan, TimePlanner, get_planner
from pipeline.pure.schedule import Action, gpipe

INF = math.inf


# -- the brute force -------------------------------------------------------------------------
def in_flight(schedule: str, n_stages: int, n_microbatches: int, stage: int) -> int:
    return n_microbatches if schedule == "gpipe" else min(n_stages - stage, n_microbatches)


def partitions(n_layers: int, n_stages: int) -> Iterator[list[tuple[int, int]]]:
    for cuts in itertools.combinations(range(1, n_layers), n_stages - 1):
        edges = [0, *cuts, n_layers]
        yield list(itertools.pairwise(edges))


def kept(costs: Sequence[LayerCost], i: int) -> int:
    if i == len(costs) - 1:  # the loss's input: kept whatever the action
        return costs[i].activation_bytes
    return min(costs[i].activation_bytes, costs[i - 1].output_bytes if i > 0 else 0)


def reduce_seconds(costs: Sequence[LayerCost], i: int, swap: LinkCost | None) -> float:
    recompute_s = costs[i].recompute_s
    seconds = costs[i].forward_s if recompute_s is None else recompute_s
    if swap is not None:
        seconds = min(seconds, 2 * swap.time(costs[i].activation_bytes - kept(costs, i)))
    return seconds


def stage_memory(costs: Sequence[LayerCost], layers: range, reduced: set[int], k: int) -> int:
    state = sum(
        costs[i].param_bytes + costs[i].grad_bytes + costs[i].optimizer_bytes for i in layers
    )
    acts = sum(kept(costs, i) if i in reduced else costs[i].activation_bytes for i in layers)
    return state + k * acts


def stage_time(
    costs: Sequence[LayerCost], layers: range, reduced: set[int], swap: LinkCost | None
) -> float:
    return sum(
        costs[i].forward_s
        + costs[i].backward_s
        + (reduce_seconds(costs, i, swap) if i in reduced else 0.0)
        for i in layers
    )


def best_exact(
    costs: Sequence[LayerCost], layers: range, k: int, budget: int | None, swap: LinkCost | None
) -> float:
    """The fastest way to run `layers` on one stage within the budget: every subset."""
    if budget is None:
        return stage_time(costs, layers, set(), swap)
    best = INF
    for n in range(len(layers) + 1):
        for subset in itertools.combinations(layers, n):
            reduced = set(subset)
            if stage_memory(costs, layers, reduced, k) <= budget:
                best = min(best, stage_time(costs, layers, reduced, swap))
    return best


def best_greedy(
    costs: Sequence[LayerCost], layers: range, k: int, budget: int | None, swap: LinkCost | None
) -> float:
    """Reduce layers by least seconds per byte saved (then index) until the stage fits."""
    if budget is None:
        return stage_time(costs, layers, set(), swap)
    candidates = [i for i in layers if costs[i].activation_bytes > kept(costs, i)]
    candidates.sort(
        key=lambda i: (
            reduce_seconds(costs, i, swap) / (costs[i].activation_bytes - kept(costs, i)),
            i,
        )
    )
    reduced: set[int] = set()
    for i in [None, *candidates]:
        if i is not None:
            reduced.add(i)
        if stage_memory(costs, layers, reduced, k) <= budget:
            return stage_time(costs, layers, reduced, swap)
    return INF


def brute_force(
    costs: Sequence[LayerCost],
    n_stages: int,
    schedule: str,
    m: int,
    budget: int | None,
    swap: LinkCost | None = None,
    greedy: bool = False,
) -> float:
    """The smallest bottleneck over all partitions (INF if none fits the budget)."""
    best_range = best_greedy if greedy else best_exact
    memo: dict[tuple[int, int, int], float] = {}
    best = INF
    for ranges in partitions(len(costs), n_stages):
        worst = 0.0
        for s, (a, e) in enumerate(ranges):
            k = in_flight(schedule, n_stages, m, s)
            if (a, e, k) not in memo:
                memo[(a, e, k)] = best_range(costs, range(a, e), k, budget, swap)
            worst = max(worst, memo[(a, e, k)])
        best = min(best, worst)
    return best


def least_budget(costs: Sequence[LayerCost], n_stages: int, schedule: str, m: int) -> int:
    """The smallest budget some partition fits with every layer reduced."""
    return min(
        max(
            stage_memory(costs, range(a, e), set(range(a, e)), in_flight(schedule, n_stages, m, s))
            for s, (a, e) in enumerate(ranges)
        )
        for ranges in partitions(len(costs), n_stages)
    )


def random_costs(rng: random.Random, n: int) -> list[LayerCost]:
    out = []
    for i in range(n):
        f = rng.choice([rng.uniform(0.1, 3.0), float(rng.randint(1, 4))])  # ties, sometimes
        out.append(
            LayerCost(
                f"l{i}",
                forward_s=f,
                backward_s=rng.choice([2 * f, rng.uniform(0.1, 5.0)]),
                activation_bytes=rng.randint(0, 400),
                output_bytes=rng.randint(0, 150),
                param_bytes=rng.randint(0, 60),
                grad_bytes=rng.randint(0, 60),
                optimizer_bytes=rng.randint(0, 120),
                recompute_s=rng.choice([None, rng.uniform(0.0, 2.0)]),
            )
        )
    return out


def random_instance(rng: random.Random) -> tuple[list[LayerCost], int, str, int]:
    n_stages = rng.randint(1, 4)
    n_layers = rng.randint(n_stages, min(12, n_stages + rng.choice([2, 5, 8])))
    return random_costs(rng, n_layers), n_stages, rng.choice(["gpipe", "1f1b"]), rng.randint(1, 6)


def budget_between(
    rng: random.Random, costs: Sequence[LayerCost], n_stages: int, schedule: str, m: int
) -> int:
    """A budget from a little below the least feasible one to above what keeping all needs."""
    low = least_budget(costs, n_stages, schedule, m)
    high = max(stage_memory(costs, range(len(costs)), set(), m), low)
    return rng.randint(int(low * 0.95), high)


def random_budgeted_instance(rng: random.Random) -> tuple[list[LayerCost], int, str, int, int]:
    costs, n_stages, schedule, m = random_instance(rng)
    return costs, n_stages, schedule, m, budget_between(rng, costs, n_stages, schedule, m)


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


def medium_dp(
    costs: Sequence[LayerCost], n_stages: int, schedule: str, m: int, budget: int
) -> float:
    """O(S L^2) dynamic program with the greedy recompute model: too many layers to enumerate."""
    n = len(costs)
    best = [[INF] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for s in range(n_stages):
        k = in_flight(schedule, n_stages, m, s)
        for e in range(1, n + 1):
            for a in range(e):
                if best[s][a] < INF:
                    cost = best_greedy(costs, range(a, e), k, budget, None)
                    best[s + 1][e] = min(best[s + 1][e], max(best[s][a], cost))
    return best[n_stages][n]


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
    with pytest.raises(ValueError, match=r"valid planners: \['bipartition', 'memory', 'time'\]"):
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
