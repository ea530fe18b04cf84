"""Bi-Partition's search against brute force, its cost model, and its planner's choice.

The brute force is written from the model in `pipeline.pure.bipartition`'s docstring and
shares no code with it: every contiguous partition, every handoff of trailing separable
layers, each stage's time summed layer by layer.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence

import pytest

from pipeline.pure.bipartition import search, stage_times
from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.planner import Plan, get_planner
from pipeline.pure.planner.base import evaluate


def layer(i: int, f: float, separable: bool, b: float | None = None) -> LayerCost:
    return LayerCost(
        f"l{i}",
        forward_s=f,
        backward_s=2 * f if b is None else b,
        activation_bytes=100,
        output_bytes=10,
        param_bytes=40,
        grad_bytes=40,
        separable=separable,
    )


def brute_force(costs: Sequence[LayerCost], n_stages: int, max_k: int) -> float:
    best = float("inf")
    n = len(costs)
    for cuts in itertools.combinations(range(1, n), n_stages - 1):
        edges = [0, *cuts, n]
        for handoff in itertools.product(range(max_k + 1), repeat=n_stages - 1):
            ok = all(
                k < edges[s + 1] - edges[s]
                and all(costs[j].separable for j in range(edges[s + 1] - k, edges[s + 1]))
                for s, k in enumerate(handoff)
            )
            if not ok:
                continue
            times = []
            for s in range(n_stages):
                mine = range(edges[s], edges[s + 1])
                k_out = handoff[s] if s < n_stages - 1 else 0
                k_in = handoff[s - 1] if s > 0 else 0
                t = sum(costs[j].forward_s for j in mine)
                t += sum(costs[j].backward_s for j in mine[: len(mine) - k_out])
                t += sum(costs[j].backward_s for j in range(edges[s] - k_in, edges[s]))
                times.append(t)
            best = min(best, max(times))
    return best


def random_problems(count: int) -> Iterator[tuple[list[LayerCost], int]]:
    rng = random.Random(5)
    for _ in range(count):
        n = rng.randint(2, 7)
        costs = [
            layer(
                i,
                rng.choice([1.0, 2.0, 3.0, 0.5]),
                rng.random() < 0.6,
                b=rng.choice([1.0, 2.0, 4.0, 6.0]),
            )
            for i in range(n)
        ]
        yield costs, rng.randint(1, min(n, 3))


@pytest.mark.parametrize("max_k", [0, 1, 3])
def test_search_equals_brute_force(max_k: int) -> None:
    for costs, n_stages in random_problems(150):
        bottleneck, sizes, handoff = search(costs, n_stages, max_k)
        assert bottleneck == pytest.approx(brute_force(costs, n_stages, max_k))
        assert sum(sizes) == len(costs) and len(handoff) == n_stages - 1
        assert max(stage_times(costs, sizes, handoff)) == pytest.approx(bottleneck)
        for s, k in enumerate(handoff):  # only separable layers are handed, never all
            end = sum(sizes[: s + 1])
            assert k < sizes[s] and all(costs[j].separable for j in range(end - k, end))


def test_the_textbook_case_hands_one_backward_and_ties_hand_none() -> None:
    costs = [layer(i, 1.0, True) for i in range(3)]  # F = 1, B = 2: whole layers give 6
    assert search(costs, 2) == (5.0, (2, 1), (1,))
    assert search([layer(i, 1.0, False) for i in range(3)], 2)[2] == (0,)
    assert search([layer(i, 1.0, True) for i in range(4)], 2) == (6.0, (2, 2), (0,))


def test_evaluate_moves_time_memory_and_bytes_across_the_cut() -> None:
    costs = [layer(i, 1.0, True) for i in range(3)]
    whole = evaluate(costs, [2, 1], schedule="1f1b", n_microbatches=4)
    cut = evaluate(costs, [2, 1], schedule="1f1b", n_microbatches=4, handoff=[1])
    assert whole.predicted_stage_s == (6.0, 3.0) and cut.predicted_stage_s == (4.0, 5.0)
    assert cut.handoff == (1,) and whole.handoff == ()
    assert cut.predicted_iteration_s < whole.predicted_iteration_s
    # stage 0 keeps nothing for the handed layer; stage 1 keeps its input and a replica
    assert cut.predicted_stage_bytes[0] == whole.predicted_stage_bytes[0] - 2 * 100
    assert cut.predicted_stage_bytes[1] == whole.predicted_stage_bytes[1] + 1 * 10 + 80
    assert Plan.from_dict(cut.to_dict()) == cut


def test_plan_refuses_a_handoff_that_does_not_fit() -> None:
    with pytest.raises(ValueError, match="does not fit stage sizes"):
        Plan((2, 1), ("keep",) * 3, "1f1b", 4, 0.0, (0.0, 0.0), (0, 0), handoff=(2,))
    with pytest.raises(ValueError, match="does not fit stage sizes"):
        Plan((2, 1), ("keep",) * 3, "1f1b", 4, 0.0, (0.0, 0.0), (0, 0), handoff=(1, 0))


def test_the_planner_cuts_only_where_the_simulator_predicts_a_gain() -> None:
    planner = get_planner("bipartition")
    separable = [layer(i, 1.0, True) for i in range(3)]
    plan = planner.plan(separable, 2, schedule="1f1b", n_microbatches=8)
    assert plan.handoff == (1,) and plan.sizes == (2, 1) and plan.planner == "bipartition"
    assert (
        plan.predicted_iteration_s
        < get_planner("time")
        .plan(separable, 2, schedule="1f1b", n_microbatches=8)
        .predicted_iteration_s
    )
    # nothing separable, a stream schedule, or a budget the cut breaks: whole layers
    assert planner.plan([layer(i, 1.0, False) for i in range(3)], 2).handoff == ()
    assert planner.plan(separable, 2, schedule="2bw", n_microbatches=8).handoff == ()
    # the handed input crosses the link on every micro-batch: a slow link eats the saving
    assert planner.plan(separable, 2, n_microbatches=8, link=LinkCost(2.0)).handoff == ()
    whole_peak = max(get_planner("time").plan(separable, 2, n_microbatches=8).predicted_stage_bytes)
    tight = planner.plan(separable, 2, n_microbatches=8, memory_budget=whole_peak)
    assert max(tight.predicted_stage_bytes) <= whole_peak
    with pytest.raises(ValueError, match="max_handoff"):
        get_planner("bipartition", max_handoff=-1)
