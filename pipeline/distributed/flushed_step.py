"""A whole flushed step on one rank: its list run (`executor.Run`), then one agreement.

`pipeline.distributed.executor` walks a rank's action list and turns a failure into
failures sent to the neighbours (protocol steps 1 and 2 of its docstring). What surrounds
that walk in a flushed step lives here, apart from the walk itself: the Bi-Partition
weight and gradient exchanges (step 0, `pipeline.distributed.handoff`), the all_reduce at
OPTIMIZER_STEP that decides for every rank whether the step is applied (step 3), the
optimizer steps and the agreement on their errors (step 4), and the forward-only `infer`,
whose outputs the last stage's rank broadcasts. `sum_losses` and `merged_times` reduce a step's
micro-batch losses and its stages' times (a stream, `pipeline.distributed.stream`, sums
its losses the same way).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pipeline.distributed import handoff
from pipeline.distributed.comm import Comm, raise_first
from pipeline.distributed.executor import Edges, Run
from pipeline.distributed.links import PeerLink
from pipeline.errors import NonFiniteLossError
from pipeline.local.carry import Carry
from pipeline.local.stage import ComputeError, Stage, StepTimes
from pipeline.pure.schedule import Action, Op

__all__ = ["infer", "merged_times", "sum_losses", "train_step"]


def train_step(
    stages: Mapping[int, Stage],
    edges: Mapping[int, Edges],
    comm: Comm,
    actions: Sequence[Action],
    step: int,
    inputs: Sequence[Carry] | None,
    targets: Sequence[Any] | None,
    *,
    measure_memory: bool = False,
    on_nonfinite: str = "raise",
) -> tuple[float, StepTimes]:
    """One training step on this rank's stages: (the step's mean loss, the same on every
    rank; the rank's times, summed over its stages).

    Raises `StageError` (or `NonFiniteLossError`) on every rank if any stage failed; the
    step is then applied nowhere (`pipeline.distributed.executor`'s protocol, step 3).
    """
    n_microbatches = sum(a.op is Op.FORWARD for a in actions) // len(stages)
    for stage in stages.values():
        stage.begin_step(step, n_microbatches, measure_memory)
    single = _one_stage(stages, edges)
    if single is not None:
        handoff.share_weights(*single)  # Bi-Partition: replicas take the owners' weights
    run = Run(stages, edges, comm, step, inputs, targets)
    run.execute(actions)
    run.wait_sends()
    if single is not None:
        handoff.exchange_gradients(*single)  # Bi-Partition, `pipeline.distributed.handoff`
    loss_sum, first_bad = sum_losses(run.losses)
    failed, loss_sum, first_bad = comm.all_reduce([float(run.failed), loss_sum, first_bad])
    if failed:
        run.raise_agreed(comm)
    loss = loss_sum / n_microbatches
    if on_nonfinite == "raise" and not math.isfinite(loss):
        raise NonFiniteLossError(
            max(s.n_stages for s in stages.values()) - 1,
            "loss",
            step,
            f"the loss is {loss} (mean of the micro-batches)",
            microbatch=int(first_bad) - 1 if first_bad else None,
        )
    error = None
    for k, stage in stages.items():
        try:
            stage.optimizer_step()
        except ComputeError as exc:
            error = error or run.stage_error("optimizer", exc.error, None, None, k)
    comm.raise_together(error)
    return loss, merged_times([stage.end_step() for stage in stages.values()])


def _one_stage(
    stages: Mapping[int, Stage], edges: Mapping[int, Edges]
) -> tuple[Stage, tuple[PeerLink | None, PeerLink | None]] | None:
    """The rank's stage and its links when it holds one (Bi-Partition runs only then)."""
    if len(stages) != 1:
        return None
    (stage,), ((prev, nxt),) = stages.values(), edges.values()
    assert not isinstance(prev, str) and not isinstance(nxt, str), "one stage: no hand-over"
    return stage, (prev, nxt)


def merged_times(times: Sequence[StepTimes]) -> StepTimes:
    """One rank's times from its stages': compute and waits add up (they share the rank),
    the step's length is the longest, and the in-flight peaks add up (a bound: both
    stages may peak at once)."""
    if len(times) == 1:
        return times[0]
    return StepTimes(
        forward_s=sum(t.forward_s for t in times),
        backward_s=sum(t.backward_s for t in times),
        wait_s=sum(t.wait_s for t in times),
        optimizer_s=sum(t.optimizer_s for t in times),
        total_s=max(t.total_s for t in times),
        peak_activation_bytes=sum(t.peak_activation_bytes for t in times),
        allocator_peak_bytes=max(t.allocator_peak_bytes for t in times),
        forwards=sum(t.forwards for t in times),
        fused_forwards=sum(t.fused_forwards for t in times),
    )


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
    stages: Mapping[int, Stage],
    edges: Mapping[int, Edges],
    comm: Comm,
    actions: Sequence[Action],
    step: int,
    inputs: Sequence[Carry] | None,
    last_rank: int,
) -> Carry:
    """Forward-only actions in eval mode; the last stage's outputs, its micro-batches
    concatenated (on CPU), on every rank.

    `last_rank` holds the last stage. It concatenates the outputs, every rank learns their
    layout (or the failure) in one small gather, and then their bytes in one broadcast
    (`Comm.broadcast_tensors`), rather than pickled to and from every rank."""
    run = Run(stages, edges, comm, step, inputs, None)
    run.inference = True
    with contextlib.ExitStack() as modes:
        for stage in stages.values():
            modes.enter_context(stage.evaluating(step))
        run.execute(actions)
    run.wait_sends()
    mine: Carry | None = None
    if comm.rank == last_rank and not run.failed:
        last = [k for k, (_, nxt) in edges.items() if nxt is None]
        chunks = [run.outputs[key] for key in sorted(key for key in run.outputs if key[0] in last)]
        mine = tuple(torch.cat(parts).cpu() for parts in zip(*chunks, strict=True))
    layout = None if mine is None else [(tuple(t.shape), t.dtype) for t in mine]
    gathered = comm.all_gather_object((run.failed, run.failure, layout))
    if any(failed for failed, _, _ in gathered):
        raise_first([failure for _, failure, _ in gathered], comm.rank, run.failure)
    return comm.broadcast_tensors(mine, gathered[last_rank][2], last_rank)
