"""ZB-H1 as data: valid, 1F1B's memory, a smaller simulated bubble, planned like 1F1B."""

from __future__ import annotations

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import evaluate, get_planner, in_flight_counts
from pipeline.pure.schedule import (
    SCHEDULES,
    Action,
    Op,
    ScheduleError,
    ScheduleFn,
    in_flight,
    one_f_one_b,
    stage_actions,
    validate,
    zbh1,
)
from pipeline.pure.simulate import StageCost, simulate, stage_costs, to_chrome_trace

F, B, BI, W = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT
SHAPES = [(1, 1), (1, 4), (2, 1), (2, 4), (2, 8), (3, 2), (3, 5), (4, 8), (6, 3), (8, 16)]


def test_registered_by_name() -> None:
    assert SCHEDULES["zbh1"] is zbh1
    assert stage_actions("ZBH1", 2, 4, 0) == stage_actions("zbh1", 2, 4, 0)
    with pytest.raises(ValueError, match=r"unknown schedule 'zb'.*zbh1"):
        stage_actions("zb", 2, 2, 0)


@pytest.mark.parametrize("n_stages,n_microbatches", SHAPES)
def test_valid_split_and_as_much_in_flight_as_1f1b(n_stages: int, n_microbatches: int) -> None:
    validate("zbh1", n_stages, n_microbatches)  # exactly once each, deadlock-free
    for s in range(n_stages):
        actions = zbh1(n_stages, n_microbatches, s)
        assert in_flight(actions) == in_flight(one_f_one_b(n_stages, n_microbatches, s))
        assert in_flight(actions) == min(n_stages - s, n_microbatches)
        whole = B if s == 0 else W  # the first stage sends no gradient: nothing to split
        assert {B, BI, W} & {a.op for a in actions} == ({B} if s == 0 else {BI, W})
        weights = [a.microbatch for a in actions if a.op is whole]
        assert weights == list(range(n_microbatches))  # gradients accumulate in order
    assert in_flight_counts("zbh1", n_stages, n_microbatches) == in_flight_counts(
        "1f1b", n_stages, n_microbatches
    )


def test_the_two_stage_shape() -> None:
    assert [a.label for a in zbh1(2, 4, 0)] == [
        "F0",
        "F1",
        "B0",
        "F2",
        "B1",
        "F3",
        "B2",
        "B3",
        "STEP",
    ]
    assert {a.stage for a in zbh1(2, 4, 1)} == {1, None}  # None: the optimizer step
    assert [a.label for a in zbh1(2, 4, 1)] == [
        "F0",
        "BI0",
        "W0",
        "F1",
        "BI1",
        "W1",
        "F2",
        "BI2",
        "W2",
        "F3",
        "BI3",
        "W3",
        "STEP",
    ]


def test_messages_go_with_the_input_gradient_and_none_with_w() -> None:
    for s in range(3):
        actions = stage_actions("zbh1", 3, 5, s)
        for pos, a in enumerate(actions):
            if a.op is BI and s < 2:
                assert Action(Op.RECV_GRAD, a.microbatch, s) in actions[:pos]
            if a.op is BI and s > 0:
                assert actions[pos + 1] == Action(Op.SEND_GRAD, a.microbatch, s)
            if a.op is W:
                assert actions[pos + 1].op not in (Op.SEND_GRAD, Op.SEND_ACT)


