"""The simulator with several stages per rank: shared compute, local hand-overs, the
bubbles against their closed forms, memory per rank, and the trace's lanes.

Equal costs, a model of forward f and backward b per micro-batch cut into S = v * R equal
stages (f / v and b / v each; a split backward's W half of it):

    1F1B, S = R            iteration M (f + b) + (R - 1)(f + b)       bubble (R-1)/(M+R-1)
    interleaved, v chunks  iteration M (f + b) + (R - 1)(f + b) / v   over ideal (R-1)/(v M)
    ZB-V, v = 2, M >= 2R-1 iteration M (f + b) + (R - 1) f / 2        (b = 2f: F = B = W)
"""

from __future__ import annotations

import itertools
import json

import pytest

from pipeline.pure.actions import Op
from pipeline.pure.costs import LinkCost
from pipeline.pure.schedule import get_schedule, placement_of
from pipeline.pure.simulate import StageCost, simulate, to_chrome_trace

f, b = 1.0, 2.0  # the whole model's forward and backward per micro-batch


def chunks(n_ranks: int, v: int, activation_bytes: int = 0) -> list[StageCost]:
    return [StageCost(f / v, b / v, activation_bytes=activation_bytes)] * (v * n_ranks)


SHAPES = [(4, m) for m in (8, 16, 32)] + [(8, m) for m in (8, 16, 32)]  # S = 8 and 16


@pytest.mark.parametrize("n_ranks,m", SHAPES)
def test_1f1b_interleaved_and_zbv_against_their_formulas(n_ranks: int, m: int) -> None:
    R, ideal = n_ranks, m * (f + b)
    one = simulate("1f1b", [StageCost(f, b)] * R, m)
    assert one.bubble_fraction == pytest.approx((R - 1) / (m + R - 1))
    inter = simulate("interleaved_1f1b", chunks(R, 2), m)  # S = 2R stages
    assert inter.n_stages == 2 * R and inter.n_ranks == R
    assert inter.iteration_s == pytest.approx(ideal + (R - 1) * (f + b) / 2)
    assert inter.iteration_s / ideal - 1 == pytest.approx((R - 1) / (2 * m))  # Megatron's
    assert inter.bubble_fraction == pytest.approx((R - 1) / (2 * m + R - 1))
    zb = simulate("zbv", chunks(R, 2), m)
    if m >= 2 * R - 1:  # the V is full: only the ramp of R - 1 chunk forwards is left
        assert zb.iteration_s == pytest.approx(ideal + (R - 1) * f / 2)
    assert zb.bubble_fraction < inter.bubble_fraction < one.bubble_fraction


@pytest.mark.parametrize("n_ranks,m", [(2, 4), (3, 7), (4, 10), (4, 6)])
def test_interleaved_reaches_megatrons_bubble_for_any_m_from_r(n_ranks: int, m: int) -> None:
    for v in (2, 3):
        r = simulate(get_schedule("interleaved_1f1b", v), chunks(n_ranks, v), m)
        assert r.iteration_s / (m * (f + b)) - 1 == pytest.approx((n_ranks - 1) / (v * m))


def test_the_exact_figures_for_s8_on_4_ranks_and_s16_on_8() -> None:
    """The numbers the report quotes (bubble fraction of the step)."""
    got = {
        (name, R, m): round(
            simulate(
                name, chunks(R, 2) if name != "1f1b" else [StageCost(f, b)] * R, m
            ).bubble_fraction,
            4,
        )
        for name in ("1f1b", "interleaved_1f1b", "zbv")
        for R in (4, 8)
        for m in (8, 16, 32)
    }
    assert got == {
        ("1f1b", 4, 8): 0.2727,
        ("1f1b", 4, 16): 0.1579,
        ("1f1b", 4, 32): 0.0857,
        ("1f1b", 8, 8): 0.4667,
        ("1f1b", 8, 16): 0.3043,
        ("1f1b", 8, 32): 0.1795,
        ("interleaved_1f1b", 4, 8): 0.1579,
        ("interleaved_1f1b", 4, 16): 0.0857,
        ("interleaved_1f1b", 4, 32): 0.0448,
        ("interleaved_1f1b", 8, 8): 0.3043,
        ("interleaved_1f1b", 8, 16): 0.1795,
        ("interleaved_1f1b", 8, 32): 0.0986,
        ("zbv", 4, 8): 0.0588,
        ("zbv", 4, 16): 0.0303,
        ("zbv", 4, 32): 0.0154,
        ("zbv", 8, 8): 0.2258,
        ("zbv", 8, 16): 0.068,
        ("zbv", 8, 32): 0.0352,
    }


