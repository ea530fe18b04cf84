"""`pipeline.pure.planner.tryout`: the plans the cost model cannot rank are tried, the
fastest measured is kept, and what each one measured corrects the next predictions."""

from __future__ import annotations

import math

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import choose_schedule, get_planner
from pipeline.pure.planner.base import Plan
from pipeline.pure.planner.tryout import (
    CHALLENGE_ERROR,
    FLOOR,
    KEEP,
    UNKNOWN,
    Contender,
    Move,
    PredictionErrors,
    Tryout,
    challenge_error,
    contenders,
    neighbouring_cuts,
    rivals,
)


def plan(schedule: str, predicted_s: float, sizes: tuple[int, ...] = (2, 2)) -> Plan:
    return Plan(
        sizes=sizes,
        actions=("keep",) * sum(sizes),
        schedule=schedule,
        n_microbatches=4,
        predicted_iteration_s=predicted_s,
        predicted_stage_s=(predicted_s / 8,) * len(sizes),
        predicted_stage_bytes=(1,) * len(sizes),
    )


def test_errors_correct_each_schedules_bias_and_learn_their_spread() -> None:
    errors = PredictionErrors()
    assert errors.error == UNKNOWN and errors.bias("zbv") == 1.0
    errors.learn(plan("zbv", 2.0), 2.16)  # 8% slow
    errors.learn(plan("zbv", 1.0), 1.08)
    errors.learn(plan("1f1b", 2.0), 1.9)  # 5% fast
    assert errors.bias("zbv") == pytest.approx(1.08) and errors.bias("1f1b") == pytest.approx(0.95)
    assert errors.corrected(plan("zbv", 1.98)) == pytest.approx(1.98 * 1.08)
    assert errors.error == FLOOR  # every ratio at its schedule's median: only the floor
    errors.learn(plan("1f1b", 1.0), 1.15)  # now 1f1b's plans spread
    assert errors.error == pytest.approx(abs(1.15 / errors.bias("1f1b") - 1))
    errors.learn(plan("1f1b", 1.0), math.nan)  # nothing measured: nothing learned
    assert PredictionErrors.from_dict(errors.to_dict()).to_dict() == errors.to_dict()
    for _ in range(2 * KEEP):
        errors.learn(plan("gpipe", 1.0), 1.0)
    assert len(errors.to_dict()["gpipe"]) == KEEP


def test_contenders_are_the_plans_within_the_error_of_the_best_corrected() -> None:
    errors = PredictionErrors({"zbv": [1.08, 1.08], "1f1b": [0.95, 0.95]})  # error: FLOOR
    plans = [plan("zbv", 1.98), plan("1f1b", 2.0), plan("zbh1", 2.2), plan("gpipe", 3.0)]
    chosen = contenders(plans, errors, most=3)
    # corrected: 1f1b 1.90, zbv 2.14, zbh1 2.20, gpipe 3.00; within 3% of 1.90: 1f1b alone
    assert [c.schedule for c in chosen] == ["1f1b"]
    unsure = PredictionErrors()  # nothing learned: within 15% of the best
    assert [c.schedule for c in contenders(plans, unsure, most=3)] == ["zbv", "1f1b", "zbh1"]
    assert [c.schedule for c in contenders(plans, unsure, most=2)] == ["zbv", "1f1b"]
    assert contenders([], unsure, most=2) == []
    with pytest.raises(ValueError, match="most must be >= 1"):
        contenders(plans, unsure, most=0)


def test_a_tryout_measures_each_after_its_warmup_and_keeps_the_fastest() -> None:
    tried = [Contender(plan("zbv", 1.98), 1.98), Contender(plan("1f1b", 2.0), 2.0)]
    tryout = Tryout(tried, warmup=1, steps=3)
    moves = [tryout.stepped(s) for s in (9.0, 2.1, 2.2, 2.14)]  # zbv: warm-up, then 3
    assert moves == [Move.STAY, Move.STAY, Move.STAY, Move.SWITCH]
    assert tryout.current.schedule == "1f1b" and not tryout.done
    moves = [tryout.stepped(s) for s in (5.0, 1.8, 1.85, 1.83)]
    assert moves == [Move.STAY, Move.STAY, Move.STAY, Move.KEEP]
    assert tryout.done and tryout.current.schedule == "1f1b"  # the fastest, ran last
    assert tryout.ran_last is tryout.current  # nothing to switch back to
    assert [m for _, m in tryout.results()] == [2.14, 1.83]
    assert tryout.stepped(1.0) == Move.STAY  # over: nothing more
    record = tryout.to_dict()
    assert record["kept"] == "1f1b" and [t["measured_s"] for t in record["tried"]] == [2.14, 1.83]
    assert record["kept_sizes"] == [2, 2]


