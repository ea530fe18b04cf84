"""The ordering rule of `pipeline.distributed.links`, checked without processes.

NCCL ignores tags: between two ranks, in each direction, the n-th message received is the
n-th sent. The runtime sends no tags at all, so its correctness rests on every pair of
neighbours posting receives in exactly the order the peer sends. `check_order` executes
every stage's lowered action list the way the runtime does, over one FIFO channel per
direction, and checks each message against the receive it meets:

    1. Posts and sends never block; a compute action waits for the frame it consumes
       (FORWARD: the activations from stage - 1, a backward: the gradient from stage + 1).
    2. A sender puts one frame per SEND action on the channel, in list order; before the
       first activation frame of the step, the header. A receive meets the frame at the
       head of its channel: it must be the frame its RECV action names (kind and
       micro-batch) and have the size the receiver expects: the activations' tensors after
       an ok header, the gradients' after the receiver's own ok header, none after a
       failed one (links rule 2).
    3. With `failure=(stage, k)`, that stage fails in its k-th compute action: from then on
       it computes nothing, sends a failed frame in place of each it owes (a failed header
       first if it sent none) and drains what it is owed; a stage that meets a failed frame
       does the same (`pipeline.distributed.executor`, protocol step 2).

Any mismatch, a message nobody receives, or a stall raises `ScheduleError`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.pure.actions import COMPUTE_OPS, GRAD_OPS, Action, Op, ScheduleError

__all__ = ["Frame", "check_order"]

ACT_TENSORS, GRAD_TENSORS = 2, 1  # a model carry: two tensors, one of them floating


@dataclass(frozen=True)
class Frame:
    """One message on a channel: a header, or a micro-batch's activations or gradient."""

    kind: str  # "header", "act" or "grad"
    microbatch: int
    ok: bool
    tensors: int  # data tensors after the status (0 after a failed header)


class _Stage:
    """One stage's position in its list and what its links know (links rule 2)."""

    def __init__(self, index: int, actions: Sequence[Action]) -> None:
        self.index, self.actions, self.pc = index, actions, 0
        self.computes = 0  # compute actions done
        self.failed = False
        self.header_sent: bool | None = None  # on the link to stage + 1
        self.header_received: bool | None = None  # on the link from stage - 1
        self.posted: dict[str, deque[int]] = {"act": deque(), "grad": deque()}
        self.received: dict[tuple[str, int], Frame] = {}


class _Wire:
    def __init__(self, lists: Sequence[Sequence[Action]], failure: tuple[int, int] | None):
        self.stages = [_Stage(s, actions) for s, actions in enumerate(lists)]
        self.last, self.failure = len(lists) - 1, failure
        # (src, dst) -> frames in flight, oldest first
        self.channels: dict[tuple[int, int], deque[Frame]] = {}

    def send(self, src: _Stage, dst: int, frame: Frame) -> None:
        self.channels.setdefault((src.index, dst), deque()).append(frame)

    def deliver(self, stage: _Stage) -> None:
        """Match the frames at the heads of the stage's inbound channels with its posted
        receives, in order (links rule 3)."""
        for kind, src in (("act", stage.index - 1), ("grad", stage.index + 1)):
            channel = self.channels.get((src, stage.index), deque())
            posted = stage.posted[kind]
            while channel and (posted or channel[0].kind == "header"):
                frame = channel.popleft()
                if frame.kind == "header":
                    if stage.header_received is not None:
                        raise ScheduleError(f"stage {stage.index}: a second header from {src}")
                    stage.header_received = frame.ok
                    continue
                expected = posted.popleft()
                if (frame.kind, frame.microbatch) != (kind, expected):
                    raise ScheduleError(
                        f"stage {stage.index} posted {kind}{expected} but stage {src} sent "
                        f"{frame.kind}{frame.microbatch} in that place: the orders differ")
                ok = stage.header_received if kind == "act" else stage.header_sent
                size = (ACT_TENSORS if kind == "act" else GRAD_TENSORS) if ok else 0
                if frame.tensors != size:
                    raise ScheduleError(
                        f"stage {stage.index} expected {size} tensors in {kind}{expected} "
                        f"from stage {src}, which sent {frame.tensors}")
                stage.received[(kind, expected)] = frame

    def needs(self, stage: _Stage, action: Action) -> tuple[str, int] | None:
        if action.op is Op.FORWARD and stage.index > 0:
            return ("act", action.microbatch)
        if action.op in GRAD_OPS and stage.index < self.last:
            return ("grad", action.microbatch)
        return None

    def step(self, stage: _Stage) -> bool:
        """Run the stage's next action if it can; False when it waits (or is done)."""
        if stage.pc == len(stage.actions):
            return False
        action, i = stage.actions[stage.pc], stage.actions[stage.pc].microbatch
        if action.op in COMPUTE_OPS:
            needed = self.needs(stage, action)
            if needed is not None:
                self.deliver(stage)
                if needed not in stage.received:
                    return False
                if not stage.received.pop(needed).ok:
                    stage.failed = True
            if self.failure == (stage.index, stage.computes):
                stage.failed = True
            stage.computes += 1
        elif action.op is Op.RECV_ACT:
            stage.posted["act"].append(i)
        elif action.op is Op.RECV_GRAD:
            stage.posted["grad"].append(i)
        elif action.op is Op.SEND_ACT:
            if stage.header_sent is None:
                stage.header_sent = not stage.failed
                self.send(stage, stage.index + 1, Frame("header", i, stage.header_sent, 0))
            size = ACT_TENSORS if stage.header_sent else 0
            self.send(stage, stage.index + 1, Frame("act", i, not stage.failed, size))
        elif action.op is Op.SEND_GRAD:
            size = GRAD_TENSORS if stage.header_received else 0
            self.send(stage, stage.index - 1, Frame("grad", i, not stage.failed, size))
        stage.pc += 1
        return True


def check_order(
    lists: Sequence[Sequence[Action]], failure: tuple[int, int] | None = None
) -> None:
    """Raise `ScheduleError` unless every receive of every stage's lowered list meets the
    frame it names, of the size it expects, with `failure=(stage, k)` failing that stage
    in its k-th compute action (module doc); one list per stage, stage 0 first."""
    wire = _Wire(lists, failure)
    progressed = True
    while progressed:
        progressed = False
        for stage in wire.stages:
            while wire.step(stage):
                progressed = True
    for stage in wire.stages:
        wire.deliver(stage)
    stuck = {s.index: s.actions[s.pc] for s in wire.stages if s.pc < len(s.actions)}
    if stuck:
        raise ScheduleError(f"deadlock: stages wait forever at {stuck}")
    left = {pair: list(frames) for pair, frames in wire.channels.items() if frames}
    unmatched = {s.index: {k: list(v) for k, v in s.posted.items() if v} for s in wire.stages
                 if any(s.posted.values())}  # fmt: skip
    if left or unmatched:
        raise ScheduleError(f"messages nobody received: {left}; receives never met: "
                            f"{unmatched}")  # fmt: skip
