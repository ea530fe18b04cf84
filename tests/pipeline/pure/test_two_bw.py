"""PipeDream-2BW as data: stream lists, their checks, simulation, planning, traces."""

from __future__ import annotations

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import evaluate
from pipeline.pure.schedule import (
    SCHEDULES,
    Action,
    Op,
    ScheduleError,
    in_flight,
    is_stream,
    one_f_one_b,
    pipedream_2bw,
    stage_actions,
    validate,
)
from pipeline.pure.simulate import StageCost, simulate, to_chrome_trace
from pipeline.pure.two_bw import check_2bw, stream_actions


def test_registered_as_a_stream() -> None:
    assert SCHEDULES["2bw"] is pipedream_2bw and is_stream("2bw") and not is_stream("1f1b")
    assert pipedream_2bw.weight_copies == 2


@pytest.mark.parametrize("n_stages", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("n_steps", [1, 2, 3, 7])
def test_streams_are_valid_and_keep_1f1b_in_flight(n_stages: int, n_steps: int) -> None:
    for m in range(max(1, n_stages - 1), 10):
        validate("2bw", n_stages, m, n_steps)
        for s in range(n_stages):
            actions = pipedream_2bw(n_stages, m, s, n_steps)
            assert in_flight(actions) == min(n_stages - s, m * n_steps)
            steps = [a.step for a in actions if a.op is Op.OPTIMIZER_STEP]
            assert steps == list(range(n_steps))
            if n_steps == 1:  # one step is 1F1B
                assert actions[:-1] == one_f_one_b(n_stages, m, s)[:-1]


def test_no_flush_between_steps() -> None:
    """Stage 0 of 2 runs step 1's first forward before step 0's last backward."""
    actions = pipedream_2bw(2, 2, 0, 2)
    assert actions == [
        Action(Op.FORWARD, 0, 0),
        Action(Op.FORWARD, 1, 0),
        Action(Op.BACKWARD, 0, 0),
        Action(Op.FORWARD, 2, 0),
        Action(Op.BACKWARD, 1, 0),
        Action(Op.OPTIMIZER_STEP, step=0),
        Action(Op.FORWARD, 3, 0),
        Action(Op.BACKWARD, 2, 0),
        Action(Op.BACKWARD, 3, 0),
        Action(Op.OPTIMIZER_STEP, step=1),
    ]
    lowered = stage_actions("2bw", 2, 2, 1, n_steps=2)
    assert Action(Op.SEND_GRAD, 3, 1) in lowered


def test_lazy_lists_ask_for_steps_in_order_and_only_when_needed() -> None:
    asked: list[int] = []

    def has_step(t: int) -> bool:
        asked.append(t)
        return t < 3

    actions = list(stream_actions(3, 4, 0, has_step))
    assert asked == [0, 1, 2, 3] and actions == pipedream_2bw(3, 4, 0, 3)


def test_two_versions_need_enough_micro_batches() -> None:
    with pytest.raises(ValueError, match="n_microbatches >= n_stages - 1"):
        check_2bw(4, 2)
    with pytest.raises(ScheduleError, match="before STEP"):
        validate("2bw", 5, 2, n_steps=4)
    with pytest.raises(ValueError, match="has a flush"):
        stage_actions("1f1b", 2, 2, 0, n_steps=2)


@pytest.mark.parametrize("n_stages,m", [(2, 4), (4, 8), (3, 2)])
def test_the_steady_step_has_no_bubble(n_stages: int, m: int) -> None:
    f, b = 1.0, 2.0
    stages = [StageCost(f, b)] * n_stages
    stream = simulate("2bw", stages, m, n_steps=6)
    assert stream.step_s == pytest.approx(m * (f + b))
    flushed = simulate("1f1b", stages, m)
    assert flushed.step_s == flushed.iteration_s == pytest.approx((m + n_stages - 1) * (f + b))
    trace = to_chrome_trace(stream)
    names = {e["name"] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert f"F{6 * m - 1}" in names and "STEP5" in names


def test_the_planner_counts_the_second_weight_copy() -> None:
    costs = [
        LayerCost(
            f"l{i}",
            1.0,
            2.0,
            activation_bytes=100,
            output_bytes=10,
            param_bytes=1000,
            grad_bytes=1000,
            optimizer_bytes=2000,
        )
        for i in range(4)
    ]
    two = evaluate(costs, [2, 2], schedule="2bw", n_microbatches=4)
    one = evaluate(costs, [2, 2], schedule="1f1b", n_microbatches=4)
    assert [
        a - b for a, b in zip(two.predicted_stage_bytes, one.predicted_stage_bytes, strict=True)
    ] == [2000, 2000]
    assert two.predicted_iteration_s == pytest.approx(4 * 6.0)
    assert one.predicted_iteration_s == pytest.approx(5 * 6.0)


def test_only_an_optimizer_step_closes_a_step() -> None:
    assert repr(Action(Op.OPTIMIZER_STEP, step=3)) == "STEP3"
    with pytest.raises(ValueError, match="an OPTIMIZER_STEP names no micro-batch or stage"):
        Action(Op.OPTIMIZER_STEP, 0)
    with pytest.raises(ValueError, match="FORWARD needs a stage >= 0, got None"):
        Action(Op.FORWARD, 0)
    with pytest.raises(ValueError, match="BACKWARD needs a microbatch >= 0, got -1"):
        Action(Op.BACKWARD, -1, 0)
    with pytest.raises(ValueError, match="only an OPTIMIZER_STEP closes a step, not FORWARD"):
        Action(Op.FORWARD, 0, 0, step=0)
