"""Run one rank's action list for a step; a failure anywhere becomes one error on every rank.

This module holds `Run`, which walks the list (protocol steps 1 and 2 below);
`pipeline.distributed.flushed_step` holds the whole flushed step around it (steps 0, 3
and 4: the Bi-Partition exchanges, the agreement at OPTIMIZER_STEP, the optimizer steps).

The schedule (`pipeline.pure.schedule`) gives each rank a lowered list of actions; this
module executes it against the rank's stages' layers (`pipeline.local.stage`) and its links
to the stages on other ranks (`pipeline.distributed.links`). A rank holds one stage, or
several under an interleaved or V placement (`pipeline.pure.placement`): then every action
names its stage, and between two stages of the rank the outputs (forward) or the inputs'
gradients (backward) are handed over in memory, as a message would have brought them
(`Run._pass_on`); a failure on any of the rank's stages stops the rank's compute. The
protocol of a training step, numbered (a "stage" below is a rank's set of stages):

    0. Under Bi-Partition, owners of handed layers send their weights to the replicas
       (`pipeline.distributed.handoff`).
    1. Every stage runs its list: RECV_* and SEND_* put a receive or a send in the open
       group, which goes out as one before each compute action; FORWARD/BACKWARD compute
       (waiting for their message first). A split backward (`zbh1`) is BACKWARD_INPUT,
       which receives and sends like BACKWARD, and later BACKWARD_WEIGHT, which exchanges
       nothing: the micro-batch stays in `live` until it ends.
    2. An exception in a layer's forward or backward (either half of a split one), in the
       loss, or in the checks of a send stops compute on that stage. The stage still walks
       the rest of its list, but sends a failure in place of every message it owes and
       drains every message it is owed. A neighbour that receives a failure does the same,
       so the news runs both ways along the pipeline within the step, and no stage is left
       waiting. BACKWARD_WEIGHT owes and is owed nothing: a failed stage skips it.
    3. At OPTIMIZER_STEP (the last action of every list) each stage waits for its sends
       (and, under Bi-Partition, the handed layers' gradients reach their owners,
       `pipeline.distributed.handoff`), then one all_reduce of [failed, loss sum, first
       non-finite micro-batch] decides for all: if any stage failed, nobody applies the
       step and every rank raises the failing stage's `StageError` (gathered once); if the
       loss is not finite and
       on_nonfinite="raise", nobody applies it and every rank raises `NonFiniteLossError`;
       otherwise every stage applies its optimizer step.
    4. An exception in an optimizer step is agreed by a second all_reduce and raised on
       every rank (the other stages' steps stand: each stage's update is its own).

    1F1B, 2 stages, 3 micro-batches; stage 1 raises in the forward of micro-batch 1 (x):

        stage 0:  F0 F1    B0 F2    B1~ B2~  | all_reduce [failed] -> raise StageError
        stage 1:     F0 B0    F1x  ~F2 ~B2   | all_reduce [failed] -> raise StageError

    After F1x stage 1 computes nothing: it drains micro-batch 2's activations (~F2) and
    sends failures in place of the gradients of micro-batches 1 and 2, which stage 0's
    B1 and B2 receive (B1~, B2~) and drain. Neither stage applies its optimizer step.

After a failed step nothing is in flight: the caller drops the stage's gradients
(`Stage.abort_step`) and the pipeline is ready for another step or a `reconfigure`.
Exceptions raised by the process group itself (a dead peer, a timeout) are not caught here:
the group is broken, and `pipeline.launch` reports the stage that died.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import torch

from pipeline.distributed.comm import Comm, raise_first
from pipeline.distributed.links import ACT, GRAD, PeerFailed, PeerLink, Receive
from pipeline.errors import StageError
from pipeline.local.carry import Carry
from pipeline.local.stage import ComputeError, InFlight, Stage
from pipeline.pure.actions import COMPUTE_OPS
from pipeline.pure.schedule import Action, Op

__all__ = ["LOCAL", "Edge", "Edges", "Run", "peer_links"]

T = TypeVar("T")
Batches = Sequence[T] | Mapping[int, T]  # micro-batch i's item at [i] (a stream: a dict)
LOCAL = "local"  # an edge to a stage on this same rank: the carry is handed over in memory
Edge = PeerLink | str | None  # a link to the stage on another rank, LOCAL, or no neighbour
Edges = tuple[Edge, Edge]  # (towards stage - 1, towards stage + 1)


class Run:
    """The state of one step on one rank: posted receives, micro-batches in flight.

    A rank runs one list for all its stages: `stages` maps each action's `stage` (global)
    to the Stage it runs on and `edges` to that stage's neighbours. Between two stages of
    this rank nothing goes on the wire: the producer's outputs (forward) or inputs'
    gradients (backward) are handed to the consumer in memory, as a message would have
    brought them (`pipeline.pure.placement`).
    """

    def __init__(
        self,
        stages: Mapping[int, Stage],
        edges: Mapping[int, Edges],
        comm: Comm,
        step: int,
        inputs: Batches[Carry] | None,
        targets: Batches[Any] | None,
    ) -> None:
        self.stages, self.edges, self.comm = stages, edges, comm
        self.step, self.inputs, self.targets = step, inputs, targets
        self.pending: dict[tuple[Op, int, int], Receive] = {}
        self.live: dict[tuple[int, int], InFlight] = {}
        self.outputs: dict[tuple[int, int], Carry] = {}  # to send, or the last stage's result
        self.input_grads: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.handed: dict[tuple[Op, int, int], Carry] = {}  # same-rank hand-overs, as received
        self.losses: dict[int, torch.Tensor] = {}
        self.failure: StageError | None = None  # raised here
        self.peer_failed = False  # a neighbour sent a failure
        self.inference = False
        for link in self.links():
            link.begin_step()

    @property
    def failed(self) -> bool:
        return self.failure is not None or self.peer_failed

    @property
    def stage(self) -> Stage:
        """The rank's first stage (its timeline row for waits that concern no one stage)."""
        return self.stages[min(self.stages)]

    def links(self) -> list[PeerLink]:
        """This rank's links to other ranks' stages, each once."""
        return peer_links(self.edges)

    def execute(self, actions: Sequence[Action]) -> None:
        for action in actions:
            if action.op is Op.OPTIMIZER_STEP:
                return  # the caller agrees on the step first (protocol step 3)
            self.act(action)

    def act(self, action: Action) -> None:
        """Run one non-optimizer action; after a failure here or at a peer, unblock instead.

        Before a compute action the messages since the last one go out as one group
        (`pipeline.distributed.links`, rule 3)."""
        if action.op in COMPUTE_OPS:
            self.comm.post()
        if not self.failed:
            try:
                self._do(action)
                return
            except PeerFailed:
                self.peer_failed = True
            except ComputeError as error:
                self.failure = self.stage_error(
                    error.phase, error.error, error.layer, error.microbatch, action.stage_index
                )
            except (ValueError, TypeError, RuntimeError) as error:  # a send's checks
                if action.op not in (Op.SEND_ACT, Op.SEND_GRAD):
                    raise
                self.failure = self.stage_error(
                    "send", error, None, action.microbatch_index, action.stage_index
                )
        self._unblock(action)

    # -- healthy -----------------------------------------------------------------------------
    def _do(self, action: Action) -> None:
        """Run `action` by its kind: one table lookup, no chain of tests."""
        _HANDLERS[action.op](self, action.stage_index, action.microbatch_index)

    def _recv_act(self, k: int, i: int) -> None:
        prev = self.edges[k][0]
        assert isinstance(prev, PeerLink)
        self.pending[(Op.RECV_ACT, k, i)] = prev.recv_activations(i)

    def _recv_grad(self, k: int, i: int) -> None:
        nxt = self.edges[k][1]
        assert isinstance(nxt, PeerLink)
        self.pending[(Op.RECV_GRAD, k, i)] = nxt.recv_gradients(i)

    def _forward(self, k: int, i: int) -> None:
        stage, nxt = self.stages[k], self.edges[k][1]
        carry = self._wait(Op.RECV_ACT, k, i, "F") or self._first_input(k, i)
        carry = stage.input_carry(carry, i)
        if self.inference:
            self._pass_on(Op.FORWARD, k, i, stage.infer(i, carry), nxt)
            return
        target = self.targets[i] if self.targets is not None else None
        state = self.live[(k, i)] = stage.forward(i, carry, target)
        if nxt is not None:  # the last stage keeps only the loss
            wire = state.wire if state.wire is not None else state.outputs[-1]
            self._pass_on(Op.FORWARD, k, i, wire, nxt)
        if state.loss is not None:
            self.losses[i] = state.loss.detach()

    def _send_act(self, k: int, i: int) -> None:
        stage, nxt = self.stages[k], self.edges[k][1]
        assert isinstance(nxt, PeerLink)
        flags = None if self.inference else stage.wire_grads
        nxt.send_activations(self.outputs.pop((k, i)), i, flags)

    def _backward(self, k: int, i: int, split: bool = False) -> None:
        stage, prev = self.stages[k], self.edges[k][0]
        name = "BI" if split else "B"
        grads = self._wait(Op.RECV_GRAD, k, i, name) or self._handed(Op.RECV_GRAD, k, i)
        grads = tuple(g.to(stage.device) for g in grads)
        state = self.live[(k, i)] if split else self.live.pop((k, i))
        input_grads = stage.backward(state, i, grads, split=split)
        if prev is not None:  # stage 0 has no one to send to
            self._pass_on(Op.BACKWARD, k, i, tuple(input_grads), prev)

    def _backward_input(self, k: int, i: int) -> None:
        self._backward(k, i, split=True)

    def _backward_weight(self, k: int, i: int) -> None:
        self.stages[k].backward_weight(self.live.pop((k, i)), i)

    def _send_grad(self, k: int, i: int) -> None:
        prev = self.edges[k][0]
        assert isinstance(prev, PeerLink)
        prev.send_gradients(list(self.input_grads.pop((k, i))), i)

    def _pass_on(self, op: Op, k: int, i: int, carry: Carry, edge: Edge) -> None:
        """A compute's result: to its SEND action, to a stage on this rank, or kept (the
        last stage's inference output)."""
        backward = op is not Op.FORWARD
        if edge == LOCAL:  # the neighbour is on this rank: it takes it as if received
            self.handed[(Op.RECV_GRAD, k - 1, i) if backward else (Op.RECV_ACT, k + 1, i)] = carry
        elif backward:
            self.input_grads[(k, i)] = list(carry)
        else:
            self.outputs[(k, i)] = carry

    def _first_input(self, k: int, i: int) -> Carry:
        if self.edges[k][0] == LOCAL:
            return self._handed(Op.RECV_ACT, k, i)
        assert self.inputs is not None, "stage 0 gets the batch"
        return self.inputs[i]

    def _handed(self, op: Op, k: int, i: int) -> Carry:
        """What a stage on this rank handed stage k for micro-batch i (() for none: the
        last stage's backward starts from its loss)."""
        return self.handed.pop((op, k, i), ())

    def _wait(self, op: Op, k: int, i: int, name: str) -> Carry | None:
        receive = self.pending.pop((op, k, i), None)
        if receive is None:
            return None
        stage = self.stages[k]
        t0 = stage.now()
        try:
            return receive.wait()
        finally:
            stage.times.wait_s += stage.span(f"wait {name}{i}", t0, "wait")

    # -- failed: send failures, drain receives (protocol step 2) ------------------------------
    def _unblock(self, action: Action) -> None:
        op, i, k = action.op, action.microbatch_index, action.stage_index
        prev, nxt = self.edges[k]
        if op in (Op.RECV_ACT, Op.RECV_GRAD):
            self._do(action)
        elif op in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT):
            wanted = Op.RECV_ACT if op is Op.FORWARD else Op.RECV_GRAD
            self.handed.pop((wanted, k, i), None)
            receive = self.pending.pop((wanted, k, i), None)
            if receive is not None:
                receive.drain()
        elif op is Op.SEND_ACT:
            assert isinstance(nxt, PeerLink)
            nxt.send_failure(ACT, i)
        elif op is Op.SEND_GRAD:
            assert isinstance(prev, PeerLink)
            prev.send_failure(GRAD, i)

    def stage_error(
        self,
        phase: str,
        error: BaseException,
        layer: str | None,
        microbatch: int | None,
        stage: int | None = None,
    ) -> StageError:
        text = "".join(traceback.format_exception(error))
        cause = f"{type(error).__name__}: {error}"
        index = self.stages[stage].index if stage is not None else self.stage.index
        failure = StageError(
            index, phase, self.step, cause, text, layer=layer, microbatch=microbatch
        )
        failure.__cause__ = error
        return failure

    def wait_sends(self) -> None:
        self.comm.post()
        t0 = self.stage.now()
        for link in self.links():
            link.wait_sends()
        self.stage.times.wait_s += self.stage.span("wait sends", t0, "wait")

    def raise_agreed(self, comm: Comm) -> None:
        """Every rank knows a stage failed: gather the errors, raise the origin's."""
        raise_first(comm.all_gather_object(self.failure), comm.rank, self.failure)


# what `Run._do` calls for each kind of action (OPTIMIZER_STEP is the caller's: protocol step 3)
_HANDLERS: dict[Op, Callable[[Run, int, int], None]] = {
    Op.RECV_ACT: Run._recv_act,
    Op.RECV_GRAD: Run._recv_grad,
    Op.FORWARD: Run._forward,
    Op.SEND_ACT: Run._send_act,
    Op.BACKWARD: Run._backward,
    Op.BACKWARD_INPUT: Run._backward_input,
    Op.BACKWARD_WEIGHT: Run._backward_weight,
    Op.SEND_GRAD: Run._send_grad,
}


def peer_links(edges: Mapping[int, Edges]) -> list[PeerLink]:
    """The links among `edges` (not the hand-overs, not the ends), each once, in order."""
    found = [e for pair in edges.values() for e in pair if isinstance(e, PeerLink)]
    return list(dict.fromkeys(found))
