"""The runs of `schedules.py`: ours, torch's, one process and the perfect split, each a
step the interleaved rounds time, with what it records beside its time.

Why it exists: `schedules.py` is the entry point (the rounds, the summary, the command
line); building each run and measuring its memory (a counter of the bytes autograd saves)
is this module's. torch's schedules are built and checked by `_torch_peer`.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _torch_peer import Workload, chain, checked_torch_schedule, chunks_of, reference_grads
from common import accumulate, optimizer_step
from throughput import BATCH, LAYERS, OPTIMIZER, STAGES, batch, ours_pipeline, specs
from torch import nn
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
)

import pipeline
from pipeline import CostCache, ElasticPipeline, PipelineStats, PlanOptions, StageContext
from pipeline.local.spec import build_layer
from pipeline.pure.partition import bounds, equal_sizes
from pipeline.pure.schedule import is_stream
from pipeline.pure.simulate import StageCost, simulate

# 2bw and pipemare change the update rule; the rest train exactly like one process
EXACT = ("gpipe", "1f1b", "zbh1", "bipartition", "interleaved_1f1b", "zbv")
LOSS_TOLERANCE = 1e-5
GRAD_TOLERANCE = 1e-5  # max |grad - reference| over max |reference grad|

# torch's schedules that run on 2 ranks: (class, layout). The layout gives each rank's
# chunks: "single" 2 chunks, rank r holds r; "loop" 4 chunks, r and r+2; "v" 4 chunks, V.
TORCH_SCHEDULES: dict[str, tuple[type, str]] = {
    "gpipe": (ScheduleGPipe, "single"),
    "1f1b": (Schedule1F1B, "single"),
    "interleaved_1f1b": (ScheduleInterleaved1F1B, "loop"),
    "interleaved_zb": (ScheduleInterleavedZeroBubble, "loop"),
    "zbv": (ScheduleZBVZeroBubble, "v"),
}


# -- memory: live bytes autograd saves ----------------------------------------------------------
class _Held:
    """What the pack hook stores instead of a tensor: releases its count when autograd drops it."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, tensor: torch.Tensor, key: tuple[int, int], meter: SavedPeak) -> None:
        self.tensor, self.key, self.meter = tensor, key, meter

    def __del__(self) -> None:
        self.meter.drop(self.key)


@dataclass
class SavedPeak:
    """Peak live bytes of the storages autograd saves (parameters excluded)."""

    exclude: set[int]
    users: dict[tuple[int, int], int] = field(default_factory=dict)
    current: int = 0
    peak: int = 0

    def pack(self, t: torch.Tensor) -> Any:
        storage = t.untyped_storage()
        if t.device.type == "meta" or storage.data_ptr() in self.exclude:
            return t
        key = (storage.data_ptr(), storage.nbytes())
        self.users[key] = self.users.get(key, 0) + 1
        if self.users[key] == 1:
            self.current += key[1]
            self.peak = max(self.peak, self.current)
        return _Held(t, key, self)

    @staticmethod
    def unpack(held: Any) -> torch.Tensor:
        return held.tensor if isinstance(held, _Held) else held

    def drop(self, key: tuple[int, int]) -> None:
        self.users[key] -= 1
        if not self.users[key]:
            del self.users[key]
            self.current -= key[1]


def measure_step(
    step: Callable[[], None], params: Sequence[nn.Parameter], optimizer: torch.optim.Optimizer
) -> dict[str, int]:
    """Run `step` (forward and backward, no optimizer step) under the saved-tensor counter."""
    meter = SavedPeak({p.untyped_storage().data_ptr() for p in params})
    with torch.autograd.graph.saved_tensors_hooks(meter.pack, meter.unpack):
        step()
    param_bytes = sum(p.nbytes for p in params)
    grad_bytes = sum(p.grad.nbytes for p in params if p.grad is not None)
    optimizer_bytes = sum(
        t.nbytes
        for state in optimizer.state.values()
        for t in state.values()
        if isinstance(t, torch.Tensor)
    )
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    state = param_bytes + grad_bytes + optimizer_bytes
    return {
        "param_bytes": param_bytes,
        "state_bytes": state,
        "activation_peak_bytes": meter.peak,
        "measured_peak_bytes": state + meter.peak,
    }


