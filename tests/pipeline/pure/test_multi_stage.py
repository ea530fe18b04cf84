"""Several stages per rank as data: interleaved 1F1B and ZB-V, checked, lowered, on the wire.

The lists are per rank and name their stages; `validate` proves them (every stage's
micro-batches once each in order, hand-overs after their producers, NCCL's order between
every pair of ranks); the lowering is the lockstep one of `pipeline.pure.multi_stage`, and
the simpler rule of one stage per rank is shown to deadlock on these lists.
"""

from __future__ import annotations

import pytest

from pipeline.pure.actions import COMPUTE_OPS, GRAD_OPS, Action, Op, ScheduleError, ScheduleFn
from pipeline.pure.interleaved import interleaved, interleaved_1f1b
from pipeline.pure.multi_stage import check_ranks, lower_ranks, peer
from pipeline.pure.placement import Placement
from pipeline.pure.schedule import (
    SCHEDULES,
    get_schedule,
    is_multi_stage,
    one_f_one_b,
    placement_of,
    stage_actions,
    validate,
)
from pipeline.pure.schedule_spec import PlacementKind, ScheduleSpec
from pipeline.pure.wire_order import check_order
from pipeline.pure.zero_bubble import zbv

F, B, BI, W = Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT, Op.BACKWARD_WEIGHT
STEP = Op.OPTIMIZER_STEP
COMM = (Op.RECV_ACT, Op.SEND_ACT, Op.RECV_GRAD, Op.SEND_GRAD)


def lists_of(schedule: str | ScheduleFn, n_ranks: int, m: int) -> list[list[Action]]:
    return [stage_actions(schedule, n_ranks, m, r) for r in range(n_ranks)]


# -- the registry ------------------------------------------------------------------------
def test_registered_with_their_placement() -> None:
    assert SCHEDULES["interleaved_1f1b"] is interleaved_1f1b and SCHEDULES["zbv"] is zbv
    assert (interleaved_1f1b.placement, interleaved_1f1b.stages_per_rank) == ("loop", 2)
    assert (zbv.placement, zbv.stages_per_rank) == ("v", 2)
    assert placement_of("interleaved_1f1b", 4) == Placement("loop", 4, 2)
    assert placement_of("zbv", 3) == Placement("v", 3, 2)
    assert placement_of("1f1b", 4) == placement_of(one_f_one_b, 4) == Placement.single(4)
    assert is_multi_stage("ZBV") and not is_multi_stage("zbh1")
    assert get_schedule("zbv") is zbv and get_schedule("1f1b") is one_f_one_b


def test_other_chunk_counts() -> None:
    three = get_schedule("interleaved_1f1b", stages_per_rank=3)
    assert three is interleaved(3) and three.stages_per_rank == 3
    assert get_schedule("interleaved_1f1b", stages_per_rank=2) is interleaved_1f1b
    assert placement_of(three, 2) == Placement("loop", 2, 3)
    assert get_schedule("zbv", stages_per_rank=2) is zbv
    with pytest.raises(
        ValueError,
        match=r"'zbv' runs 2 stage\(s\) per rank, got "
        r"stages_per_rank=3; only 'interleaved_1f1b'",
    ):
        get_schedule("zbv", stages_per_rank=3)
    with pytest.raises(ValueError, match=r"'1f1b' runs 1 stage\(s\) per rank"):
        get_schedule("1f1b", stages_per_rank=2)
    with pytest.raises(ValueError, match="stages_per_rank must be >= 1"):
        interleaved(0)


# -- valid lists -------------------------------------------------------------------------
@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("n_ranks", [2, 3, 4])
def test_interleaved_is_valid_for_every_m(n_ranks: int, v: int) -> None:
    for m in range(1, 17):
        validate(get_schedule("interleaved_1f1b", v), n_ranks, m)


@pytest.mark.parametrize("n_ranks", range(2, 9))
def test_zbv_is_valid_for_every_m(n_ranks: int) -> None:
    for m in range(1, 17):
        validate("zbv", n_ranks, m)


@pytest.mark.parametrize("args", [(0, 4, 0), (2, 0, 0), (2, 4, 2), (2, 4, -1)])
def test_bad_shapes_are_refused(args: tuple[int, int, int]) -> None:
    for schedule in (interleaved_1f1b, zbv):
        with pytest.raises(ValueError):
            schedule(*args)


def test_one_rank_holds_the_whole_model() -> None:
    validate("zbv", 1, 3)  # stages 0 and 1 on rank 0: no message at all
    validate("interleaved_1f1b", 1, 3)
    assert not any(a.op in COMM for a in stage_actions("zbv", 1, 3, 0))


