"""Lists of ranks that hold several stages: their checks, and the messages they need.

With one stage per rank, `pipeline.pure.schedule.lower` places each receive just before its
consumer and each send just after its producer, and every pair of ranks agrees on the order
of its messages because one direction carries activations only, the other gradients only,
both in micro-batch order. With several stages per rank that fails: under the loop placement
on two ranks, rank 0 sends rank 1 the activations of stage 0 and stage 2 *and* the gradient
of stage 2's input, rank 1 receives them in the order of its own forwards and backwards, and
the two orders differ (`tests/pipeline/pure/test_multi_stage.py` shows the deadlock).

`lower_ranks` lowers all ranks together, by a lockstep replay in rounds:

    in round t, every rank runs the next action of its list if its inputs are there
    (it idles otherwise): an activation or gradient from another rank counts as there if
    it was produced in a round before t, a hand-over from a stage of the same rank if its
    producer ran (it is earlier in the list). Each message produced in round t goes into
    round t + 1's *slot* on both ends: the sender's SEND and the receiver's RECV, the
    sends of a slot first, then its receives. A rank's slot is placed just before the
    compute it runs in that round; a rank that idles carries the slot on to its next compute.

Why this satisfies NCCL's rules (`pipeline.pure.wire_order`):

* Order. A rank produces at most one message per round (one compute, one output), so an
  ordered pair of ranks carries at most one message per round, and both ends list their
  messages in round order: the n-th receive is the n-th send, whatever mix of stages,
  activations and gradients share the pair.
* No deadlock. By induction on t: when every op of the rounds before t has completed,
  every rank's host has posted the group holding its round-t ops (its compute before them
  consumed only messages of earlier rounds), each such group runs (the groups before it hold
  earlier rounds' ops only), and its partners sit in the peers' round-t groups, also running:
  all round-t ops complete, and so do the computes of round t, which wait only on them.
  The header of an edge's first activation makes the receiver's host wait and splits its
  group in two (rule 4). Every stage forwards micro-batch 0 first, in a later round than
  the stage before it, so the edges' first activations come in different rounds: at most
  one split per round. The sender posted the header with its slot's sends, which come
  before any wait of its own; the receiver's group before the split meets partners that
  are all running (nobody else split), and the round's ops after it are receives whose
  sends are running too.

`check_ranks` checks the compute lists themselves: each stage's micro-batches forwarded,
back-propagated and weight-updated once each, in micro-batch order, every action on the
rank that holds its stage, a hand-over between two stages of one rank after its producer,
one OPTIMIZER_STEP at the end. `validate` runs both, then `check_order` on the result.
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.pure.actions import COMPUTE_OPS, GRAD_OPS, Action, Op, ScheduleError
from pipeline.pure.placement import Placement

__all__ = ["check_ranks", "lower_ranks", "peer"]

_Key = tuple[str, int, int]  # (what, stage, micro-batch)


def peer(action: Action, placement: Placement) -> int:
    """The rank at the other end of a message action that names its stage s: RECV_ACT and
    SEND_GRAD talk to the rank of s - 1, SEND_ACT and RECV_GRAD to the rank of s + 1."""
    if action.op in (Op.RECV_ACT, Op.SEND_GRAD):
        return placement.rank_of(action.stage_index - 1)
    if action.op in (Op.SEND_ACT, Op.RECV_GRAD):
        return placement.rank_of(action.stage_index + 1)
    raise ValueError(f"{action} is no message")


def _message(action: Action, rank: int, placement: Placement) -> tuple[int, Action, Action] | None:
    """(receiving rank, SEND, RECV) for the output of `action`, None if it stays on `rank`."""
    if action.op not in COMPUTE_OPS:
        return None
    s, i = action.stage_index, action.microbatch_index
    if action.op is Op.FORWARD and s + 1 < placement.n_stages and placement.crosses(s):
        return (placement.rank_of(s + 1), Action(Op.SEND_ACT, i, s), Action(Op.RECV_ACT, i, s + 1))
    if action.op in GRAD_OPS and s > 0 and placement.crosses(s - 1):
        return (
            placement.rank_of(s - 1),
            Action(Op.SEND_GRAD, i, s),
            Action(Op.RECV_GRAD, i, s - 1),
        )
    return None


def _inputs(action: Action, rank: int, placement: Placement) -> list[_Key]:
    """What `action` waits for: ("F", s, i) / ("G", s, i) computed on this rank (forward /
    input gradient of stage s), ("act", s, i) / ("grad", s, i) received for stage s."""
    if action.op is Op.OPTIMIZER_STEP:
        return []
    s, i, last = action.stage_index, action.microbatch_index, placement.n_stages - 1
    if action.op is Op.FORWARD:
        if s == 0:
            return []
        return [("F", s - 1, i) if not placement.crosses(s - 1) else ("act", s, i)]
    if action.op in GRAD_OPS:
        if s == last:
            return [("F", s, i)]
        return [("F", s, i), ("G", s + 1, i) if not placement.crosses(s) else ("grad", s, i)]
    if action.op is Op.BACKWARD_WEIGHT:
        return [("G", s, i)]
    return []


def lower_ranks(computes: Sequence[Sequence[Action]], placement: Placement) -> list[list[Action]]:
    """Every rank's list with its messages, by the lockstep replay of the module doc."""
    if len(computes) != placement.n_ranks:
        raise ValueError(f"{len(computes)} lists for the {placement.n_ranks} ranks of {placement}")
    n_ranks = placement.n_ranks
    lowered: list[list[Action]] = [[] for _ in range(n_ranks)]
    slots: list[list[Action]] = [[] for _ in range(n_ranks)]  # messages waiting for a compute
    pos = [0] * n_ranks
    have: list[set[_Key]] = [set() for _ in range(n_ranks)]  # computed or received, per rank
    produced: list[tuple[int, int, Action, Action]] = []  # last round's (src, dst, send, recv)
    while any(pos[r] < len(computes[r]) for r in range(n_ranks)):
        sends = [(src, send) for src, _, send, _ in produced]
        recvs = [(dst, recv) for _, dst, _, recv in produced]
        for r, action in [*sends, *recvs]:  # the slot: sends first, then receives
            slots[r].append(action)
        for _, dst, _, recv in produced:
            kind = "act" if recv.op is Op.RECV_ACT else "grad"
            have[dst].add((kind, recv.stage_index, recv.microbatch_index))
        produced = []
        ran = False
        for r in range(n_ranks):
            if pos[r] == len(computes[r]):
                continue
            action = computes[r][pos[r]]
            if action.op not in (*COMPUTE_OPS, Op.OPTIMIZER_STEP):
                raise ScheduleError(f"rank {r}: {action} in a compute list (lowering adds it)")
            if not all(key in have[r] for key in _inputs(action, r, placement)):
                continue
            lowered[r] += slots[r]
            slots[r] = []
            lowered[r].append(action)
            pos[r] += 1
            ran = True
            if action.op is Op.FORWARD:
                have[r].add(("F", action.stage_index, action.microbatch_index))
            elif action.op in GRAD_OPS:
                have[r].add(("G", action.stage_index, action.microbatch_index))
            message = _message(action, r, placement)
            if message is not None:
                produced.append((r, *message))
        if not ran:  # nothing new will arrive: every rank waits for another
            stuck = {r: computes[r][pos[r]] for r in range(n_ranks) if pos[r] < len(computes[r])}
            raise ScheduleError(f"deadlock: ranks wait forever at {stuck}")
    for src, dst, send, recv in produced:  # the last round's messages (no compute follows)
        slots[src].append(send)
        slots[dst].append(recv)
    for r in range(n_ranks):
        if slots[r] and lowered[r] and lowered[r][-1].op is Op.OPTIMIZER_STEP:
            lowered[r][-1:-1] = slots[r]  # sends go out before the step, as `lower` has them
        else:
            lowered[r] += slots[r]
    return lowered


