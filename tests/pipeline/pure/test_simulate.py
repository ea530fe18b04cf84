"""The schedule simulator against closed forms, and its Chrome trace."""

from __future__ import annotations

import json

import pytest

from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.schedule import Action, Op, ScheduleError
from pipeline.pure.simulate import StageCost, simulate, stage_costs, to_chrome_trace

SHAPES = [(1, 1), (2, 1), (2, 4), (4, 8), (4, 3), (6, 12), (3, 1)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("n_stages,n_microbatches", SHAPES)
def test_uniform_stages_match_the_closed_form(
    schedule: str, n_stages: int, n_microbatches: int
) -> None:
    f, b = 1.0, 2.0
    r = simulate(schedule, [StageCost(f, b, activation_bytes=10)] * n_stages, n_microbatches)
    assert r.iteration_s == pytest.approx((n_microbatches + n_stages - 1) * (f + b))
    assert r.bubble_fraction == pytest.approx((n_stages - 1) / (n_microbatches + n_stages - 1))
    assert r.busy_s == pytest.approx([n_microbatches * (f + b)] * n_stages)
    assert sum(r.idle_s) == pytest.approx(r.bubble_fraction * n_stages * r.iteration_s)


@pytest.mark.parametrize("n_stages,n_microbatches", SHAPES)
def test_peak_in_flight(n_stages: int, n_microbatches: int) -> None:
    stages = [StageCost(1.0, 2.0, activation_bytes=7)] * n_stages
    gpipe = simulate("gpipe", stages, n_microbatches)
    one_f_one_b = simulate("1f1b", stages, n_microbatches)
    assert gpipe.peak_in_flight == (n_microbatches,) * n_stages
    expected = tuple(min(n_stages - s, n_microbatches) for s in range(n_stages))
    assert one_f_one_b.peak_in_flight == expected
    assert one_f_one_b.peak_activation_bytes == tuple(7 * k for k in expected)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_link_latency_and_bandwidth_on_two_stages(schedule: str) -> None:
    f, b, latency = 1.0, 2.0, 0.25
    link = LinkCost(bandwidth_bytes_per_s=100.0, latency_s=latency)
    stages = [StageCost(f, b, output_bytes=50), StageCost(f, b, output_bytes=0)]
    per_message = latency + 50 / 100.0
    # one micro-batch: forward, activation across, forward+backward, gradient back, backward
    one = simulate(schedule, stages, 1, link)
    assert one.iteration_s == pytest.approx(2 * (f + b) + 2 * per_message)
    if schedule == "gpipe":  # the link delays the pipeline once each way
        r = simulate(schedule, stages, 4, link)
        assert r.iteration_s == pytest.approx(5 * (f + b) + 2 * per_message)


def test_optimizer_step_waits_for_sends_and_takes_its_time() -> None:
    link = LinkCost(1.0, 3.0)
    stages = [StageCost(1.0, 1.0, optimizer_s=0.5), StageCost(1.0, 1.0, optimizer_s=0.5)]
    r = simulate("gpipe", stages, 1, link)
    steps = {e.stage: e for e in r.events if e.action.op is Op.OPTIMIZER_STEP}
    assert len(steps) == 2
    # stage 1 sent its last gradient at t=1+3+2=6; it arrives at 9, then the step runs
    assert (steps[1].start_s, steps[1].end_s) == pytest.approx((9.0, 9.5))
    # stage 0 back-propagates from 9 to 10, then steps (it sent nothing it waits for)
    assert (steps[0].start_s, steps[0].end_s) == pytest.approx((10.0, 10.5))
    assert r.iteration_s == pytest.approx(10.5)


def test_uneven_stages_set_the_pace() -> None:
    r = simulate("1f1b", [StageCost(1, 1), StageCost(3, 3), StageCost(1, 1)], 8)
    assert r.iteration_s >= 8 * 6  # the slow stage is busy 8 x 6 s
    assert r.busy_s[1] == pytest.approx(48)
    assert r.idle_s[1] == pytest.approx(r.iteration_s - 48)


def test_events_and_chrome_trace() -> None:
    n_stages, m = 3, 4
    r = simulate("1f1b", [StageCost(1e-3, 2e-3)] * n_stages, m)
    compute = [e for e in r.events if e.action.op in (Op.FORWARD, Op.BACKWARD)]
    assert len(compute) == 2 * n_stages * m
    for e in r.events:
        assert e.end_s >= e.start_s
    trace = to_chrome_trace(r)
    json.dumps(trace)  # serialisable
    xs = [ev for ev in trace["traceEvents"] if ev["ph"] == "X"]
    assert len([ev for ev in xs if ev["cat"] in ("forward", "backward")]) == 2 * n_stages * m
    assert {ev["tid"] for ev in xs} == set(range(n_stages))  # one row per stage
    rows = {
        ev["tid"]: ev["args"]["name"] for ev in trace["traceEvents"] if ev["name"] == "thread_name"
    }
    assert rows == {s: f"stage {s}" for s in range(n_stages)}
    f0 = next(ev for ev in xs if ev["name"] == "F0" and ev["tid"] == 1)
    assert f0["ts"] == pytest.approx(1e3) and f0["dur"] == pytest.approx(1e3)  # microseconds
    assert trace["otherData"] == {
        "schedule": "1f1b",
        "n_microbatches": m,
        "iteration_s": r.iteration_s,
        "bubble_fraction": r.bubble_fraction,
    }


def test_a_deadlocking_schedule_is_reported() -> None:
    def crossed(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
        # stage 0 waits for micro-batch 0's gradient before it forwards micro-batch 1,
        # stage 1 waits for micro-batch 1's forward before it back-propagates micro-batch 0
        order = ["F0", "B0", "F1", "B1"] if stage == 0 else ["F0", "F1", "B0", "B1"]
        ops = {"F": Op.FORWARD, "B": Op.BACKWARD}
        return [*(Action(ops[a[0]], int(a[1]), stage) for a in order), Action(Op.OPTIMIZER_STEP)]

    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(crossed, [StageCost(1, 1)] * 2, 2)


def test_stage_costs_from_layers_and_actions() -> None:
    costs = [
        LayerCost(
            f"l{i}",
            1.0,
            2.0,
            activation_bytes=100,
            output_bytes=10 * (i + 1),
            param_bytes=4,
            grad_bytes=4,
            optimizer_bytes=8,
            recompute_s=0.5,
        )
        for i in range(4)
    ]
    stages = stage_costs(costs, [1, 3], ["keep", "recompute", "keep", "keep"], weight_copies=2)
    assert stages[0] == StageCost(
        1.0, 2.0, activation_bytes=100, output_bytes=10, state_bytes=20, weight_s=1.0
    )
    # layer 1 recomputed: +0.5 s in the backward, keeps its input (layer 0's 10 bytes); a
    # split backward runs all of its backward in BI, so W is half of the kept layers' only
    assert stages[1] == StageCost(
        3.0, 6.5, activation_bytes=210, output_bytes=40, state_bytes=60, weight_s=2.0
    )
    with pytest.raises(ValueError, match="partition"):
        stage_costs(costs, [1, 2])