def test_interleaved_with_one_chunk_is_1f1b() -> None:
    for n_ranks, m in [(2, 4), (4, 8), (3, 2)]:
        for r in range(n_ranks):
            named = interleaved(1)(n_ranks, m, r)
            assert {a.stage for a in named if a.op is not STEP} == {r}
            assert named == one_f_one_b(n_ranks, m, r)


def test_interleaved_order() -> None:
    """Depth first: a group of R micro-batches through chunk 0, then chunk 1; backwards
    with the chunks reversed; 2(R - 1 - r) + (v - 1) R warm-up forwards."""
    assert [repr(a) for a in interleaved_1f1b(2, 4, 0)] == [
        "F0@0",
        "F1@0",
        "F0@2",
        "F1@2",
        "F2@0",
        "B0@2",
        "F3@0",
        "B1@2",
        "F2@2",
        "B0@0",
        "F3@2",
        "B1@0",
        "B2@2",
        "B3@2",
        "B2@0",
        "B3@0",
        "STEP",
    ]
    assert [repr(a) for a in interleaved_1f1b(2, 4, 1)][:6] == [
        "F0@1",
        "F1@1",
        "F0@3",
        "B0@3",
        "F1@3",
        "B1@3",
    ]


def test_zbv_order() -> None:
    """The paper's V order (`zbv`'s doc); the first stage's backward whole, the others split."""
    assert [repr(a) for a in zbv(2, 4, 1)] == [
        "F0@1",  # F0 x 1
        "F0@2",
        "F1@1",  # (F1 F0) x 1
        "F1@2",
        "BI0@2",
        "W0@2",  # (F1 B1 W1) x 1
        "F2@1",
        "BI0@1",
        "W0@1",
        "F2@2",
        "BI1@2",
        "W1@2",  # steady
        "F3@1",
        "BI1@1",
        "W1@1",
        "F3@2",
        "BI2@2",
        "W2@2",
        "BI2@1",
        "BI3@2",  # (B0 B1) x 1
        "BI3@1",
        "W2@1",  # (B0 W0) x 1
        "W3@2",
        "W3@1",
        "STEP",  # the pending W1s, then W0s
    ]
    rank0 = zbv(4, 8, 0)
    assert {a.op for a in rank0 if a.stage == 0} == {F, B}  # stage 0 sends no gradient
    assert {a.op for a in rank0 if a.stage == 7} == {F, BI, W}


@pytest.mark.parametrize("name", ["interleaved_1f1b", "zbv"])
def test_each_stage_runs_its_micro_batches_once_in_order(name: str) -> None:
    n_ranks, m = 4, 8
    placement = placement_of(name, n_ranks)
    for r in range(n_ranks):
        actions = get_schedule(name)(n_ranks, m, r)
        assert actions[-1] == Action(STEP)
        assert {a.stage for a in actions[:-1]} == set(placement.stages_of(r))
        for s in placement.stages_of(r):
            for ops in ((F,), (B, BI), (B, W)):
                assert [a.microbatch for a in actions if a.stage == s and a.op in ops] == list(
                    range(m)
                )


# -- the lowering ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,n_ranks,m",
    [
        ("interleaved_1f1b", 2, 4),
        ("interleaved_1f1b", 4, 8),
        ("zbv", 2, 4),
        ("zbv", 4, 8),
        ("zbv", 3, 2),
    ],
)
def test_messages_cross_ranks_only_and_follow_their_producer(
    name: str, n_ranks: int, m: int
) -> None:
    placement = placement_of(name, n_ranks)
    lists = lists_of(name, n_ranks, m)
    for actions in lists:
        assert actions[-1] == Action(STEP)
        for pos, a in enumerate(actions):
            if a.op is STEP:
                continue
            s, i = a.stage_index, a.microbatch_index
            if a.op in (Op.SEND_ACT, Op.RECV_GRAD):  # the edge s -> s + 1
                assert placement.crosses(s)
            if a.op in (Op.RECV_ACT, Op.SEND_GRAD):  # the edge s - 1 -> s
                assert placement.crosses(s - 1)
            if a.op is Op.SEND_ACT:  # just after the forward that produced it
                assert actions[pos - 1] == Action(F, i, s)
            if a.op is Op.SEND_GRAD:
                assert actions[pos - 1].op in GRAD_OPS
                assert actions[pos - 1].microbatch == i
            if a.op is F and s > 0 and placement.crosses(s - 1):
                assert Action(Op.RECV_ACT, i, s) in actions[:pos]
            if a.op in GRAD_OPS and s < placement.n_stages - 1 and placement.crosses(s):
                assert Action(Op.RECV_GRAD, i, s) in actions[:pos]
    sends = sum(a.op in (Op.SEND_ACT, Op.SEND_GRAD) for x in lists for a in x)
    crossing = sum(placement.crosses(s) for s in range(placement.n_stages - 1))
    assert sends == 2 * m * crossing  # one activation and one gradient per edge and micro-batch