def check_ranks(
    computes: Sequence[Sequence[Action]], placement: Placement, n_microbatches: int
) -> None:
    """Raise `ScheduleError` unless the compute lists are well formed (module doc)."""
    if len(computes) != placement.n_ranks:
        raise ScheduleError(
            f"{len(computes)} lists for the {placement.n_ranks} ranks of {placement}"
        )
    for r, actions in enumerate(computes):
        counts: dict[tuple[str, int], int] = {}  # (what, stage) -> next micro-batch
        for position, action in enumerate(actions):
            if action.op is Op.OPTIMIZER_STEP:
                if position != len(actions) - 1:
                    raise ScheduleError(
                        f"rank {r}: one optimizer step (no stage) comes last, "
                        f"found {action} at {position}"
                    )
                continue
            if action.op not in COMPUTE_OPS:
                raise ScheduleError(f"rank {r}: {action} in a compute list (lowering adds it)")
            _check_action(action, r, placement, counts, n_microbatches)
        if not actions or actions[-1].op is not Op.OPTIMIZER_STEP:
            raise ScheduleError(f"rank {r}: no optimizer step at the end")
        for s in placement.stages_of(r):
            for what in ("F", "G", "W"):
                if counts.get((what, s), 0) != n_microbatches:
                    raise ScheduleError(
                        f"rank {r}: stage {s} runs {counts.get((what, s), 0)} "
                        f"{_NAMES[what]} of {n_microbatches}"
                    )


