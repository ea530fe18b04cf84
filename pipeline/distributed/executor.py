"""Run one stage's action list for a step; a failure anywhere becomes one error on every rank.

The schedule (`pipeline.pure.schedule`) gives each stage a lowered list of actions; this
module executes it against the stage's layers (`pipeline.local.stage`) and its links to the
neighbours (`pipeline.distributed.links`). The protocol of a training step, numbered:

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

import math
import traceback
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch

from pipeline.distributed import handoff
from pipeline.distributed.comm import Comm, raise_first
from pipeline.distributed.links import ACT, GRAD, PeerFailed, PeerLink, Receive
from pipeline.errors import NonFiniteLossError, StageError
from pipeline.local.carry import Carry
from pipeline.local.stage import ComputeError, InFlight, Stage, StepTimes
from pipeline.pure.actions import COMPUTE_OPS
from pipeline.pure.schedule import Action, Op

__all__ = ["Run", "infer", "sum_losses", "train_step"]

T = TypeVar("T")
Batches = Sequence[T] | Mapping[int, T]  # micro-batch i's item at [i] (a stream: a dict)


class Run:
    """The state of one step on one stage: posted receives, micro-batches in flight."""

    def __init__(
        self,
        stage: Stage,
        links: tuple[PeerLink | None, PeerLink | None],
        comm: Comm,
        step: int,
        inputs: Batches[Carry] | None,
        targets: Batches[Any] | None,
    ) -> None:
        self.stage, (self.prev, self.next), self.comm = stage, links, comm
        self.step, self.inputs, self.targets = step, inputs, targets
        self.pending: dict[tuple[Op, int], Receive] = {}
        self.live: dict[int, InFlight] = {}
        self.outputs: dict[int, Carry] = {}
        self.input_grads: dict[int, list[torch.Tensor]] = {}
        self.losses: dict[int, torch.Tensor] = {}
        self.failure: StageError | None = None  # raised here
        self.peer_failed = False  # a neighbour sent a failure
        self.inference = False
        for link in links:
            if link is not None:
                link.begin_step()

    @property
    def failed(self) -> bool:
        return self.failure is not None or self.peer_failed

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
                self.failure = self.stage_error(error.phase, error.error, error.layer,
                                                error.microbatch)  # fmt: skip
            except (ValueError, TypeError, RuntimeError) as error:  # a send's checks
                if action.op not in (Op.SEND_ACT, Op.SEND_GRAD):
                    raise
                self.failure = self.stage_error("send", error, None, action.microbatch)
        self._unblock(action)

    # -- healthy -----------------------------------------------------------------------------
    def _do(self, action: Action) -> None:
        op, i, stage = action.op, action.microbatch, self.stage
        if op is Op.RECV_ACT:
            assert self.prev is not None
            self.pending[(op, i)] = self.prev.recv_activations(i)
        elif op is Op.RECV_GRAD:
            assert self.next is not None
            self.pending[(op, i)] = self.next.recv_gradients(i)
        elif op is Op.FORWARD:
            carry = stage.input_carry(self._wait(Op.RECV_ACT, i, "F") or self._batch(i), i)
            if self.inference:
                self.outputs[i] = stage.infer(i, carry)
                return
            target = self.targets[i] if self.targets is not None else None
            state = self.live[i] = stage.forward(i, carry, target)
            if self.next is not None:  # SEND_ACT takes it; the last stage keeps only the loss
                self.outputs[i] = state.wire if state.wire is not None else state.outputs[-1]
            if state.loss is not None:
                self.losses[i] = state.loss.detach()
        elif op is Op.SEND_ACT:
            assert self.next is not None
            flags = None if self.inference else self.stage.wire_grads
            self.next.send_activations(self.outputs.pop(i), i, flags)
        elif op in (Op.BACKWARD, Op.BACKWARD_INPUT):
            grads = self._wait(Op.RECV_GRAD, i, op.value) or ()
            grads = tuple(g.to(stage.device) for g in grads)
            split = op is Op.BACKWARD_INPUT
            state = self.live[i] if split else self.live.pop(i)
            input_grads = stage.backward(state, i, grads, split=split)
            if self.prev is not None:  # SEND_GRAD takes them; stage 0 has no one to send to
                self.input_grads[i] = input_grads
        elif op is Op.BACKWARD_WEIGHT:
            stage.backward_weight(self.live.pop(i), i)
        elif op is Op.SEND_GRAD:
            assert self.prev is not None
            self.prev.send_gradients(self.input_grads.pop(i), i)

    def _batch(self, i: int) -> Carry:
        assert self.inputs is not None, "stage 0 gets the batch"
        return self.inputs[i]

    def _wait(self, op: Op, i: int, name: str) -> Carry | None:
        receive = self.pending.pop((op, i), None)
        if receive is None:
            return None
        t0 = self.stage.now()
        try:
            return receive.wait()
        finally:
            self.stage.times.wait_s += self.stage.span(f"wait {name}{i}", t0, "wait")

    # -- failed: send failures, drain receives (protocol step 2) ------------------------------
    def _unblock(self, action: Action) -> None:
        op, i = action.op, action.microbatch
        if op in (Op.RECV_ACT, Op.RECV_GRAD):
            self._do(action)
        elif op in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT):
            receive = self.pending.pop((Op.RECV_ACT if op is Op.FORWARD else Op.RECV_GRAD, i),
                                       None)  # fmt: skip
            if receive is not None:
                receive.drain()
        elif op is Op.SEND_ACT:
            assert self.next is not None
            self.next.send_failure(ACT, i)
        elif op is Op.SEND_GRAD:
            assert self.prev is not None
            self.prev.send_failure(GRAD, i)

    def stage_error(
        self, phase: str, error: BaseException, layer: str | None, microbatch: int | None
    ) -> StageError:
        text = "".join(traceback.format_exception(error))
        cause = f"{type(error).__name__}: {error}"
        failure = StageError(self.stage.index, phase, self.step, cause, text, layer=layer,
                             microbatch=microbatch)  # fmt: skip
        failure.__cause__ = error
        return failure

    def wait_sends(self) -> None:
        self.comm.post()
        t0 = self.stage.now()
        for link in (self.prev, self.next):
            if link is not None:
                link.wait_sends()
        self.stage.times.wait_s += self.stage.span("wait sends", t0, "wait")

    def raise_agreed(self, comm: Comm) -> None:
        """Every rank knows a stage failed: gather the errors, raise the origin's."""
        raise_first(comm.all_gather_object(self.failure), comm.rank, self.failure)