@pytest.mark.parametrize("n_ranks,m", [(2, 8), (4, 8), (4, 16), (8, 16)])
def test_memory_per_rank(n_ranks: int, m: int) -> None:
    """ZB-V holds 1F1B's peak (its first stage's R micro-batches of the whole stage: 2R of
    half a stage) on every rank; interleaved holds more on its first rank."""
    one = simulate("1f1b", [StageCost(f, b, activation_bytes=2)] * n_ranks, m)
    zb = simulate("zbv", chunks(n_ranks, 2, activation_bytes=1), m)
    inter = simulate("interleaved_1f1b", chunks(n_ranks, 2, activation_bytes=1), m)
    assert one.peak_rank_activation_bytes[0] == 2 * n_ranks
    assert zb.peak_rank_activation_bytes == (2 * n_ranks,) * n_ranks
    assert inter.peak_rank_activation_bytes[0] > one.peak_rank_activation_bytes[0]
    for r in (zb, inter):  # a rank's peak is at most the sum of its stages' peaks
        placement = placement_of(r.schedule, n_ranks)
        for rank in range(n_ranks):
            stages = placement.stages_of(rank)
            assert r.peak_rank_activation_bytes[rank] <= sum(
                r.peak_activation_bytes[s] for s in stages
            )


@pytest.mark.parametrize("name", ["interleaved_1f1b", "zbv"])
def test_stages_of_a_rank_share_its_time(name: str) -> None:
    n_ranks, m = 3, 6
    r = simulate(name, chunks(n_ranks, 2), m)
    placement = placement_of(name, n_ranks)
    for rank in range(n_ranks):
        spans = sorted((e.start_s, e.end_s) for e in r.events if r.ranks[e.stage] == rank)
        assert all(a[1] <= b_[0] + 1e-12 for a, b_ in itertools.pairwise(spans))
        stages = placement.stages_of(rank)
        assert r.rank_busy_s[rank] == pytest.approx(sum(r.busy_s[s] for s in stages))
        assert r.rank_busy_s[rank] == pytest.approx(m * (f + b))
    assert r.bubble_fraction == pytest.approx(sum(r.rank_idle_s) / (n_ranks * r.iteration_s))


def test_a_hand_over_inside_a_rank_takes_no_link_time() -> None:
    link = LinkCost(bandwidth_bytes_per_s=1e9, latency_s=5.0)
    stages = [StageCost(1.0, 2.0, output_bytes=1)] * 4  # zbv, 2 ranks: 0 -> 1 -> 2 -> 3
    r = simulate("zbv", stages, 1, link)
    start = {(e.stage, e.action.op): e for e in r.events if e.action.microbatch == 0}
    # stage 0 -> 1 crosses ranks (5 s), stage 1 -> 2 stays on rank 1 (no wait)
    assert start[(1, Op.FORWARD)].start_s == pytest.approx(start[(0, Op.FORWARD)].end_s + 5.0)
    assert start[(2, Op.FORWARD)].start_s == pytest.approx(start[(1, Op.FORWARD)].end_s)


def test_per_stage_costs_and_the_optimizer_step_of_a_rank() -> None:
    slow = [StageCost(0.5, 1.0, optimizer_s=0.25)] * 8
    slow[5] = StageCost(1.5, 3.0, optimizer_s=0.25)  # stage 5 lives on rank 1 (loop, R = 4)
    r = simulate("interleaved_1f1b", slow, 8)
    assert r.busy_s[5] == pytest.approx(8 * 4.5)
    assert r.rank_busy_s[1] == pytest.approx(8 * 1.5 + 8 * 4.5 + 0.5)  # two steps of 0.25
    steps = [e for e in r.events if e.action.op is Op.OPTIMIZER_STEP]
    assert sorted(e.stage for e in steps) == [0, 1, 2, 3]  # on each rank's first stage
    assert all(e.end_s - e.start_s == pytest.approx(0.5) for e in steps)


def test_stage_costs_must_fill_the_ranks() -> None:
    with pytest.raises(ValueError, match=r"'zbv' places 2 stages on each rank.*got 5"):
        simulate("zbv", [StageCost(1.0, 1.0)] * 5, 4)


def test_the_trace_has_a_lane_per_stage_grouped_by_rank() -> None:
    n_ranks, m = 2, 3
    r = simulate("zbv", chunks(n_ranks, 2), m)
    trace = to_chrome_trace(r, "zbv")
    json.dumps(trace)
    meta = [ev for ev in trace["traceEvents"] if ev["ph"] == "M"]
    processes = {ev["pid"]: ev["args"]["name"] for ev in meta if ev["name"] == "process_name"}
    assert processes == {0: "zbv: rank 0", 1: "zbv: rank 1"}
    lanes = {
        (ev["pid"], ev["tid"]): ev["args"]["name"] for ev in meta if ev["name"] == "thread_name"
    }
    assert lanes == {(0, 0): "stage 0", (0, 3): "stage 3", (1, 1): "stage 1", (1, 2): "stage 2"}
    xs = [ev for ev in trace["traceEvents"] if ev["ph"] == "X"]
    assert all((ev["pid"], ev["tid"]) in lanes for ev in xs)
    forwards = [ev for ev in xs if ev["cat"] == "forward"]
    assert len(forwards) == 4 * m and {ev["name"] for ev in forwards} == {"F0", "F1", "F2"}
    assert trace["otherData"]["schedule"] == "zbv"