def test_the_peer_of_each_message() -> None:
    loop, v = placement_of("interleaved_1f1b", 4), placement_of("zbv", 4)
    assert peer(Action(Op.RECV_ACT, 0, 4), loop) == 3  # stage 3 -> 4 wraps round to rank 0
    assert peer(Action(Op.SEND_ACT, 0, 3), loop) == 0
    assert peer(Action(Op.SEND_GRAD, 0, 4), loop) == 3
    assert peer(Action(Op.RECV_GRAD, 0, 5), v) == 1  # stage 6 on rank 1, coming back up
    assert peer(Action(Op.SEND_ACT, 0, 5), v) == 1
    for r, actions in enumerate(lists_of("zbv", 4, 4)):
        assert all(peer(a, v) != r for a in actions if a.op in COMM)
    with pytest.raises(ValueError, match="is no message"):
        peer(Action(F, 0, 0), loop)


def test_a_hand_over_inside_a_rank_is_no_message() -> None:
    actions = stage_actions("zbv", 4, 8, 3)  # rank 3 holds stages 3 and 4: the turn of the V
    assert Action(Op.SEND_ACT, 0, 3) not in actions and Action(Op.RECV_ACT, 0, 4) not in actions
    assert Action(Op.SEND_GRAD, 0, 4) not in actions and Action(Op.RECV_GRAD, 0, 3) not in actions
    assert actions.index(Action(F, 0, 3)) < actions.index(Action(F, 0, 4))