def train_step(
    stage: Stage,
    links: tuple[PeerLink | None, PeerLink | None],
    comm: Comm,
    actions: Sequence[Action],
    step: int,
    inputs: Sequence[Carry] | None,
    targets: Sequence[Any] | None,
    *,
    measure_memory: bool = False,
    on_nonfinite: str = "raise",
) -> tuple[float, StepTimes]:
    """One training step on this stage: (the step's mean loss, the same on every rank; times).

    Raises `StageError` (or `NonFiniteLossError`) on every rank if any stage failed; the
    step is then applied nowhere (module docstring).
    """
    n_microbatches = sum(a.op is Op.FORWARD for a in actions)
    stage.begin_step(step, n_microbatches, measure_memory)
    handoff.share_weights(stage, links)  # Bi-Partition: replicas take the owners' weights
    run = Run(stage, links, comm, step, inputs, targets)
    run.execute(actions)
    run.wait_sends()
    handoff.exchange_gradients(stage, links)  # Bi-Partition, `pipeline.distributed.handoff`
    loss_sum, first_bad = sum_losses(run.losses)
    failed, loss_sum, first_bad = comm.all_reduce([float(run.failed), loss_sum, first_bad])
    if failed:
        run.raise_agreed(comm)
    loss = loss_sum / n_microbatches
    if on_nonfinite == "raise" and not math.isfinite(loss):
        raise NonFiniteLossError(
            comm.world_size - 1, "loss", step, f"the loss is {loss} (mean of the micro-batches)",
            microbatch=int(first_bad) - 1 if first_bad else None,
        )  # fmt: skip
    error = None
    try:
        stage.optimizer_step()
    except ComputeError as exc:
        error = run.stage_error("optimizer", exc.error, None, None)
    comm.raise_together(error)
    return loss, stage.end_step()


def sum_losses(losses: dict[int, torch.Tensor]) -> tuple[float, float]:
    """(sum of the micro-batch losses, 1 + the first non-finite one's index or 0)."""
    if not losses:
        return 0.0, 0.0
    values = torch.stack([losses[i] for i in sorted(losses)]).double()
    total = float(values.sum().item())
    if math.isfinite(total):
        return total, 0.0
    bad = [i for i, v in zip(sorted(losses), values.tolist(), strict=True) if not math.isfinite(v)]
    return total, float(bad[0] + 1)


def infer(
    stage: Stage,
    links: tuple[PeerLink | None, PeerLink | None],
    comm: Comm,
    actions: Sequence[Action],
    step: int,
    inputs: Sequence[Carry] | None,
) -> list[Carry] | None:
    """Forward-only actions in eval mode; the last stage's outputs (on CPU) on every rank."""
    run = Run(stage, links, comm, step, inputs, None)
    run.inference = True
    with stage.evaluating(step):
        run.execute(actions)
    run.wait_sends()
    last = comm.world_size - 1
    mine = None
    if comm.rank == last and not run.failed:
        mine = [tuple(t.cpu() for t in run.outputs[i]) for i in sorted(run.outputs)]
    gathered = comm.all_gather_object((run.failed, run.failure, mine))
    if any(failed for failed, _, _ in gathered):
        raise_first([failure for _, failure, _ in gathered], comm.rank, run.failure)
    outputs: list[Carry] | None = gathered[last][2]
    return outputs