def test_a_tryout_switches_back_to_an_earlier_contender_that_was_faster() -> None:
    tried = [Contender(plan(s, 1.0), 1.0) for s in ("zbv", "1f1b", "zbh1")]
    tryout = Tryout(tried, warmup=0, steps=1)
    assert [tryout.stepped(s) for s in (1.0, 2.0, 3.0)] == [Move.SWITCH, Move.SWITCH, Move.KEEP]
    assert tryout.current.schedule == "zbv" and tryout.ran_last.schedule == "zbh1"


def test_a_tryout_in_rounds_visits_each_in_turn_and_weighs_every_step() -> None:
    """A B A B: a slow spell in A's first visit does not lose it the tryout."""
    tried = [Contender(plan(s, 1.0), 1.0) for s in ("zbh1", "1f1b")]
    tryout = Tryout(tried, warmup=1, steps=2, rounds=2)
    visits = [
        ("zbh1", (5.0, 1.22, 1.23)),  # warm-up, then a slow spell of the machine
        ("1f1b", (5.0, 1.10, 1.11)),
        ("zbh1", (5.0, 0.95, 0.96)),  # the spell is over
        ("1f1b", (5.0, 1.10, 1.12)),
    ]
    moves = []
    for schedule, seconds in visits:
        assert tryout.current.schedule == schedule and not tryout.done
        moves += [tryout.stepped(s) for s in seconds]
    assert moves == [Move.STAY] * 2 + [Move.SWITCH] + [Move.STAY] * 2 + [Move.SWITCH] + [
        Move.STAY
    ] * 2 + [Move.SWITCH] + [Move.STAY] * 2 + [Move.KEEP]
    assert [m for _, m in tryout.results()] == [(0.96 + 1.22) / 2, (1.10 + 1.11) / 2]  # of 4
    assert tryout.done and tryout.current.schedule == "zbh1"  # switched back to
    assert tryout.ran_last.schedule == "1f1b"
    one_round = Tryout(tried, warmup=1, steps=2)  # its first visit alone: zbh1 looks slower
    for s in (5.0, 1.22, 1.23, 5.0, 1.10, 1.11):
        one_round.stepped(s)
    assert one_round.done and one_round.current.schedule == "1f1b"


def test_a_tryout_goes_on_while_the_fastest_has_not_beaten_another_in_every_round() -> None:
    """Three plans 5% apart on a noisy machine: after the least 2 rounds 1f1b leads; it beat
    zbv in both rounds but zbh1 only in the first (zbh1's slow spell), so the next rounds
    visit zbh1 and 1f1b only, up to the most (4); the fastest over all its steps is kept."""
    tried = [Contender(plan(s, 1.0), 1.0) for s in ("zbv", "zbh1", "1f1b")]
    tryout = Tryout(tried, warmup=0, steps=1, rounds=2, most_rounds=4)
    visits = [
        *[("zbv", 1.10), ("zbh1", 1.30), ("1f1b", 1.00)],  # round 1: zbh1 in a slow spell
        *[("zbv", 1.20), ("zbh1", 0.90), ("1f1b", 1.05)],  # round 2
        *[("zbh1", 0.85), ("1f1b", 1.02)],  # round 3: zbh1 leads, still lost round 1
        *[("zbh1", 0.88), ("1f1b", 1.01)],  # round 4: the most
    ]
    moves = []
    for schedule, seconds in visits:
        assert tryout.current.schedule == schedule and not tryout.done
        moves.append(tryout.stepped(seconds))
    assert moves == [Move.SWITCH] * 9 + [Move.KEEP]
    assert tryout.rounds_run == 4 and tryout.current.schedule == "zbh1"
    assert tryout.ran_last.schedule == "1f1b"  # switched back to zbh1
    record = tryout.to_dict()
    assert record["rounds"] == 4
    assert [len(t["visits_s"]) for t in record["tried"]] == [2, 4, 4]


