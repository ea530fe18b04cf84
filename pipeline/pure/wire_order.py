"""The ordering rules of `pipeline.distributed.links`, checked without processes, as NCCL runs them.

NCCL ignores tags: between two ranks, in each direction, the n-th message received is the
n-th sent. It also buffers nothing and runs a rank's batched point-to-point operations on one
stream, group after group: a group starts when the one before it has completed, and it
completes when every send and receive in it has met its partner in the peer's *running*
group. So a receive posted too early holds back every later send of its rank, and two
ranks that each wait for the other's next group deadlock. `check_order` executes every
stage's lowered action list under exactly these rules (stricter than gloo, which buffers
and honours tags) and checks each message against the receive it meets:

    1. Communication actions join the stage's open group; the group is posted (put on the
       stage's stream) before the host waits for anything: before a compute action (which
       waits for the frame it consumes, FORWARD from stage - 1, a backward from stage + 1),
       at an OPTIMIZER_STEP (a stream agrees there) and before the activations' header is
       awaited. At the end of its list the stage
       posts what is open and waits until its stream has run dry.
    2. A host wait for a frame waits for its whole group (a NCCL group completes as one).
    3. In each direction the n-th send meets the n-th receive; the frame must be the one
       the RECV action names (kind, stage, micro-batch) and have the size the receiver posted:
       the activations' tensors after an ok header, the gradients' after the receiver's
       own ok header, none after a failed one (links rule 2).
    4. The header (before the first activation frame of a list, on the control plane)
       leaves when the group holding that first frame is posted; the receiver posts its
       first RECV_ACT's group, then waits for the header on the host, then opens a new
       group with the frame: every receive is posted with its size known.
    5. With `failure=(stage, k)`, that stage fails in its k-th compute action: from then on
       it computes nothing, sends a failed frame in place of each it owes (a failed header
       first if it sent none) and drains what it is owed; a stage that meets a failed frame
       does the same (`pipeline.distributed.executor`, protocol step 2).

    gpipe, 2 stages, 1 micro-batch, receives posted one compute early (the old lowering):
        stage 0 stream:  [recv g0] [send a0]     <- recv g0 runs first: waits for stage 1's B0
        stage 1 stream:  [recv a0] ... [send g0] <- ... which waits for a0: deadlock
    receives posted just before their consumer, with the sends before them (rule 1):
        stage 0 stream:  [send a0] [recv g0]     stage 1 stream: [recv a0] [send g0]  -> runs

Several stages per rank (`pipeline.pure.placement`): the lists are per rank, every action
holds several stages, and the rules hold per ordered pair of *ranks*: the activations and
gradients of all the stages two ranks share travel on one channel per direction, in one
order (rule 3 compares kind, stage and micro-batch). Rule 1's compute waits only for frames
from other ranks (a hand-over inside a rank is local), rule 4 holds per edge stage -> stage
+ 1 that crosses ranks (each edge has its own carry, so its own header), and rule 5 fails a
whole rank (`failure=(rank, k)`).

Any mismatch, a message nobody receives, or a stall raises `ScheduleError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from pipeline.pure.actions import COMPUTE_OPS, GRAD_OPS, Action, Op, ScheduleError
from pipeline.pure.placement import Placement

__all__ = ["Frame", "check_order"]

ACT_TENSORS, GRAD_TENSORS = 2, 1  # a model carry: two tensors, one of them floating


@dataclass(frozen=True)
class Frame:
    """One message on a channel: a micro-batch's activations or gradient."""

    kind: str  # "act" or "grad"
    microbatch: int
    ok: bool
    tensors: int  # data tensors after the status (0 after a failed header)
    stage: int  # the stage that consumes it

    @property
    def name(self) -> str:
        return f"{self.kind}{self.microbatch}@{self.stage}"


@dataclass(eq=False)
class _Op:
    """A send (with its frame) or a receive (with what it names and its posted size)."""

    channel: tuple[int, int]  # (src, dst) ranks
    frame: Frame  # a receive: the frame it names, its size as posted
    send: bool
    partner: _Op | None = None
    done: bool = False


@dataclass(eq=False)
class _Group:
    ops: list[_Op] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return all(op.done for op in self.ops)


class _Rank:
    """One rank: its place in the list, its open group, its stream, what its links know.

    The headers are per edge that crosses ranks, keyed by the stage on this rank's side."""

    def __init__(self, index: int, actions: Sequence[Action]) -> None:
        self.index, self.actions, self.pc = index, actions, 0
        self.computes = 0  # compute actions done
        self.failed = False
        self.header_sent: dict[int, bool] = {}  # sending stage -> the header's ok
        self.header_posted: set[int] = set()  # ... and its group is on the stream (rule 4)
        self.header_received: dict[int, bool] = {}  # receiving stage -> the header's ok
        self.open = _Group()
        self.stream: deque[_Group] = deque()
        self.owed: dict[tuple[str, int, int], _Op] = {}  # receives not yet consumed

    @property
    def running(self) -> _Group | None:
        return self.stream[0] if self.stream else None


