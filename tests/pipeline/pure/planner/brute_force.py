"""An independent model of `TimePlanner`'s objective: brute force over partitions and subsets.

Written from the model in `pipeline.pure.planner.time`'s docstring and sharing no code with the
planner: in-flight counts from the closed forms, kept bytes from the previous layer's output,
memory and time summed layer by layer (`medium_dp`: the same model as a dynamic program, for
instances too large to enumerate). `test_time` compares the planner with it on random
instances (`random_instance`, `random_budgeted_instance`); it lives apart from those tests
because it is a second implementation of the planner's model, not a test.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Sequence

from pipeline.pure.costs import LayerCost, LinkCost

INF = math.inf


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
