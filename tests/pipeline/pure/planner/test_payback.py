"""replan: a new plan is adopted only when its saving over the remaining steps pays the move."""

from __future__ import annotations

import math

import pytest

from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.planner import MemoryPlanner, TimePlanner, moved_layers, replan

FAST_LINK = LinkCost(bandwidth_bytes_per_s=1e9)


def layers(slow: int = 0, factor: float = 3.0) -> list[LayerCost]:
    """8 layers of 1 s + 2 s; the first `slow` are `factor` times slower."""
    return [
        LayerCost(
            f"l{i}",
            (factor if i < slow else 1.0),
            2 * (factor if i < slow else 1.0),
            activation_bytes=10,
            param_bytes=100,
            grad_bytes=100,
            optimizer_bytes=200,
        )
        for i in range(8)
    ]


def test_nothing_changes_when_the_costs_do_not() -> None:
    planner = TimePlanner()
    plan = planner.plan(layers(), 2, schedule="1f1b", n_microbatches=4)
    result = replan(plan, layers(), planner, remaining_steps=10**6, link=FAST_LINK)
    assert not result.changed and result.plan == plan
    assert result.moved == () and result.bytes_moved == 0 and result.move_s == 0.0
    assert "current" in result.reason


def test_a_paying_plan_is_adopted_and_its_move_reported() -> None:
    planner = TimePlanner()
    plan = planner.plan(layers(), 2, schedule="1f1b", n_microbatches=4)
    assert plan.sizes == (4, 4)
    slower = layers(slow=2)  # layers 0 and 1 now take 9 s: stage 0 should shed layers
    result = replan(plan, slower, planner, remaining_steps=100, link=FAST_LINK)
    assert result.changed and result.plan is result.candidate
    new_sizes = result.plan.sizes
    assert new_sizes[0] < 4
    moved = [f"l{i}" for i in range(new_sizes[0], 4)]
    assert list(result.moved) == moved
    assert result.bytes_moved == 400 * len(moved)
    assert result.move_s == pytest.approx(FAST_LINK.time(400 * len(moved)))
    old = planner.evaluate(slower, plan.sizes, schedule="1f1b", n_microbatches=4)
    per_step = old.predicted_iteration_s - result.plan.predicted_iteration_s
    assert per_step > 0 and result.saving_s == pytest.approx(100 * per_step)


def test_the_move_must_pay_back_within_the_remaining_steps() -> None:
    planner = TimePlanner()
    plan = planner.plan(layers(), 2, schedule="1f1b", n_microbatches=4)
    slower = layers(slow=2)
    probe = replan(plan, slower, planner, remaining_steps=1, link=FAST_LINK)
    per_step = probe.saving_s
    steps = 50
    for margin, adopted in ((1 - 1e-6, True), (1 + 1e-6, False)):
        link = LinkCost(math.inf, latency_s=per_step * steps * margin)  # the move's time
        result = replan(plan, slower, planner, remaining_steps=steps, link=link)
        assert result.changed is adopted
        assert result.candidate.sizes != plan.sizes
        assert result.bytes_moved > 0  # what the candidate would move, adopted or not
    kept = replan(plan, slower, planner, remaining_steps=0, link=FAST_LINK)
    assert not kept.changed and kept.plan.sizes == plan.sizes
    # the kept plan's numbers are refreshed from the new costs
    refreshed = planner.evaluate(slower, plan.sizes, schedule="1f1b", n_microbatches=4)
    assert kept.plan.predicted_iteration_s == pytest.approx(refreshed.predicted_iteration_s)


def test_explicit_state_bytes_are_what_moves() -> None:
    planner = TimePlanner()
    plan = planner.plan(layers(), 2, schedule="1f1b", n_microbatches=4)
    result = replan(
        plan,
        layers(slow=2),
        planner,
        remaining_steps=100,
        link=FAST_LINK,
        state_bytes=[1000 + i for i in range(8)],
    )
    moved = moved_layers(plan, result.plan)
    assert result.bytes_moved == sum(1000 + i for i in moved)


def test_a_plan_over_the_budget_is_replaced_whatever_the_cost() -> None:
    planner = TimePlanner()
    plan = planner.plan(layers(), 2, schedule="1f1b", n_microbatches=4)
    # activations grow 100x: stage 0 (2 micro-batches in flight) no longer fits
    bigger = [
        LayerCost(
            c.key,
            c.forward_s,
            c.backward_s,
            activation_bytes=1000,
            param_bytes=100,
            grad_bytes=100,
            optimizer_bytes=200,
        )
        for c in layers()
    ]
    budget = 8000
    assert (
        max(
            planner.evaluate(
                bigger, plan.sizes, schedule="1f1b", n_microbatches=4
            ).predicted_stage_bytes
        )
        > budget
    )
    result = replan(
        plan, bigger, planner, remaining_steps=0, link=LinkCost(1.0), memory_budget=budget
    )
    assert result.changed and max(result.plan.predicted_stage_bytes) <= budget
    assert "budget" in result.reason


def test_works_with_any_planner_and_checks_its_inputs() -> None:
    planner = MemoryPlanner()
    plan = planner.plan(layers(), 2)
    result = replan(plan, layers(), planner, remaining_steps=10, link=FAST_LINK)
    assert not result.changed
    with pytest.raises(ValueError, match="7 layer costs"):
        replan(plan, layers()[:7], planner, remaining_steps=10, link=FAST_LINK)
    with pytest.raises(ValueError, match="remaining_steps"):
        replan(plan, layers(), planner, remaining_steps=-1, link=FAST_LINK)
