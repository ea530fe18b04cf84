"""Training as a stream: `ElasticPipeline.train(batches)`, and PipeDream-2BW without flushes.

A flushed schedule (gpipe, 1f1b, zbh1) streams by running `train_step` per batch. A stream
schedule (`2bw`, `pipeline.pure.two_bw`) runs one lowered action list across the steps of
a *segment*: warm-up at its start, cool-down at its end, none in between. A segment ends
when the batches end, when a batch's shapes differ from the segment's first (the links
agree on carry shapes once per segment), or when the pipeline is asked to do anything
else (`train_step`, `repartition`, `reconfigure`, ...: `drain`). The protocol, per stage
(u = updates applied; step t computes with W(t - 1), `pipeline.local.versions`):

    1. Batches are pulled lazily, when the list first needs step t's forward
       (`stream_actions` asks `has_step(t)`); every rank pulls the same batches in the
       same order, so every rank's list names the same steps. Micro-batch i of step t is
       g = t * M + i in the list and in the frames on the wire.
    2. OPTIMIZER_STEP(t) (after this stage's last backward of step t): wait for A(t - 1) if
       it is still open (3), then *post* A(t) = all_reduce [failed here?, the last stage's
       loss sum of step t, first non-finite micro-batch], asynchronously, and go on with
       step t + 1's work. At most one agreement is open per rank, so every rank posts
       A(0), A(1), ... in the same order and no other collective can slip between them.
    3. A(t) is waited for when the version it guards is first needed: before this stage's
       first forward of step t + 2 (which uses W(t + 1)), at OPTIMIZER_STEP(t + 1), or at
       the end of the segment. If it agrees "healthy", the stage applies update t (W(t) ->
       W(t + 1), with the gradients of step t, computed at W(t - 1)) and the generator
       yields step t's loss (the same on every rank). Stage 0 posts A(t) before its first
       forward of step t + 2, and every later stage waits for A(t) only after receiving
       something stage 0 sent after that: the wait finds A(t) complete, no flush.
    4. A failure (`pipeline.distributed.executor`, steps 1-2) stops compute on its stage
       and, through the failure messages, on its neighbours; their next agreement says so.
       Every rank learns it from the same A(t): it stops pulling batches (one all_reduce
       of the steps pulled so far fixes the segment's length on every rank), walks the rest
       of its list sending failures and draining receives, then the errors are gathered
       and every rank raises the failing stage's `StageError` (or `NonFiniteLossError`)
       from the generator. Updates before step t stand; step t and later are dropped.
    5. Drain (`drain`, between two yields, when every rank has posted and waited the same
       agreements): one all_reduce agrees on the steps pulled, every rank pulls up to it,
       and the segment runs its cool-down; the losses wait in a buffer for the generator.

    2 stages, M = 2 (A(t) posted at Pt, waited at Wt; Ut: update t applied):

        stage 0:  F0 F1 B0 F2 B1 P0 F3 B2 W0 U0 F4 B3 P1 F5 B4 W1 U1 F6 ...
        stage 1:     F0 B0 F1 B1 P0 F2 B2 F3 B3 W0 U0 P1 F4 B4 F5 B5 W1 U1 P2 ...

PipeMare (`schedule="pipemare"`, `pipeline.pure.pipemare`) runs the same list and the same
agreements with one weight copy (`pipeline.local.asynchronous`). Its protocol, per stage:

    P1. F(g) records how many updates this stage has applied; B(g) runs with the storage at
        the current weights (T2: extrapolated back by the updates since F(g), put back
        right after); after B(g) with (g + 1) % N == 0 the stage updates in place, at once,
        from its own gradients (T1: lr rescaled by its delay). No agreement guards it.
    P2. OPTIMIZER_STEP(t) posts A(t) as in step 2; waiting for A(t) (step 3) applies
        nothing: it yields step t's loss and closes step t's times. Every stage applies
        M / N updates per step, so after a drain all stages hold the same count.
    P3. A failure (step 4) stops compute as for 2BW, but updates already applied stand on
        each stage (there is no second copy to fall back to): after a `StageError` the
        stages may have applied different numbers of updates of the failing step and the
        one before; `pipe.model.step` counts the steps agreed healthy.
    P4. A drain (step 5) lets every micro-batch in flight finish: the next segment's first
        forwards see every update, so a stream split in two differs from one stream
        (`ReferenceTrainer.drain` models it); a layer's staleness is its stage's.

After a segment every stage has applied the same updates; both weight versions stay with
the stage (and travel with its layers in a migration), so the next segment, or a stream
split in two, trains exactly as one long stream does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pipeline.distributed import report
from pipeline.distributed.comm import PendingReduce
from pipeline.distributed.flushed_step import sum_losses
from pipeline.distributed.parts import StreamedPipeline
from pipeline.errors import NonFiniteLossError, PipelineError, StageError
from pipeline.local.carry import Carry, as_carry
from pipeline.local.microbatch import batch_size, split_microbatches
from pipeline.local.stage import ComputeError
from pipeline.pure.actions import COMPUTE_OPS, Op
from pipeline.pure.schedule import lower_lazily
from pipeline.pure.two_bw import stream_actions

__all__ = ["Segment", "train"]

# A segment counts saved activations over its first steps' micro-batches: the warm-up and
# one steady-state step, where each stage reaches its in-flight peak (a hook per saved
# tensor is not free, so the rest of the segment runs without). Those steps, and every
# `measure_memory_every`-th, run layer by layer and time each layer; the others run each
# stage as one graph (`pipeline.local.fused`).
_MEASURED_STEPS = 2


def train(pipe: StreamedPipeline, batches: Iterable[tuple[Any, Any]]) -> Iterator[float]:
    """Each step's loss, one segment after another (module doc)."""
    source = iter(batches)
    carried: tuple[Any, Any] | None = None  # a batch that ended the previous segment
    while True:
        pipe.drain()
        if carried is None:
            carried = next(source, None)
            if carried is None:
                return
        pipe.plan_for(carried[0])
        segment = Segment(pipe, source, carried)
        pipe.hold_stream(segment)
        while (loss := segment.next_loss()) is not None:
            yield loss
        if pipe.active_stream is segment:  # finished, and no other stream took its place
            pipe.hold_stream(None)
        carried = segment.leftover
        if carried is None and segment.exhausted:
            return