# -- one process, the perfect split --------------------------------------------------------------
def single_process(ctx: StageContext, m: int) -> tuple[Callable[[], None], Callable[[], Any]]:
    """(step, memory measurement) of the whole stack on rank 0; nothing on the other ranks."""
    if ctx.rank != 0:
        return (lambda: None), (lambda: None)
    model = nn.Sequential(*[build_layer(s, 0, ctx.device) for s in specs()])
    optimizer = OPTIMIZER(model.parameters())
    backward = accumulate(model, batch(), m)
    step = optimizer_step(backward, optimizer)
    return step, lambda: measure_step(backward, list(model.parameters()), optimizer)


def perfect_split(ctx: StageContext, m: int) -> Callable[[], None]:
    """The bound of any 2-rank split: each rank its half, alone, no messages, no bubble.

    Rank r trains layers `bounds(equal_sizes)[r]` on its own micro-batches of the right
    shape (the last rank with the loss, the others back-propagating a fixed gradient), at
    the same time as the other ranks: what the machine gives two processes computing in
    parallel, the compute every schedule of ours and torch's must do, with nothing else.
    """
    start, stop = bounds(equal_sizes(LAYERS, STAGES))[ctx.rank]
    model = nn.Sequential(*[build_layer(s, 0, ctx.device) for s in specs()[start:stop]])
    optimizer = OPTIMIZER(model.parameters())
    x, y = batch()
    last = ctx.rank == STAGES - 1

    def forward_backward() -> None:
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            out = model(xi.detach().requires_grad_(ctx.rank > 0))
            if last:
                (F.mse_loss(out, yi) / m).backward()
            else:
                out.backward(yi)  # any gradient of the output's shape: the same work

    return optimizer_step(forward_backward, optimizer)


# -- torch.distributed.pipelining --------------------------------------------------------------
@dataclass
class TorchRun:
    step: Callable[[], None]
    measure: Callable[[], dict[str, int]]
    check: dict[str, Any]


def torch_run(
    ctx: StageContext, cls: type, layout: str, m: int, reference: tuple[float, list[Any]]
) -> TorchRun:
    """Build one torch schedule on this rank's chunks; check one step against the reference."""
    n_chunks = chunks_of(layout, ctx.rank)[0]
    run = checked_torch_schedule(
        ctx,
        Workload(specs(), batch(), F.mse_loss, OPTIMIZER),
        (cls, layout),
        equal_sizes(LAYERS, n_chunks),
        m,
        reference,
        (LOSS_TOLERANCE, GRAD_TOLERANCE),
    )
    check = run.check | {
        "mode": "dropout off (eval) for the check; timed in train mode like one process",
        "chunks_per_rank": [chunks_of(layout, r)[1] for r in range(ctx.world_size)],
    }

    def measure() -> dict[str, int]:
        return measure_step(lambda: run.forward_backward([]), run.params, run.optimizer)

    return TorchRun(run.step, measure, check)


def torch_reference(m: int, device: torch.device) -> tuple[float, list[Any]]:
    """Dropout off: the mean micro-batch loss and each layer's gradients, accumulated over m."""
    return reference_grads(chain(specs(), device), batch(), m, F.mse_loss)