class _Wire:
    def __init__(
        self,
        lists: Sequence[Sequence[Action]],
        failure: tuple[int, int] | None,
        placement: Placement | None,
    ) -> None:
        self.ranks = [_Rank(r, actions) for r, actions in enumerate(lists)]
        self.failure = failure
        self.rank_of, self.last = _placement(lists, placement)
        self.several = self.last + 1 > len(lists)  # several stages per rank
        self.node = "rank" if self.several else "stage"  # what the messages call a list
        # (src, dst) -> operations posted and not yet paired, oldest first (rule 3)
        self.unpaired: dict[tuple[tuple[int, int], bool], deque[_Op]] = {}

    def stage_of(self, rank: _Rank, action: Action) -> int:
        """The global stage a compute or message action names, checked to live on `rank`."""
        stage = action.stage_index
        if self.rank_of(stage) != rank.index:
            raise ScheduleError(
                f"rank {rank.index} runs {action}, but stage {stage} "
                f"lives on rank {self.rank_of(stage)}"
            )
        return stage

    def remote(self, rank: _Rank, stage: int) -> bool:
        """True if `stage` lives on another rank than `rank` (its edge is a message)."""
        return self.rank_of(stage) != rank.index

    # -- the streams (rules 2-3) ----------------------------------------------------------
    def post(self, rank: _Rank) -> None:
        """Put the open group on the rank's stream and pair its operations in order."""
        group, rank.open = rank.open, _Group()
        if not group.ops:
            return
        rank.stream.append(group)
        rank.header_posted.update(rank.header_sent)  # they left with their first frame's group
        for op in group.ops:
            peers = self.unpaired.setdefault((op.channel, not op.send), deque())
            if not peers:
                self.unpaired.setdefault((op.channel, op.send), deque()).append(op)
                continue
            partner = peers.popleft()
            send, recv = (op, partner) if op.send else (partner, op)
            sent, named = send.frame, recv.frame
            if (sent.kind, sent.microbatch, sent.stage) != (
                named.kind,
                named.microbatch,
                named.stage,
            ):
                raise ScheduleError(
                    f"{self.node} {recv.channel[1]} posted {named.name} but {self.node} "
                    f"{send.channel[0]} sent {sent.name} in that place: the orders differ"
                )
            if sent.tensors != named.tensors:
                raise ScheduleError(
                    f"{self.node} {recv.channel[1]} expected {named.tensors} tensors in "
                    f"{named.name} from {self.node} {send.channel[0]}, which sent "
                    f"{sent.tensors}"
                )
            op.partner, partner.partner = partner, op

    def run_streams(self) -> bool:
        """Complete every pair whose two groups are running; True if anything completed."""
        progressed = True
        anything = False
        while progressed:
            progressed = False
            for rank in self.ranks:
                group = rank.running
                if group is None:
                    continue
                for op in group.ops:
                    partner = op.partner
                    if op.done or partner is None:
                        continue
                    peer = self.ranks[op.channel[1] if op.send else op.channel[0]]
                    if peer.running is not None and partner in peer.running.ops:
                        op.done = partner.done = True
                if group.done:
                    rank.stream.popleft()
                    progressed = anything = True
        return anything

    # -- the host (rules 1, 4, 5) -----------------------------------------------------------
    def needs(self, rank: _Rank, action: Action) -> tuple[str, int, int] | None:
        s, i = self.stage_of(rank, action), action.microbatch_index
        if action.op is Op.FORWARD and s > 0 and self.remote(rank, s - 1):
            return ("act", s, i)
        if action.op in GRAD_OPS and s < self.last and self.remote(rank, s + 1):
            return ("grad", s, i)
        return None

    def step(self, rank: _Rank) -> bool:
        """Run the rank's next action if it can; False when it waits (or is done)."""
        if rank.pc == len(rank.actions):
            self.post(rank)
            return False
        action = rank.actions[rank.pc]
        if action.op is Op.OPTIMIZER_STEP:
            self.post(rank)  # a stream waits for an agreement there (collectives wait too)
            rank.pc += 1
            return True
        if action.op in COMPUTE_OPS and not self._compute(rank, action):
            return False
        s, i = self.stage_of(rank, action), action.microbatch_index
        if action.op is Op.RECV_ACT and not self._recv_act(rank, s, i):
            return False
        if action.op is Op.RECV_GRAD:
            if s not in rank.header_sent:
                what = Frame("grad", i, True, 0, s).name
                raise ScheduleError(
                    f"{self.node} {rank.index} receives {what} before it sent "
                    "any activations: the gradient's size is unknown"
                )
            size = GRAD_TENSORS if rank.header_sent[s] else 0
            self._recv(rank, Frame("grad", i, True, size, s), s, self.rank_of(s + 1))
        elif action.op is Op.SEND_ACT:
            ok = rank.header_sent.setdefault(s, not rank.failed)
            frame = Frame("act", i, not rank.failed, ACT_TENSORS if ok else 0, s + 1)
            self._send(rank, frame, self.rank_of(s + 1))
        elif action.op is Op.SEND_GRAD:
            size = GRAD_TENSORS if rank.header_received.get(s) else 0
            frame = Frame("grad", i, not rank.failed, size, s - 1)
            self._send(rank, frame, self.rank_of(s - 1))
        rank.pc += 1
        return True

    def _compute(self, rank: _Rank, action: Action) -> bool:
        self.post(rank)
        needed = self.needs(rank, action)
        if needed is not None:
            receive = rank.owed.get(needed)
            if receive is None:
                what = needed if self.several else needed[::2]  # (kind, micro-batch)
                raise ScheduleError(
                    f"{self.node} {rank.index}: {action} consumes {what}, "
                    "which no RECV action before it posted"
                )
            group = next((g for g in rank.stream if receive in g.ops), None)
            if group is not None:
                return False  # its group has not completed (rule 2)
            del rank.owed[needed]
            assert receive.partner is not None
            if not receive.partner.frame.ok:
                rank.failed = True
        if self.failure == (rank.index, rank.computes):
            rank.failed = True
        rank.computes += 1
        return True

    def _recv_act(self, rank: _Rank, s: int, i: int) -> bool:
        if s not in rank.header_received:  # rule 4: post, then wait for the header
            self.post(rank)
            sender = self.ranks[self.rank_of(s - 1)]
            if s - 1 not in sender.header_posted:
                return False
            rank.header_received[s] = sender.header_sent[s - 1]
        size = ACT_TENSORS if rank.header_received[s] else 0
        self._recv(rank, Frame("act", i, True, size, s), s, self.rank_of(s - 1))
        return True

    def _recv(self, rank: _Rank, frame: Frame, stage: int, peer: int) -> None:
        op = _Op((peer, rank.index), frame, send=False)
        rank.open.ops.append(op)
        rank.owed[(frame.kind, stage, frame.microbatch)] = op

    def _send(self, rank: _Rank, frame: Frame, peer: int) -> None:
        rank.open.ops.append(_Op((rank.index, peer), frame, send=True))