def _shapes(obj: Any) -> Any:
    if torch.is_tensor(obj):
        return (tuple(obj.shape), obj.dtype)
    if isinstance(obj, list | tuple):
        return tuple(_shapes(o) for o in obj)
    return type(obj).__name__


class Segment:
    """One run of a stream schedule's list without a flush (module doc)."""

    def __init__(self, pipe: StreamedPipeline, source: Iterator[Any], first: tuple[Any, Any]):
        self.pipe, self.source, self.m = pipe, source, pipe.options.n_microbatches
        self.stage, self.comm = pipe.model.live_stage("a stream (2bw, pipemare)"), pipe.comm
        self.start = pipe.model.step  # the global step of the segment's step 0
        # micro-batch g's input and target until its forward, step t's size until it is
        # settled: what no later action needs is dropped, so a segment of any length holds
        # only what is in flight (`held`)
        self.inputs: dict[int, Carry] = {}
        self.targets: dict[int, Any] = {}
        self.sizes: dict[int, tuple[int, int | None]] = {}  # step -> (samples, tokens)
        self.pulled = 0  # steps pulled so far
        self.shapes = _shapes(first)
        self.leftover: tuple[Any, Any] | None = None
        self.exhausted = False
        self.limit: int | None = None  # the segment's number of steps, once known
        self.error: BaseException | None = None  # a batch that could not be split
        self.buffer: list[float] = []
        self.open: list[tuple[int, PendingReduce]] = []  # the posted, unwaited agreement
        self.failed_at: int | None = None
        self.nonfinite: tuple[int, float, float] | None = None  # (step, loss, first bad)
        self._add(first)
        self._run = pipe.runner.open_run(self.stage, self.start, self.inputs, self.targets)
        self._gen = self._steps()

    def held(self) -> dict[str, int]:
        """How many entries each container of this segment holds now (read-only): they stay
        bounded by the micro-batches in flight however long the stream runs."""
        run = self._run
        return {
            "inputs": len(self.inputs),
            "targets": len(self.targets),
            "sizes": len(self.sizes),
            "agreements": len(self.open),
            "losses": len(self.buffer) + len(run.losses),
            "receives": len(run.pending),
            "in_flight": len(run.live),
            "outputs": len(run.outputs),
            "input_grads": len(run.input_grads),
            "sends": self.pipe.runner.sends_in_flight,
            "spans": len(self.stage.spans),
        }

    # -- batches (protocol step 1) -------------------------------------------------------
    def _add(self, batch: tuple[Any, Any]) -> None:
        x, y = batch
        t = self.pulled
        chunks = split_microbatches(x, self.m, "x")
        targets = split_microbatches(y, self.m, "y")
        for i, (c, target) in enumerate(zip(chunks, targets, strict=True)):
            self.inputs[t * self.m + i] = as_carry(c, "the batch input")
            self.targets[t * self.m + i] = target
        self.sizes[t] = (batch_size(x), report.token_count(x))
        self.pulled += 1

    def has_step(self, t: int) -> bool:
        while self.pulled <= t and self._pull():
            pass
        return t < self.pulled

    def _pull(self) -> bool:
        """Pull one more batch into the segment; False when the segment must end there."""
        if self.limit is not None:
            if self.pulled >= self.limit:
                return False
            batch = next(self.source, None)
            if batch is None:
                raise PipelineError("the ranks were given batch streams of different lengths")
            self._add(batch)
            return True
        if self.error is not None or self.leftover is not None or self.exhausted:
            return False
        batch = next(self.source, None)
        if batch is None:
            self.exhausted = True
            return False
        if _shapes(batch) != self.shapes:
            self.leftover = batch  # the next segment starts with it
            return False
        try:
            self._add(batch)
        except (ValueError, TypeError) as error:  # the same on every rank
            self.error = error
            return False
        return True

    # -- the list ------------------------------------------------------------------------
    def next_loss(self) -> float | None:
        if not self.buffer:
            next(self._gen, None)
        return self.buffer.pop(0) if self.buffer else None

    def drain(self) -> None:
        """Run the cool-down now (protocol step 5); losses wait in the buffer."""
        self._fix_limit()
        for _ in self._gen:
            pass

    def _fix_limit(self) -> None:
        if self.limit is None:
            self.limit = int(self.comm.all_reduce([self.pulled], op="max")[0])

    def _steps(self) -> Iterator[None]:
        stage, run, m = self.stage, self._run, self.m
        config = self.pipe.options.pipemare
        if config is None:
            stage.enable_versions(self.start)
        else:  # T1's counter: every stage has applied M / N updates per step
            stage.enable_pipemare(config, self.start * m // config.update_every, m)
        stage.measure_stream(_MEASURED_STEPS * m)
        stage.begin_step(self.start, m, True, stream=True)
        computes = stream_actions(self.comm.world_size, m, self.comm.rank, self.has_step)
        last_step = -1
        try:
            for action in lower_lazily(computes, self.comm.rank, self.comm.world_size):
                if action.op in (Op.OPTIMIZER_STEP, Op.FORWARD):
                    self.comm.post()  # nothing stays open while this rank waits to agree
                if action.op is Op.OPTIMIZER_STEP:
                    assert action.step is not None  # a stream's list numbers its steps
                    yield from self._settle(action.step - 1)
                    self._post(action.step)
                    last_step = action.step
                    continue
                step = action.microbatch_index // m
                if action.op is Op.FORWARD:
                    yield from self._settle(step - 2)
                if action.op in COMPUTE_OPS:
                    stage.use_step(self.start + step)
                if run.failure is None:
                    run.act(action)
                    if run.failure is not None:  # name the step and its own micro-batch
                        run.failure = self._globally(run.failure)
                else:
                    run.act(action)
                if action.op is Op.FORWARD:  # its input and target are needed no more
                    self.inputs.pop(action.microbatch_index, None)
                    self.targets.pop(action.microbatch_index, None)
            self.comm.post()  # the last compute's sends: the peers need them to agree A(last)
            yield from self._settle(last_step)
            run.wait_sends()
        except BaseException:
            stage.abort_step()
            raise
        self._finish()

    def _post(self, t: int) -> None:
        """Protocol step 2: post A(t) (a failed segment agrees nothing more)."""
        if self.failed_at is not None:
            return
        run, first = self._run, t * self.m
        losses = {g: run.losses.pop(g) for g in range(first, first + self.m) if g in run.losses}
        loss_sum, first_bad = sum_losses(losses)
        reduce = self.comm.all_reduce_async([float(run.failed), loss_sum, first_bad])
        self.open.append((t, reduce))

    def _settle(self, t: int) -> Iterator[None]:
        """Protocol step 3: wait for A(t), apply update t, hand out step t's loss."""
        if not self.open or self.open[0][0] > t or self.failed_at is not None:
            return
        step, reduce = self.open.pop(0)
        failed, loss_sum, first_bad = reduce.wait()
        self._release_sends(step)
        loss = loss_sum / self.m
        nonfinite = self.pipe.options.on_nonfinite == "raise" and not math.isfinite(loss)
        if failed or nonfinite:
            if nonfinite and not failed:
                self.nonfinite = (step, loss, first_bad)
            self.failed_at = step
            self._run.peer_failed = True  # compute stops here; messages still flow
            self._fix_limit()
            return
        try:
            if self.pipe.options.pipemare is None:  # PipeMare updated during the step (module doc)
                self.stage.optimizer_step()
        except ComputeError as exc:  # agreed in A(t + 1) or at the end (protocol step 4)
            failure = self._run.stage_error("optimizer", exc.error, None, None)
            self._run.failure = self._globally(failure, self.start + step)
        times = self.stage.end_step()
        every = self.pipe.options.elastic.measure_memory_every
        measures = step + 1 < _MEASURED_STEPS or (self.start + step + 1) % every == 0
        self.stage.begin_step(self.start + step + 1, self.m, measures, keep_spans=True, stream=True)
        samples, tokens = self.sizes.pop(step)
        self.pipe.model.stepped(samples, tokens, times)
        self.buffer.append(loss)
        yield

    def _release_sends(self, t: int) -> None:
        """Every rank posted A(t) after its last backward of step t, so every message of
        steps <= t was received: their sends are done and need not be held."""
        self.pipe.runner.release_sends((t + 1) * self.m)

    def _globally(self, failure: StageError, step: int | None = None) -> StageError:
        """The error with the global step and the micro-batch's index within its step."""
        g = failure.microbatch
        if step is None:
            step = self.start + (g // self.m if g is not None else 0)
        error = StageError(
            failure.stage,
            failure.phase,
            step,
            failure.cause,
            failure.traceback,
            layer=failure.layer,
            microbatch=None if g is None else g % self.m,
        )
        error.__cause__ = failure.__cause__
        return error

    def _finish(self) -> None:
        """Agree once more on the whole segment; raise on every rank if it failed."""
        run = self._run
        (failed,) = self.comm.all_reduce([float(run.failure is not None)])
        if self.nonfinite is not None:
            self.stage.abort_step()
            step, loss, first_bad = self.nonfinite
            raise NonFiniteLossError(
                self.comm.world_size - 1,
                "loss",
                self.start + step,
                f"the loss is {loss} (mean of the micro-batches)",
                microbatch=int(first_bad) - 1 if first_bad else None,
            )
        if failed or self.failed_at is not None:
            self.stage.abort_step()
            run.raise_agreed(self.comm)
        if self.error is not None:
            raise self.error