def test_a_tryout_whose_fastest_beat_every_other_in_every_round_stops_at_the_least() -> None:
    tried = [Contender(plan(s, 1.0), 1.0) for s in ("zbv", "1f1b")]
    tryout = Tryout(tried, warmup=1, steps=2, rounds=2, most_rounds=4)
    for seconds in (5.0, 1.2, 1.3, 5.0, 1.0, 1.1, 5.0, 1.25, 1.2, 5.0, 1.05, 1.0):
        move = tryout.stepped(seconds)
    assert move == Move.KEEP and tryout.rounds_run == 2 and tryout.current.schedule == "1f1b"


def test_a_tryout_needs_two_contenders_and_sane_counts() -> None:
    one = [Contender(plan("zbv", 1.0), 1.0)]
    with pytest.raises(ValueError, match="at least 2 contenders"):
        Tryout(one)
    with pytest.raises(ValueError, match="warmup must be >= 0, steps and rounds >= 1"):
        Tryout(one * 2, steps=0)
    with pytest.raises(ValueError, match="warmup must be >= 0, steps and rounds >= 1"):
        Tryout(one * 2, rounds=0)
    with pytest.raises(ValueError, match=r"most_rounds must be >= rounds \(2\), got 1"):
        Tryout(one * 2, rounds=2, most_rounds=1)


def test_the_auto_schedules_plans_feed_the_contenders() -> None:
    """`choose_schedule`'s candidates are what a tryout chooses among: here equal layers,
    where every exact schedule's prediction is close."""
    costs = [LayerCost(f"l{i}", 0.01, 0.02, 1000, 1000) for i in range(8)]
    best, tried = choose_schedule(get_planner("time"), costs, 2, n_microbatches=4)
    plans = [c.plan for c in tried if c.plan is not None]
    chosen = contenders(plans, PredictionErrors(), most=4)
    assert chosen[0].plan == best.plan
    assert all(c.corrected_s <= chosen[0].corrected_s * (1 + UNKNOWN) for c in chosen)


def test_neighbouring_cuts_move_each_boundary_one_layer_either_way() -> None:
    assert neighbouring_cuts((7, 3)) == [(8, 2), (6, 4)]
    assert neighbouring_cuts((1, 3, 5, 1)) == [
        (2, 2, 5, 1),
        (1, 4, 4, 1),
        (1, 2, 6, 1),
        (1, 3, 4, 2),
    ]
    assert neighbouring_cuts((1, 1)) == []  # no stage is left empty
    assert neighbouring_cuts((4,)) == []  # one stage: no boundary
    for sizes in [(7, 3), (1, 3, 5, 1), (2, 2, 2)]:
        for cut in neighbouring_cuts(sizes):
            assert sum(cut) == sum(sizes) and min(cut) >= 1
            assert sum(abs(a - b) for a, b in zip(cut, sizes, strict=True)) == 2


def test_a_cut_one_layer_over_is_a_rival_the_plan_in_force_is_not() -> None:
    """The plan in force's own schedule on another cut is a rival like another schedule's
    plan; the same schedule on the same cut is the plan in force itself."""
    in_force = plan("zbh1", 0.906, (7, 3))
    near = [plan("zbh1", 0.95, (8, 2)), plan("zbh1", 1.2, (6, 4))]
    others = [plan("zbv", 0.924, (1, 4, 4, 1)), plan("zbh1", 0.9, (7, 3))]
    chosen = rivals(in_force, [*others, *near], error=0.1, most=4)
    # fastest 0.906 (its twin at 0.9 is left out); within 10%: zbv 0.924, [8, 2] 0.95
    assert [(c.schedule, c.plan.sizes) for c in chosen] == [
        ("zbh1", (7, 3)),
        ("zbv", (1, 4, 4, 1)),
        ("zbh1", (8, 2)),
    ]
    assert rivals(in_force, near, error=0.03, most=4) == []  # [8, 2] 5% behind: told apart


