"""The lifecycle every planner runs (`Planner.plan`), with a strategy that proposes fixed layouts.

A planner supplies `propose` (and may refine memory with `stage_bytes`); `plan` validates
the problem, evaluates every proposed layout on the shared model and keeps the first
unless a challenger fits the budget and is predicted faster.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.planner import Plan, Planner, evaluate
from pipeline.pure.planner.base import Layout, Problem, ScheduleLike

COSTS = [
    LayerCost(f"l{i}", f, 2 * f, activation_bytes=100 * (i + 1), param_bytes=10)
    for i, f in enumerate([1.0, 1.0, 1.0, 3.0])
]
BALANCED, LOPSIDED = Layout((3, 1)), Layout((1, 3))


class Fixed(Planner):
    """Proposes the layouts it was given; remembers the problem it saw."""

    name = "fixed"
    default_link = LinkCost(1e9, 1e-6)

    def __init__(self, *layouts: Layout) -> None:
        self._layouts = list(layouts)
        self._seen: list[Problem] = []

    def propose(self, problem: Problem) -> list[Layout]:
        self._seen.append(problem)
        return list(self._layouts)


class Doubled(Fixed):
    """Predicts twice the shared model's memory."""

    def stage_bytes(
        self, costs: Sequence[LayerCost], plan: Plan, schedule: ScheduleLike
    ) -> tuple[int, ...]:
        return tuple(2 * b for b in plan.predicted_stage_bytes)


def shared(layout: Layout) -> Plan:
    return evaluate(COSTS, layout.sizes, link=Fixed.default_link, planner="fixed")


def test_the_first_layout_stands_unless_a_challenger_is_faster() -> None:
    assert shared(BALANCED).predicted_iteration_s < shared(LOPSIDED).predicted_iteration_s
    assert Fixed(LOPSIDED, BALANCED).plan(COSTS, 2) == shared(BALANCED)
    assert Fixed(BALANCED, LOPSIDED).plan(COSTS, 2) == shared(BALANCED)
    assert Fixed(LOPSIDED).plan(COSTS, 2) == shared(LOPSIDED)


def test_a_challenger_must_fit_the_budget_the_first_need_not() -> None:
    peaks = [max(shared(layout).predicted_stage_bytes) for layout in (LOPSIDED, BALANCED)]
    assert peaks[0] < peaks[1]
    for budget in (peaks[1] - 1, peaks[0] - 1):  # the faster one does not fit; neither does
        plan = Fixed(LOPSIDED, BALANCED).plan(COSTS, 2, memory_budget=budget)
        assert plan == shared(LOPSIDED)
    assert Fixed(LOPSIDED, BALANCED).plan(COSTS, 2, memory_budget=peaks[1]) == shared(BALANCED)


def test_the_problem_is_validated_and_carries_the_default_link() -> None:
    planner = Fixed(BALANCED)
    with pytest.raises(ValueError, match="at least one layer"):
        planner.plan(COSTS, 5)
    with pytest.raises(ValueError, match="n_microbatches must be >= 1"):
        planner.plan(COSTS, 2, n_microbatches=0)
    planner.plan(COSTS, 2, schedule="gpipe", n_microbatches=3)
    explicit = LinkCost(5.0)
    planner.plan(COSTS, 2, link=explicit)
    first, second = planner._seen
    assert first.link == Fixed.default_link and second.link == explicit
    assert first.in_flight == [3, 3] and first.weight_copies == 1 and first.n_layers == 4
    assert first.fits(shared(BALANCED)) and not Problem(COSTS, 2, "1f1b", 8, 1, None).fits(
        shared(BALANCED)
    )


def test_a_strategy_must_propose_something() -> None:
    with pytest.raises(RuntimeError, match="Fixed.propose gave no layout"):
        Fixed().plan(COSTS, 2)


def test_stage_bytes_refines_both_plan_and_evaluate() -> None:
    planner = Doubled(BALANCED)
    doubled = tuple(2 * b for b in shared(BALANCED).predicted_stage_bytes)
    assert planner.plan(COSTS, 2).predicted_stage_bytes == doubled
    evaluated = planner.evaluate(COSTS, [3, 1], link=Fixed.default_link)
    assert evaluated.predicted_stage_bytes == doubled and evaluated.planner == "fixed"