# -- ours ---------------------------------------------------------------------------------------
def ours_run(
    name: str, m: int, cache: CostCache, steps: int = 1
) -> tuple[Callable[[], None], ElasticPipeline, float]:
    """(step, pipeline, the first step's loss): the first step also plans the partition.

    A stream schedule (2bw) is measured through `pipe.train`: the first call of every
    `steps` calls (one round) trains a stream of `steps` steps, the others do nothing, so a
    round pays one warm-up and one cool-down; streams are drained within the round, as the
    other runs share the process group and its messages match by order.
    """
    pipe = ours_pipeline(name, m, PlanOptions(cost_cache=cache))
    x, y = batch()
    first_loss = pipe.train_step(x, y)
    calls = itertools.count()

    def step() -> None:
        if not is_stream(name):
            pipe.train_step(x, y)
        elif next(calls) % steps == 0:
            for _ in pipe.train(itertools.repeat((x, y), steps)):
                pass

    return step, pipe, first_loss


def replay_measured(name: str, stats: PipelineStats) -> float | None:
    """The schedule replayed (`simulate`, free link) on the measured per-micro-batch costs
    (None with several stages per rank: `stats` measures a rank's stages together)."""
    m = stats.n_microbatches
    if len(stats.partition) != len(stats.stages):
        return None
    costs = [
        StageCost(s.forward_s / m, s.backward_s / m, optimizer_s=s.optimizer_s)
        for s in stats.stages
    ]
    try:
        if is_stream(name):  # steady state per step of a stream (`SimResult.step_s`)
            return simulate(name, costs, m, n_steps=5).step_s
        return simulate(name, costs, m).iteration_s
    except Exception:  # a schedule whose costs need more than forward/backward
        return None


def _breakdown(stats: PipelineStats) -> list[dict[str, Any]]:
    """Each stage's time: forward, backward, waits, the optimizer and the rest."""
    return [
        {
            "stage": s.stage,
            "forward_s": s.forward_s,
            "backward_s": s.backward_s,
            "wait_s": s.wait_s,
            "optimizer_s": s.optimizer_s,
            "other_s": s.total_s - s.forward_s - s.backward_s - s.wait_s - s.optimizer_s,
            "total_s": s.total_s,
        }
        for s in stats.stages
    ]


def ours_record(
    name: str, pipe: ElasticPipeline, first_loss: float, ref_loss: float, timelines: Path | None
) -> dict[str, Any]:
    stats = pipe.stats()
    if timelines is not None:
        pipe.save_timeline(timelines / f"ours_{name}_M{stats.n_microbatches}.json")
    replay = replay_measured(name, stats)
    predicted = stats.predicted_iteration_s
    return {
        "kind": "ours",
        "schedule": name,
        "exact": name in EXACT,
        "partition": list(stats.partition),
        "first_step_loss": first_loss,
        "reference_first_step_loss": ref_loss,
        "loss_abs_diff": abs(first_loss - ref_loss),
        "simulated_iteration_s": predicted,
        "simulated_samples_per_s": BATCH / predicted if predicted else None,
        "replay_on_measured_iteration_s": replay,
        "replay_on_measured_samples_per_s": BATCH / replay if replay else None,
        "stats_iteration_s": stats.iteration_s,
        "bubble_fraction": stats.bubble_fraction,
        "predicted_bubble_fraction": stats.predicted_bubble_fraction,
        "stage_breakdown_s": _breakdown(stats),
        "memory_per_stage": [
            {
                "stage": s.stage,
                "param_bytes": s.param_bytes,
                "state_bytes": s.state_bytes,
                "activation_peak_bytes": s.activation_peak_bytes,
                "measured_peak_bytes": s.measured_peak_bytes,
                "predicted_peak_bytes": s.predicted_peak_bytes,
                "allocator_peak_bytes": s.allocator_peak_bytes,
            }
            for s in stats.stages
        ],
    }


def reference_loss_with_dropout(m: int) -> float:
    """One process with ours' seeded dropout masks: what ours' first step must return."""
    trainer = pipeline.ReferenceTrainer(
        specs(), optimizer=OPTIMIZER, loss_fn=F.mse_loss, n_microbatches=m
    )
    return trainer.train_step(*batch())