# -- NCCL's order ------------------------------------------------------------------------
@pytest.mark.parametrize("name,v", [("interleaved_1f1b", 2), ("interleaved_1f1b", 3), ("zbv", 2)])
def test_every_pair_of_ranks_agrees_on_one_order_healthy_and_failing(name: str, v: int) -> None:
    schedule = get_schedule(name, v)
    for n_ranks in (2, 3, 4):
        for m in (1, 3, 4, 8):
            lists = lists_of(schedule, n_ranks, m)
            placement = placement_of(schedule, n_ranks)
            check_order(lists, placement=placement)
            for r, actions in enumerate(lists):
                computes = sum(a.op in COMPUTE_OPS for a in actions)
                for k in sorted({0, computes // 2, computes - 1}):
                    check_order(lists, failure=(r, k), placement=placement)


def _next_to_consumer(actions: list[Action], placement: Placement) -> list[Action]:
    """The rule of one stage per rank: each receive just before its consumer, each send
    just after its producer (`pipeline.pure.schedule.lower`), per edge that crosses ranks."""
    out, last = [], placement.n_stages - 1
    for a in actions:
        if a.op is STEP:
            out.append(a)
            continue
        s, i = a.stage_index, a.microbatch_index
        if a.op is F and s > 0 and placement.crosses(s - 1):
            out.append(Action(Op.RECV_ACT, i, s))
        if a.op in GRAD_OPS and s < last and placement.crosses(s):
            out.append(Action(Op.RECV_GRAD, i, s))
        out.append(a)
        if a.op is F and s < last and placement.crosses(s):
            out.append(Action(Op.SEND_ACT, i, s))
        if a.op in GRAD_OPS and s > 0 and placement.crosses(s - 1):
            out.append(Action(Op.SEND_GRAD, i, s))
    return out


@pytest.mark.parametrize(
    "name,n_ranks", [("interleaved_1f1b", 2), ("interleaved_1f1b", 3), ("zbv", 2), ("zbv", 4)]
)
def test_receiving_next_to_the_consumer_deadlocks_under_nccl(name: str, n_ranks: int) -> None:
    """Why the lockstep lowering: with several stages per rank, the one-stage rule leaves a
    receive on a rank's stream ahead of sends its peer needs first."""
    placement = placement_of(name, n_ranks)
    computes = [get_schedule(name)(n_ranks, 8, r) for r in range(n_ranks)]
    with pytest.raises(ScheduleError, match="deadlock: ranks wait forever"):
        check_order([_next_to_consumer(c, placement) for c in computes], placement=placement)
    check_order(lower_ranks(computes, placement), placement=placement)


def test_receives_in_another_order_than_the_sends_are_caught() -> None:
    """Two ranks, loop placement: rank 1 receives from rank 0, on one channel, stage 1's and
    stage 3's activations and the gradient of stage 1's outputs; swapping two of its
    receives mismatches (under NCCL it would take one for the other)."""
    placement = placement_of("interleaved_1f1b", 2)
    lists = lists_of("interleaved_1f1b", 2, 4)
    rank1 = lists[1]
    a, b = rank1.index(Action(Op.RECV_ACT, 1, 3)), rank1.index(Action(Op.RECV_GRAD, 0, 1))
    rank1[a], rank1[b] = rank1[b], rank1[a]
    with pytest.raises(
        ScheduleError,
        match=r"rank 1 posted grad0@1 but rank 0 sent act1@3 "
        "in that place: the orders differ",
    ):
        check_order(lists, placement=placement)


def test_an_action_on_the_wrong_rank_is_caught() -> None:
    lists = lists_of("zbv", 2, 2)
    lists[0] = [Action(a.op, a.microbatch, 1) if a.stage == 0 else a for a in lists[0]]
    with pytest.raises(ScheduleError, match="stage 1 lives on rank 1"):
        check_order(lists, placement=placement_of("zbv", 2))


# -- malformed lists ---------------------------------------------------------------------
def _custom(per_rank: dict[int, list[Action]], kind: PlacementKind = "v") -> ScheduleSpec:
    def schedule(n_ranks: int, n_microbatches: int, rank: int) -> list[Action]:
        return [*per_rank[rank], Action(STEP)]

    return ScheduleSpec("custom", schedule, placement=kind, stages_per_rank=2)


GOOD_V1 = [Action(F, 0, 0), Action(F, 0, 1), Action(B, 0, 1), Action(B, 0, 0)]  # one rank


@pytest.mark.parametrize(
    "rank0,match",
    [
        (
            [Action(F, 0, 1), Action(F, 0, 0), Action(B, 0, 1), Action(B, 0, 0)],
            r"F0@1 before stage 0's forward of 0 on the same rank",
        ),
        (
            [Action(F, 0, 0), Action(F, 0, 1), Action(B, 0, 0), Action(B, 0, 1)],
            r"B0@0 before stage 1's input gradient of 0 on the same rank",
        ),
        ([Action(F, 0, 0), Action(F, 0, 2), *GOOD_V1[1:]], "names stage 2, but there are 2"),
        (
            [Action(F, 0, 0), Action(F, 0, 1), Action(W, 0, 1), *GOOD_V1[2:]],
            "W0@1 before its BACKWARD_INPUT",
        ),
        (GOOD_V1[:3], "stage 0 runs 0 input gradients of 1"),
        ([*GOOD_V1[:2], Action(STEP), *GOOD_V1[2:]], "one optimizer step"),
    ],
)
def test_malformed_rank_lists_are_rejected(rank0: list[Action], match: str) -> None:
    with pytest.raises(ScheduleError, match=match):
        validate(_custom({0: rank0}), 1, 1)
    validate(_custom({0: GOOD_V1}), 1, 1)


def test_out_of_order_micro_batches_are_rejected() -> None:
    rank0 = [
        Action(F, 1, 0),
        Action(F, 0, 0),
        Action(F, 0, 1),
        Action(F, 1, 1),
        Action(B, 0, 1),
        Action(B, 1, 1),
        Action(B, 0, 0),
        Action(B, 1, 0),
    ]
    with pytest.raises(
        ScheduleError, match="F1@0 out of order: stage 0's next forward is micro-batch 0"
    ):
        check_ranks([[*rank0, Action(STEP)]], Placement("v", 1, 2), 2)


def test_a_rank_waiting_for_itself_is_a_deadlock() -> None:
    """Rank 0 back-propagates stage 0 before it forwards stage 3 (which rank 0 also holds):
    the gradient it waits for comes from rank 1, which waits for rank 0's forward."""
    placement = Placement("v", 2, 2)  # rank 0: stages 0, 3; rank 1: stages 1, 2
    rank0 = [Action(F, 0, 0), Action(B, 0, 0), Action(F, 0, 3), Action(B, 0, 3), Action(STEP)]
    rank1 = [Action(F, 0, 1), Action(F, 0, 2), Action(B, 0, 2), Action(B, 0, 1), Action(STEP)]
    with pytest.raises(
        ScheduleError,
        match=r"deadlock: ranks wait forever at "
        r"\{0: B0@0, 1: B0@2\}",
    ):
        lower_ranks([rank0, rank1], placement)
