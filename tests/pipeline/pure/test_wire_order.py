"""The ordering rule NCCL imposes (messages match by order, not by tag), without processes.

For every built-in schedule, 2..8 stages and 1..16 micro-batches (streams over 2 steps),
each pair of neighbours receives in the order the peer sends and every list runs to its end
under NCCL's rules (no buffering, one stream of groups per rank), healthy and with one stage
failing at its first, middle or last compute action (the failure protocol then sends a
failed frame in place of each owed one, of the size the receiver expects).
"""

from __future__ import annotations

import pytest

from pipeline.pure.actions import COMPUTE_OPS, Action, Op, ScheduleError
from pipeline.pure.schedule import SCHEDULES, is_stream, lower, stage_actions
from pipeline.pure.wire_order import check_order

F, B = Op.FORWARD, Op.BACKWARD


def lists_of(name: str, n_stages: int, n_microbatches: int) -> list[list[Action]] | None:
    """Every stage's lowered list; None where the schedule refuses the shape."""
    steps = 2 if is_stream(name) else 1
    try:
        return [stage_actions(name, n_stages, n_microbatches, s, steps) for s in range(n_stages)]
    except ValueError:  # e.g. 2BW needs enough micro-batches for two weight versions
        return None


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_pair_receives_in_the_order_its_peer_sends(name: str) -> None:
    checked = 0
    for n_stages in range(2, 9):
        for n_microbatches in range(1, 17):
            lists = lists_of(name, n_stages, n_microbatches)
            if lists is None:
                continue
            check_order(lists)
            for stage, actions in enumerate(lists):
                computes = sum(a.op in COMPUTE_OPS for a in actions)
                for k in sorted({0, computes // 2, computes - 1}):
                    check_order(lists, failure=(stage, k))
            checked += 1
    assert checked >= 7 * 16 // 2  # most shapes exist for every schedule


def test_receives_posted_in_another_order_are_caught() -> None:
    """Stage 1 forwards micro-batch 1 before 0: under NCCL it would take 0's activations
    for 1's (silently wrong when the shapes agree), so the check refuses it."""
    stage0 = [Action(F, 0, 0), Action(F, 1, 0), Action(B, 0, 0), Action(B, 1, 0)]
    stage1 = [Action(F, 1, 1), Action(F, 0, 1), Action(B, 0, 1), Action(B, 1, 1)]
    step = Action(Op.OPTIMIZER_STEP)
    lists = [lower([*stage0, step], 0, 2), lower([*stage1, step], 1, 2)]
    with pytest.raises(ScheduleError, match="posted act1@1 but stage 0 sent act0@1"):
        check_order(lists)


def test_a_receive_posted_a_compute_early_deadlocks_as_under_nccl() -> None:
    """The old lowering (each receive one compute ahead of its consumer) runs on gloo, which
    buffers; under NCCL stage 0's early receive of gradient 0 runs on its stream ahead of
    activations 1, which stage 1 needs before it can send that gradient."""
    R, S, RG, SG = Op.RECV_ACT, Op.SEND_ACT, Op.RECV_GRAD, Op.SEND_GRAD
    stage0 = [(F, 0), (S, 0), (RG, 0), (F, 1), (S, 1), (RG, 1), (B, 0), (B, 1)]
    stage1 = [(R, 0), (R, 1), (F, 0), (F, 1), (B, 0), (SG, 0), (B, 1), (SG, 1)]
    early = [
        [Action(op, i, s) for op, i in stage] + [Action(Op.OPTIMIZER_STEP)]
        for s, stage in enumerate((stage0, stage1))
    ]
    with pytest.raises(ScheduleError, match="deadlock"):
        check_order(early)
    check_order([stage_actions("gpipe", 2, 2, s) for s in range(2)])  # as lowered now


def test_a_send_nobody_receives_is_caught() -> None:
    stage0 = lower([Action(F, 0, 0), Action(B, 0, 0), Action(Op.OPTIMIZER_STEP)], 0, 2)
    stage1 = [
        a
        for a in lower([Action(F, 0, 1), Action(B, 0, 1), Action(Op.OPTIMIZER_STEP)], 1, 2)
        if a.op is not Op.SEND_GRAD
    ]
    with pytest.raises(ScheduleError, match="wait forever"):
        check_order([stage0, stage1])