def test_each_schedules_fastest_rival_comes_before_a_schedules_second_plan() -> None:
    """Places are few: they go to every other schedule's fastest plan within the error, then
    to the other cuts; the chosen are listed fastest first (a language model at 8
    micro-batches: interleaved in force, ZB-V and ZB-H1 on two cuts ahead of 1F1B)."""
    in_force = plan("interleaved_1f1b", 0.84, (1, 3, 5, 1))
    others = [
        plan("zbv", 0.758, (1, 3, 5, 1)),
        plan("zbh1", 0.78, (7, 3)),
        plan("zbh1", 0.79, (8, 2)),
        plan("zbv", 0.80, (1, 2, 6, 1)),
        plan("1f1b", 0.86, (8, 2)),
        plan("interleaved_1f1b", 0.83, (1, 2, 6, 1)),
    ]
    chosen = rivals(in_force, others, error=0.2, most=4)
    assert [(c.schedule, c.plan.sizes) for c in chosen] == [
        ("interleaved_1f1b", (1, 3, 5, 1)),
        ("zbv", (1, 3, 5, 1)),
        ("zbh1", (7, 3)),
        ("1f1b", (8, 2)),
    ]
    # room for more: the rest fastest first, among the leads
    wider = rivals(in_force, others, error=0.2, most=6)
    assert [c.plan.predicted_iteration_s for c in wider[1:]] == [0.758, 0.78, 0.79, 0.80, 0.86]
    # 1f1b 13% behind: out at the least error, in at the plan in force's own miss
    assert "1f1b" not in {c.schedule for c in rivals(in_force, others, CHALLENGE_ERROR, 4)}


def test_the_challenge_error_is_at_least_the_plan_in_forces_own_miss() -> None:
    assert challenge_error(0.0, 1.01, 0.84) == pytest.approx(1.01 / 0.84 - 1)
    assert challenge_error(0.0, 0.80, 0.84) == CHALLENGE_ERROR  # 5% fast: the least
    assert challenge_error(0.0, 0.5, 1.0) == pytest.approx(0.5)  # fast counts as much as slow
    assert challenge_error(0.3, 1.01, 0.84) == 0.3  # the cache learned a larger one
    assert challenge_error(0.0, 0.0, 0.84) == CHALLENGE_ERROR  # nothing measured
    assert challenge_error(0.05, math.inf, 0.84) == CHALLENGE_ERROR
    assert challenge_error(0.0, 1.0, 0.0) == CHALLENGE_ERROR  # nothing predicted


def test_rivals_are_the_plan_in_force_and_the_others_it_cannot_be_told_from() -> None:
    """At a correction: the plan in force first, then other schedules' plans within the
    error of the fastest prediction (the plan in force's included), fastest first."""
    in_force = plan("interleaved_1f1b", 1.44, (1, 1, 7, 1))
    others = [plan("zbv", 1.50, (1, 1, 7, 1)), plan("zbh1", 1.10), plan("1f1b", 1.13)]
    chosen = rivals(in_force, others, error=0.15, most=3)
    # fastest 1.10; within 15%: zbh1 1.10, 1f1b 1.13 (zbv 1.50 is not); the plan in force
    # leads although it is predicted slower: it is what runs now
    assert [c.schedule for c in chosen] == ["interleaved_1f1b", "zbh1", "1f1b"]
    assert chosen[0].corrected_s == 1.44
    assert [c.schedule for c in rivals(in_force, others, error=0.15, most=2)] == [
        "interleaved_1f1b",
        "zbh1",
    ]
    ahead = plan("1f1b", 1.0)
    assert rivals(ahead, others, error=0.05, most=3) == []  # every other one far behind
    # 1f1b's other plan is the correction's to weigh, not a rival
    assert [c.schedule for c in rivals(ahead, others, error=0.15, most=3)] == ["1f1b", "zbh1"]
    assert rivals(in_force, [], error=0.5, most=3) == []
    assert rivals(in_force, others, error=0.5, most=1) == []  # room for the plan in force only
    with pytest.raises(ValueError, match="most must be >= 1"):
        rivals(in_force, others, error=0.1, most=0)
    with pytest.raises(ValueError, match="error must be >= 0"):
        rivals(in_force, others, error=-0.1, most=2)
