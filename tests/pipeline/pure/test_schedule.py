"""Schedules as data: checked without any process."""

from __future__ import annotations

import pytest

from pipeline.pure.schedule import (
    SCHEDULES,
    Action,
    Op,
    ScheduleError,
    ScheduleFn,
    gpipe,
    in_flight,
    one_f_one_b,
    placement_of,
    stage_actions,
    validate,
)

F, B = Op.FORWARD, Op.BACKWARD


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("n_stages", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("n_microbatches", [1, 2, 3, 5, 8, 12])
def test_builtin_schedules_are_valid(name: str, n_stages: int, n_microbatches: int) -> None:
    validate(name, n_stages, n_microbatches)


@pytest.mark.parametrize("n_stages,n_microbatches", [(2, 8), (4, 8), (4, 2), (6, 3)])
def test_in_flight_micro_batches(n_stages: int, n_microbatches: int) -> None:
    for s in range(n_stages):
        assert in_flight(gpipe(n_stages, n_microbatches, s)) == n_microbatches
        assert in_flight(one_f_one_b(n_stages, n_microbatches, s)) == min(
            n_stages - s, n_microbatches
        )


def test_one_f_one_b_shape() -> None:
    ops = [repr(a) for a in one_f_one_b(3, 4, 0)]
    assert ops == ["F0@0", "F1@0", "F2@0", "B0@0", "F3@0", "B1@0", "B2@0", "B3@0", "STEP"]
    assert [a.label for a in one_f_one_b(3, 4, 2)] == [
        "F0",
        "B0",
        "F1",
        "B1",
        "F2",
        "B2",
        "F3",
        "B3",
        "STEP",
    ]
    assert {a.stage for a in one_f_one_b(3, 4, 2)} == {2, None}  # the step: the rank's stages


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_receives_are_posted_before_their_consumer(name: str) -> None:
    placement = placement_of(name, 4)  # several stages per rank: hand-overs need no receive
    last = placement.n_stages - 1
    for r in range(4):
        actions = stage_actions(name, 4, 6, r)
        for pos, a in enumerate(actions):
            wanted = {F: Op.RECV_ACT, B: Op.RECV_GRAD}.get(a.op)
            if wanted is None:
                continue
            s = a.stage_index
            if (
                wanted is None
                or (a.op is F and (s == 0 or not placement.crosses(s - 1)))
                or (a.op is B and (s == last or not placement.crosses(s)))
            ):
                continue
            assert Action(wanted, a.microbatch, a.stage) in actions[:pos], (r, a)


def test_lowering_adds_no_messages_on_a_single_stage() -> None:
    assert stage_actions("1f1b", 1, 3, 0) == one_f_one_b(1, 3, 0)


def _custom(per_stage: dict[int, list[Action]]) -> ScheduleFn:
    def schedule(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
        return [*per_stage[stage], Action(Op.OPTIMIZER_STEP)]

    return schedule


@pytest.mark.parametrize(
    "stage0,match",
    [
        ([Action(B, 0, 0), Action(F, 0, 0)], "before its forward"),
        ([Action(F, 0, 0)], "never finish"),
        ([Action(F, 0, 0), Action(F, 0, 0), Action(B, 0, 0)], "forwarded twice"),
        ([Action(F, 0, 0), Action(B, 0, 0), Action(B, 0, 0)], "back-propagated twice"),
        ([Action(F, 5, 0), Action(B, 5, 0)], "names no micro-batch"),
        ([Action(F, 0, 1), Action(B, 0, 1)], "stage 0's list holds F0@1, of stage 1"),
    ],
)
def test_malformed_stage_lists_are_rejected(stage0: list[Action], match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        validate(_custom({0: stage0}), 1, 1)


def test_deadlock_is_detected() -> None:
    # Stage 0 waits for micro-batch 0's gradient before it sends micro-batch 1, but stage 1
    # wants micro-batch 1's forward before it back-propagates micro-batch 0.
    schedule = _custom(
        {
            0: [Action(F, 0, 0), Action(B, 0, 0), Action(F, 1, 0), Action(B, 1, 0)],
            1: [Action(F, 0, 1), Action(F, 1, 1), Action(B, 0, 1), Action(B, 1, 1)],
        }
    )
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(schedule, 2, 2)


def test_unknown_schedule_name_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown schedule 'zb'.*1f1b.*gpipe"):
        stage_actions("zb", 2, 2, 0)


@pytest.mark.parametrize("args", [(0, 1, 0), (2, 0, 0), (2, 2, 2), (2, 2, -1)])
def test_bad_shapes(args: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError):
        gpipe(*args)