def _placement(
    lists: Sequence[Sequence[Action]], placement: Placement | None
) -> tuple[Callable[[int], int], int]:
    """(stage -> rank, last stage): the placement's, else read off the compute actions
    (each stage computed on one rank; one stage per rank for lists without any)."""
    if placement is not None:
        if placement.n_ranks != len(lists):
            raise ScheduleError(
                f"{len(lists)} lists for the {placement.n_ranks} ranks of {placement}"
            )
        return placement.rank_of, placement.n_stages - 1
    owner: dict[int, int] = {}
    for rank, actions in enumerate(lists):
        for action in actions:
            if action.op in COMPUTE_OPS and owner.setdefault(action.stage_index, rank) != rank:
                raise ScheduleError(
                    f"stage {action.stage} is computed on ranks "
                    f"{owner[action.stage_index]} and {rank}"
                )
    if not owner:
        return (lambda stage: stage), len(lists) - 1

    def rank_of(stage: int) -> int:
        if stage not in owner:
            raise ScheduleError(f"no rank computes stage {stage}")
        return owner[stage]

    return rank_of, max(owner)


def check_order(
    lists: Sequence[Sequence[Action]],
    failure: tuple[int, int] | None = None,
    placement: Placement | None = None,
) -> None:
    """Raise `ScheduleError` unless every receive of every lowered list meets the frame it
    names, of the size it expects, and every list runs to its end under NCCL's rules, with
    `failure=(rank, k)` failing that rank in its k-th compute action (module doc); one list
    per rank, rank 0 first. `placement` says where the stages the actions name live (read
    off the lists' compute actions if None)."""
    wire = _Wire(lists, failure, placement)
    progressed = True
    while progressed:
        progressed = False
        for rank in wire.ranks:
            while wire.step(rank):
                progressed = True
        progressed = wire.run_streams() or progressed
    stuck = {
        r.index: r.actions[r.pc] if r.pc < len(r.actions) else "its sends"
        for r in wire.ranks
        if r.pc < len(r.actions) or r.stream
    }
    left = {
        str(channel): [op.frame for op in ops]
        for (channel, _send), ops in wire.unpaired.items()
        if ops
    }
    if stuck:
        raise ScheduleError(f"deadlock: {wire.node}s wait forever at {stuck}")
    if left:
        raise ScheduleError(f"messages nobody received or receives never met: {left}")