_NAMES = {"F": "forwards", "G": "input gradients", "W": "weight gradients"}


def _check_action(
    action: Action, r: int, placement: Placement, counts: dict[tuple[str, int], int], m: int
) -> None:
    s, i = action.stage_index, action.microbatch_index
    if not 0 <= s < placement.n_stages or placement.rank_of(s) != r:
        where = (
            f"placement {placement.kind!r} puts it on rank {placement.rank_of(s)}"
            if 0 <= s < placement.n_stages
            else f"there are {placement.n_stages} stages"
        )
        raise ScheduleError(f"rank {r}: {action} names stage {s}, but {where}")
    if not 0 <= i < m:
        raise ScheduleError(f"rank {r}: {action} names no micro-batch of {m}")
    whats = {
        Op.FORWARD: ("F",),
        Op.BACKWARD: ("G", "W"),
        Op.BACKWARD_INPUT: ("G",),
        Op.BACKWARD_WEIGHT: ("W",),
    }[action.op]
    for what in whats:
        if counts.get((what, s), 0) != i:
            raise ScheduleError(
                f"rank {r}: {action} out of order: stage {s}'s next "
                f"{_NAMES[what][:-1]} is micro-batch {counts.get((what, s), 0)}"
            )
        counts[(what, s)] = i + 1
    if action.op in GRAD_OPS and counts.get(("F", s), 0) <= i:
        raise ScheduleError(f"rank {r}: backward {action} before its forward")
    if action.op is Op.BACKWARD_WEIGHT and counts.get(("G", s), 0) <= i:
        raise ScheduleError(f"rank {r}: weight gradient {action} before its BACKWARD_INPUT")
    # a hand-over between two stages of this rank comes after its producer
    if (
        action.op is Op.FORWARD
        and s > 0
        and not placement.crosses(s - 1)
        and counts.get(("F", s - 1), 0) <= i
    ):
        raise ScheduleError(
            f"rank {r}: {action} before stage {s - 1}'s forward of {i} on the same rank"
        )
    if (
        action.op in GRAD_OPS
        and s + 1 < placement.n_stages
        and not placement.crosses(s)
        and counts.get(("G", s + 1), 0) <= i
    ):
        raise ScheduleError(
            f"rank {r}: {action} before stage {s + 1}'s input gradient of {i} on the same rank"
        )