def _custom(per_stage: list[Action]) -> ScheduleFn:
    def schedule(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
        return [*per_stage, Action(Op.OPTIMIZER_STEP)]

    return schedule


@pytest.mark.parametrize(
    "actions,match",
    [
        ([Action(F, 0, 0), Action(W, 0, 0), Action(BI, 0, 0)], "without its BACKWARD_INPUT"),
        ([Action(F, 0, 0), Action(BI, 0, 0)], "never finish"),
        ([Action(F, 0, 0), Action(BI, 0, 0), Action(W, 0, 0), Action(W, 0, 0)], "computed twice"),
        ([Action(F, 0, 0), Action(B, 0, 0), Action(W, 0, 0)], "without its BACKWARD_INPUT"),
        ([Action(F, 0, 0), Action(BI, 0, 0), Action(B, 0, 0)], "back-propagated twice"),
        ([Action(BI, 0, 0), Action(F, 0, 0), Action(W, 0, 0)], "before its forward"),
    ],
)
def test_malformed_split_lists_are_rejected(actions: list[Action], match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        validate(_custom(actions), 1, 1)


def test_a_split_list_may_mix_with_fused_backwards() -> None:
    mixed = [Action(F, 0, 0), Action(F, 1, 0), Action(BI, 0, 0), Action(B, 1, 0), Action(W, 0, 0)]
    validate(_custom(mixed), 1, 2)


@pytest.mark.parametrize("n_stages,n_microbatches", [s for s in SHAPES if s[0] > 1])
def test_simulated_bubble_is_two_thirds_of_1f1b_with_equal_costs(
    n_stages: int, n_microbatches: int
) -> None:
    stages = [StageCost(1.0, 2.0, activation_bytes=10)] * n_stages  # F = BI = W = 1
    zb, base = simulate("zbh1", stages, n_microbatches), simulate("1f1b", stages, n_microbatches)
    assert zb.iteration_s == pytest.approx(3 * n_microbatches + 2 * (n_stages - 1))
    assert base.iteration_s == pytest.approx(3 * (n_microbatches + n_stages - 1))
    assert zb.bubble_fraction < base.bubble_fraction
    assert sum(zb.idle_s) == pytest.approx(sum(base.idle_s) * 2 / 3)
    assert zb.busy_s == pytest.approx(base.busy_s)
    assert zb.peak_in_flight == base.peak_in_flight
    assert zb.peak_activation_bytes == base.peak_activation_bytes


def test_w_takes_weight_s_and_bi_the_rest() -> None:
    r = simulate("zbh1", [StageCost(1.0, 3.0, weight_s=0.5)] * 2, 2)
    spans = {(e.stage, e.action.label): e.end_s - e.start_s for e in r.events}
    assert spans[1, "BI0"] == pytest.approx(2.5) and spans[1, "W0"] == pytest.approx(0.5)
    assert spans[0, "B0"] == pytest.approx(3.0)  # the first stage's backward is whole
    assert StageCost(1.0, 3.0).split_weight_s == 1.5  # unset: half of the backward
    with pytest.raises(ValueError, match="weight_s"):
        StageCost(1.0, 1.0, weight_s=2.0)


def test_chrome_trace_shows_input_and_weight_backwards() -> None:
    r = simulate("zbh1", [StageCost(1e-3, 2e-3)] * 2, 4)
    xs = [ev for ev in to_chrome_trace(r)["traceEvents"] if ev["ph"] == "X"]
    assert {ev["cat"] for ev in xs} == {"forward", "backward", "weight", "optimizer"}
    assert sorted(ev["name"] for ev in xs if ev["cat"] == "weight" and ev["tid"] == 1) == [
        "W0",
        "W1",
        "W2",
        "W3",
    ]
    assert any(ev["name"] == "BI3" and ev["cat"] == "backward" for ev in xs)


def _costs(n: int) -> list[LayerCost]:
    return [
        LayerCost(
            f"l{i}",
            1.0 + i % 3,
            2.0 + i % 2,
            activation_bytes=100 + 10 * i,
            output_bytes=10,
            param_bytes=40,
            grad_bytes=40,
            optimizer_bytes=80,
        )
        for i in range(n)
    ]


def test_planned_memory_equals_1f1b_and_time_is_shorter() -> None:
    costs = _costs(8)
    zb = evaluate(costs, [3, 2, 3], schedule="zbh1", n_microbatches=6)
    base = evaluate(costs, [3, 2, 3], schedule="1f1b", n_microbatches=6)
    assert zb.schedule == "zbh1"
    assert zb.predicted_stage_bytes == base.predicted_stage_bytes
    assert zb.predicted_iteration_s < base.predicted_iteration_s
    for name in ("time", "memory"):
        budget = max(base.predicted_stage_bytes)
        plan = get_planner(name).plan(
            costs, 3, schedule="zbh1", n_microbatches=6, memory_budget=budget
        )
        assert plan.schedule == "zbh1" and max(plan.predicted_stage_bytes) <= budget


def test_recomputed_layers_leave_w_nothing() -> None:
    costs = _costs(4)
    stages = stage_costs(costs, [2, 2], ["keep", "recompute", "keep", "keep"])
    assert stages[0].weight_s == pytest.approx(costs[0].backward_s / 2)
    assert stages[1].weight_s == pytest.approx((costs[2].backward_s + costs[3].backward_s) / 2)
    assert stages[0].backward_s == pytest.approx(
        costs[0].backward_s + costs[1].backward_s + costs[1].recompute_time
    )
