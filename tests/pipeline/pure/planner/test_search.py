"""The shared partition search against brute force: every contiguous partition, enumerated.

The brute force shares no code with `pipeline.pure.planner.search`: it lists every way to
cut L layers into S non-empty runs and takes the smallest largest range cost.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterator

import pytest

from pipeline.pure.planner.search import (
    Cuts,
    RangeCost,
    bisect_max_stop,
    bisect_min_start,
    bottleneck,
    dp_min_max,
    first_true,
    fits_backward,
    fits_forward,
    minimize,
    sizes_from_cuts,
    solve,
    stage_order,
)

INF = math.inf


def all_cuts(n_layers: int, n_stages: int) -> Iterator[list[int]]:
    for inner in itertools.combinations(range(1, n_layers), n_stages - 1):
        yield [0, *inner, n_layers]


def largest(cost: RangeCost, cuts: list[int]) -> float:
    return max(cost(s, cuts[s], cuts[s + 1]) for s in range(len(cuts) - 1))


def brute_force(cost: RangeCost, n_layers: int, n_stages: int) -> float:
    return min(largest(cost, cuts) for cuts in all_cuts(n_layers, n_stages))


def weighted_cost(rng: random.Random, n: int, weights: list[int]) -> RangeCost:
    """A cost monotone in the range, scaled per stage, infeasible above a memory budget."""
    x = [rng.randint(0, 20) for _ in range(n)]
    y = [rng.randint(0, 20) for _ in range(n)]
    budget = rng.randint(20, 150)

    def cost(s: int, a: int, e: int) -> float:
        memory = weights[s] * sum(y[a:e])
        return INF if memory > budget else weights[s] * sum(x[a:e]) + memory

    return cost


def check_found(found: tuple[float, Cuts] | None, cost: RangeCost, n: int, n_stages: int) -> None:
    expected = brute_force(cost, n, n_stages)
    if expected == INF:
        assert found is None
        return
    assert found is not None
    value, cuts = found
    assert value == expected
    assert cuts[0] == 0 and cuts[-1] == n and len(cuts) == n_stages + 1
    assert all(a < e for a, e in itertools.pairwise(cuts))
    assert largest(cost, cuts) == expected


@pytest.mark.parametrize("weights", [[3, 2, 2, 1], [1, 1, 2, 3], [2, 1, 3, 1], [1, 1, 1, 1]])
def test_solve_in_every_stage_order_equals_brute_force(weights: list[int]) -> None:
    """Fill from the back, from the front, or the DP: each equals brute force."""
    rng = random.Random(sum(w * 10**i for i, w in enumerate(weights)))
    for _ in range(60):
        n = rng.randint(4, 10)
        cost = weighted_cost(rng, n, weights)
        found = solve(cost, n, len(weights), order=stage_order(weights), lower=0, integer=True)
        check_found(found, cost, n, len(weights))


@pytest.mark.parametrize("seed", range(3))
def test_dp_equals_brute_force_for_any_cost(seed: int) -> None:
    """The DP needs no monotonicity: arbitrary (even infeasible) range costs."""
    rng = random.Random(seed)
    for _ in range(60):
        n_stages = rng.randint(1, 4)
        n = rng.randint(n_stages, 9)
        ranges = [(s, a, e) for s in range(n_stages) for a in range(n) for e in range(a + 1, n + 1)]
        table = {key: rng.choice([INF, *range(30)]) for key in ranges}

        def cost(s: int, a: int, e: int, table: dict[tuple[int, int, int], float] = table) -> float:
            return table[(s, a, e)]

        check_found(dp_min_max(cost, n, n_stages), cost, n, n_stages)


def test_real_costs_are_found_to_the_tolerance() -> None:
    rng = random.Random(7)
    for _ in range(40):
        n, n_stages = rng.randint(3, 10), rng.randint(1, 3)
        times = [rng.uniform(0.1, 3.0) for _ in range(n)]

        def cost(s: int, a: int, e: int, times: list[float] = times) -> float:
            return sum(times[a:e])

        found = solve(cost, n, n_stages, order="backward", lower=max(times), rtol=1e-12)
        assert found is not None
        assert found[0] == pytest.approx(brute_force(cost, n, n_stages), rel=1e-9)


def linear_min_start(cost: RangeCost) -> Callable[[int, int, float, int], int | None]:
    def min_start(s: int, stop: int, limit: float, lowest: int) -> int | None:
        return next((a for a in range(lowest, stop) if cost(s, a, stop) <= limit), None)

    return min_start


def linear_max_stop(cost: RangeCost) -> Callable[[int, int, float, int], int | None]:
    def max_stop(s: int, start: int, limit: float, highest: int) -> int | None:
        ok = [e for e in range(start + 1, highest + 1) if cost(s, start, e) <= limit]
        return max(ok) if ok else None

    return max_stop


def test_bisections_equal_linear_scans_and_greedy_checks_agree() -> None:
    rng = random.Random(11)
    for _ in range(80):
        n, n_stages = rng.randint(2, 9), rng.randint(1, 3)
        n_stages = min(n_stages, n)
        cost = weighted_cost(rng, n, [1] * n_stages)
        fast_start, slow_start = bisect_min_start(cost), linear_min_start(cost)
        fast_stop, slow_stop = bisect_max_stop(cost), linear_max_stop(cost)
        for limit in (0, 5, 20, 60, 200):
            for lo in range(n):
                for hi in range(lo + 1, n + 1):
                    assert fast_start(0, hi, limit, lo) == slow_start(0, hi, limit, lo)
                    assert fast_stop(0, lo, limit, hi) == slow_stop(0, lo, limit, hi)
            feasible = brute_force(cost, n, n_stages) <= limit
            back = fits_backward(n, n_stages, limit, fast_start)
            front = fits_forward(n, n_stages, limit, fast_stop)
            assert (back is not None) == feasible == (front is not None)
            for cuts in (back, front):
                assert cuts is None or largest(cost, cuts) <= limit


def test_minimize_finds_the_least_feasible_limit() -> None:
    """minimize over a synthetic check: feasible from 37 up, reaching the limit it is given."""

    def fits(limit: float) -> Cuts | None:
        return [0, int(limit), 100] if limit >= 37 else None

    def value(cuts: Cuts) -> float:
        return min(cuts[1], 1000)

    assert minimize(fits, value, lower=0, integer=True) == (37, [0, 37, 100])
    assert minimize(fits, value, lower=40, integer=True) == (40, [0, 40, 100])  # no search
    assert minimize(lambda limit: None, value, lower=0) is None


def test_small_helpers() -> None:
    assert stage_order([3, 2, 2]) == "backward"
    assert stage_order([1, 2, 2]) == "forward"
    assert stage_order([1, 2, 1]) == "dp"
    assert first_true(0, 10, lambda x: x >= 4) == 4
    assert first_true(0, 10, lambda x: False) == 10
    assert sizes_from_cuts([0, 2, 3, 7]) == [2, 1, 4]
    assert bottleneck(lambda s, a, e: float(s * 10 + e - a), [0, 2, 3, 7]) == 24.0


def test_solve_rejects_bad_arguments() -> None:
    def cost(s: int, a: int, e: int) -> float:
        return float(e - a)

    with pytest.raises(ValueError, match="unknown search order 'sideways'"):
        solve(cost, 4, 2, order="sideways", lower=0)
    with pytest.raises(ValueError, match="cannot split 2 layers into 3"):
        solve(cost, 2, 3, order="dp", lower=0)
    with pytest.raises(ValueError, match="cannot split 2 layers into 0"):
        solve(cost, 2, 0, order="backward", lower=0)
