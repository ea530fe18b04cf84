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
       the RECV action names (kind, micro-batch) and have the size the receiver posted:
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

Any mismatch, a message nobody receives, or a stall raises `ScheduleError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pipeline.pure.actions import COMPUTE_OPS, GRAD_OPS, Action, Op, ScheduleError

__all__ = ["Frame", "check_order"]

ACT_TENSORS, GRAD_TENSORS = 2, 1  # a model carry: two tensors, one of them floating


@dataclass(frozen=True)
class Frame:
    """One message on a channel: a micro-batch's activations or gradient."""

    kind: str  # "act" or "grad"
    microbatch: int
    ok: bool
    tensors: int  # data tensors after the status (0 after a failed header)


@dataclass(eq=False)
class _Op:
    """A send (with its frame) or a receive (with what it names and its posted size)."""

    channel: tuple[int, int]  # (src, dst)
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


class _Stage:
    """One stage: its place in the list, its open group, its stream, what its links know."""

    def __init__(self, index: int, actions: Sequence[Action]) -> None:
        self.index, self.actions, self.pc = index, actions, 0
        self.computes = 0  # compute actions done
        self.failed = False
        self.header_sent: bool | None = None  # on the link to stage + 1
        self.header_posted = False  # ... and its group is on the stream (rule 4)
        self.header_received: bool | None = None  # on the link from stage - 1
        self.open = _Group()
        self.stream: deque[_Group] = deque()
        self.owed: dict[tuple[str, int], _Op] = {}  # receives not yet consumed

    @property
    def running(self) -> _Group | None:
        return self.stream[0] if self.stream else None


class _Wire:
    def __init__(self, lists: Sequence[Sequence[Action]], failure: tuple[int, int] | None):
        self.stages = [_Stage(s, actions) for s, actions in enumerate(lists)]
        self.last, self.failure = len(lists) - 1, failure
        # (src, dst) -> operations posted and not yet paired, oldest first (rule 3)
        self.unpaired: dict[tuple[tuple[int, int], bool], deque[_Op]] = {}

    # -- the streams (rules 2-3) ----------------------------------------------------------
    def post(self, stage: _Stage) -> None:
        """Put the open group on the stage's stream and pair its operations in order."""
        group, stage.open = stage.open, _Group()
        if not group.ops:
            return
        stage.stream.append(group)
        if stage.header_sent is not None:
            stage.header_posted = True  # it left with the first frame's group (or before)
        for op in group.ops:
            peers = self.unpaired.setdefault((op.channel, not op.send), deque())
            if not peers:
                self.unpaired.setdefault((op.channel, op.send), deque()).append(op)
                continue
            partner = peers.popleft()
            send, recv = (op, partner) if op.send else (partner, op)
            if (send.frame.kind, send.frame.microbatch) != (recv.frame.kind, recv.frame.microbatch):
                raise ScheduleError(
                    f"stage {recv.channel[1]} posted {recv.frame.kind}{recv.frame.microbatch} "
                    f"but stage {send.channel[0]} sent {send.frame.kind}{send.frame.microbatch} "
                    "in that place: the orders differ")  # fmt: skip
            if send.frame.tensors != recv.frame.tensors:
                raise ScheduleError(
                    f"stage {recv.channel[1]} expected {recv.frame.tensors} tensors in "
                    f"{recv.frame.kind}{recv.frame.microbatch} from stage {send.channel[0]}, "
                    f"which sent {send.frame.tensors}")  # fmt: skip
            op.partner, partner.partner = partner, op

    def run_streams(self) -> bool:
        """Complete every pair whose two groups are running; True if anything completed."""
        progressed = True
        anything = False
        while progressed:
            progressed = False
            for stage in self.stages:
                group = stage.running
                if group is None:
                    continue
                for op in group.ops:
                    partner = op.partner
                    if op.done or partner is None:
                        continue
                    peer = self.stages[op.channel[1] if op.send else op.channel[0]]
                    if peer.running is not None and partner in peer.running.ops:
                        op.done = partner.done = True
                if group.done:
                    stage.stream.popleft()
                    progressed = anything = True
        return anything

    # -- the host (rules 1, 4, 5) -----------------------------------------------------------
    def needs(self, stage: _Stage, action: Action) -> tuple[str, int] | None:
        if action.op is Op.FORWARD and stage.index > 0:
            return ("act", action.microbatch)
        if action.op in GRAD_OPS and stage.index < self.last:
            return ("grad", action.microbatch)
        return None

    def step(self, stage: _Stage) -> bool:
        """Run the stage's next action if it can; False when it waits (or is done)."""
        if stage.pc == len(stage.actions):
            self.post(stage)
            return False
        action, i = stage.actions[stage.pc], stage.actions[stage.pc].microbatch
        if action.op in COMPUTE_OPS and not self._compute(stage, action):
            return False
        if action.op is Op.RECV_ACT and not self._recv_act(stage, i):
            return False
        if action.op is Op.RECV_GRAD:
            if stage.header_sent is None:
                raise ScheduleError(f"stage {stage.index} receives grad{i} before it sent "
                                    "any activations: the gradient's size is unknown")  # fmt: skip
            self._recv(stage, "grad", i, GRAD_TENSORS if stage.header_sent else 0, +1)
        elif action.op is Op.SEND_ACT:
            if stage.header_sent is None:
                stage.header_sent = not stage.failed
            size = ACT_TENSORS if stage.header_sent else 0
            self._send(stage, Frame("act", i, not stage.failed, size), +1)
        elif action.op is Op.SEND_GRAD:
            size = GRAD_TENSORS if stage.header_received else 0
            self._send(stage, Frame("grad", i, not stage.failed, size), -1)
        elif action.op is Op.OPTIMIZER_STEP:
            self.post(stage)  # a stream waits for an agreement there (collectives wait too)
        stage.pc += 1
        return True

    def _compute(self, stage: _Stage, action: Action) -> bool:
        self.post(stage)
        needed = self.needs(stage, action)
        if needed is not None:
            receive = stage.owed.get(needed)
            if receive is None:
                raise ScheduleError(f"stage {stage.index}: {action} consumes {needed}, "
                                    "which no RECV action before it posted")  # fmt: skip
            group = next((g for g in stage.stream if receive in g.ops), None)
            if group is not None:
                return False  # its group has not completed (rule 2)
            del stage.owed[needed]
            assert receive.partner is not None
            if not receive.partner.frame.ok:
                stage.failed = True
        if self.failure == (stage.index, stage.computes):
            stage.failed = True
        stage.computes += 1
        return True

    def _recv_act(self, stage: _Stage, i: int) -> bool:
        if stage.header_received is None:  # rule 4: post, then wait for the header
            self.post(stage)
            sender = self.stages[stage.index - 1]
            if not sender.header_posted:
                return False
            stage.header_received = sender.header_sent
        self._recv(stage, "act", i, ACT_TENSORS if stage.header_received else 0, -1)
        return True

    def _recv(self, stage: _Stage, kind: str, i: int, size: int, towards: int) -> None:
        op = _Op((stage.index + towards, stage.index), Frame(kind, i, True, size), send=False)
        stage.open.ops.append(op)
        stage.owed[(kind, i)] = op

    def _send(self, stage: _Stage, frame: Frame, towards: int) -> None:
        stage.open.ops.append(_Op((stage.index, stage.index + towards), frame, send=True))


def check_order(lists: Sequence[Sequence[Action]], failure: tuple[int, int] | None = None) -> None:
    """Raise `ScheduleError` unless every receive of every stage's lowered list meets the
    frame it names, of the size it expects, and every stage runs to its end under NCCL's
    rules, with `failure=(stage, k)` failing that stage in its k-th compute action (module
    doc); one list per stage, stage 0 first."""
    wire = _Wire(lists, failure)
    progressed = True
    while progressed:
        progressed = False
        for stage in wire.stages:
            while wire.step(stage):
                progressed = True
        progressed = wire.run_streams() or progressed
    stuck = {s.index: s.actions[s.pc] if s.pc < len(s.actions) else "its sends"
             for s in wire.stages if s.pc < len(s.actions) or s.stream}  # fmt: skip
    left = {str(channel): [op.frame for op in ops]
            for (channel, _send), ops in wire.unpaired.items() if ops}  # fmt: skip
    if stuck:
        raise ScheduleError(f"deadlock: stages wait forever at {stuck}")
    if left:
        raise ScheduleError(f"messages nobody received or receives never met: {left}")
