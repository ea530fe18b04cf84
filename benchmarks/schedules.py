"""Every pipeline schedule we have against every one torch.distributed.pipelining runs on 2 ranks.

Why it exists: this runtime's schedules (whatever
`pipeline.pure.schedule.SCHEDULES` holds when it runs: gpipe and 1f1b, and zbh1, 2bw,
pipemare, bipartition and the rest) should beat torch's best schedule on the throughput
stack, and this keeps a record of where each wins and what costs the time where one loses.
It measures them all side by side in one run, on the stack of `benchmarks/throughput.py`
(8 Transformer layers, d_model 256, sequence 64, batch 32, 2 ranks, CPU gloo, 1 thread per
rank), at M=4 and M=8 micro-batches:

* ours: one `ElasticPipeline` per registered schedule (partition "auto"); a schedule that
  raises is recorded with its error and left out;
* torch: ScheduleGPipe and Schedule1F1B (one stage per rank), ScheduleInterleaved1F1B and
  ScheduleInterleavedZeroBubble (the 8 layers in 4 chunks of 2, rank r holds chunks r and
  r+2), ScheduleZBVZeroBubble (V layout: rank 0 holds chunks 0 and 3, rank 1 holds 1 and 2).
  Each is checked before it is timed: one step with dropout off (eval mode) must give the
  single process's loss (within 1e-5) and its gradients;
* one process: the whole stack on rank 0, gradient accumulation over the M micro-batches
  (rank 1 waits at the barrier meanwhile);
* the perfect split, a bound rather than a schedule: both ranks train their half of the
  stack at the same time with no messages and no bubble (`perfect_split`). No schedule that
  does the same compute on two ranks beats it, so a target above it cannot be met here.

All runs live in the same two processes and are timed in interleaved rounds (`timed_rounds`),
so drift of the machine hits them alike; figures are medians over rounds, raw per-round step
times are kept. Beside the measured samples/s: the ratio to one process and to torch's best
correct schedule at that M, the flush bound S*M/(M+S-1) x one process, ours' simulated
throughput (the plan's predicted iteration: `pipeline.pure.simulate` on the profiled costs,
and a replay of the schedule on the measured per-stage costs), ours' per-stage time breakdown
(compute, waits, the rest), and per-stage peak memory. Writes
benchmarks/results/schedules.json and prints a summary table.

    python benchmarks/schedules.py [--rounds 12] [--steps 1] [--quick] [--timelines DIR]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import os
import resource
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import agreed_check, timed_rounds
from throughput import BATCH, D_MODEL, HEADS, LAYERS, OPTIMIZER, SEQ, STAGES, batch, specs
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
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
from pipeline.pure.schedule import SCHEDULES, is_stream
from pipeline.pure.simulate import StageCost, simulate

MICROBATCHES = (4, 8)
# 2bw and pipemare change the update rule; the rest train exactly like one process
EXACT = ("gpipe", "1f1b", "zbh1", "bipartition", "interleaved_1f1b", "zbv")
TARGETS = {"ours_best_exact_vs_torch_best": 1.05, "ours_best_vs_perfect_split": 0.95}
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

MEMORY_METHOD = (
    "ours: ElasticPipeline.stats() per stage: state_bytes (parameters, gradients, optimizer "
    "state) + activation_peak_bytes (tensors autograd saves plus held boundary tensors, per "
    "storage, parameters excluded, peak over a measured step); allocator_peak_bytes is GPU "
    "only (None on CPU). torch and one process: the same kind of count, not RSS: a "
    "saved_tensors_hooks counter of the live storages autograd saves (parameters excluded, "
    "deduplicated by storage, released when autograd frees them), peak over one untimed step "
    "after the timing, plus parameter + gradient + optimizer-state bytes. Process-wide "
    "ru_maxrss per rank (all runs together, so not per schedule) is given for scale."
)


def chunks_of(layout: str, rank: int) -> tuple[int, list[int]]:
    """(number of chunks, the chunk indices `rank` holds, in its stage order)."""
    if layout == "single":
        return STAGES, [rank]
    if layout == "loop":
        return 2 * STAGES, [rank, rank + STAGES]
    if layout == "v":
        return 2 * STAGES, [rank, 2 * STAGES - 1 - rank]
    raise ValueError(f"unknown layout {layout!r}")


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


# -- the single-process reference ---------------------------------------------------------------
def reference_grads(m: int, device: torch.device) -> tuple[float, list[list[torch.Tensor]]]:
    """Dropout off: the mean micro-batch loss and each layer's gradients, accumulated over m."""
    model = nn.Sequential(*[build_layer(s, 0, device) for s in specs()]).eval()
    x, y = batch()
    total = 0.0
    for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
        loss = F.mse_loss(model(xi), yi)
        (loss / m).backward()
        total += float(loss.detach())
    grads = [[p.grad.clone() for p in layer.parameters() if p.grad is not None] for layer in model]
    return total / m, grads


def single_process(ctx: StageContext, m: int) -> tuple[Callable[[], None], Callable[[], Any]]:
    """(step, memory measurement) of the whole stack on rank 0; nothing on the other ranks."""
    if ctx.rank != 0:
        return (lambda: None), (lambda: None)
    model = nn.Sequential(*[build_layer(s, 0, ctx.device) for s in specs()])
    optimizer = OPTIMIZER(model.parameters())
    x, y = batch()

    def backward() -> None:
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            (F.mse_loss(model(xi), yi) / m).backward()

    def step() -> None:
        backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

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

    def step() -> None:
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            out = model(xi.detach().requires_grad_(ctx.rank > 0))
            if last:
                (F.mse_loss(out, yi) / m).backward()
            else:
                out.backward(yi)  # any gradient of the output's shape: the same work
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


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
    n_chunks, mine = chunks_of(layout, ctx.rank)
    spans = bounds(equal_sizes(LAYERS, n_chunks))
    layers = specs()
    modules = [
        nn.Sequential(*[build_layer(s, 0, ctx.device) for s in layers[slice(*spans[c])]])
        for c in mine
    ]
    stages = [
        PipelineStage(mod, c, n_chunks, ctx.device) for mod, c in zip(modules, mine, strict=True)
    ]
    if layout == "single":
        schedule = cls(stages[0], n_microbatches=m, loss_fn=F.mse_loss)
    else:
        schedule = cls(stages, n_microbatches=m, loss_fn=F.mse_loss)
    params = [p for mod in modules for p in mod.parameters()]
    optimizer = OPTIMIZER(params)
    first, last = 0 in mine, n_chunks - 1 in mine
    x, y = batch()

    def forward_backward(losses: list[torch.Tensor] | None = None) -> None:
        kwargs: dict[str, Any] = (
            {"target": y, "losses": [] if losses is None else losses} if last else {}
        )
        if first:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)

    # The check: dropout off, one forward/backward, loss and gradients vs one process.
    for mod in modules:
        mod.eval()
    losses: list[torch.Tensor] = []
    forward_backward(losses)
    loss = float(torch.stack([t.detach() for t in losses]).mean()) if last else None
    ref_loss, ref_grads = reference
    worst = 0.0
    for mod, c in zip(modules, mine, strict=True):
        start, _ = spans[c]
        for offset, layer in enumerate(mod):
            got = [p.grad for p in layer.parameters() if p.grad is not None]
            want = ref_grads[start + offset]
            if len(got) != len(want):
                worst = math.inf
                continue
            for g, w in zip(got, want, strict=True):
                worst = max(worst, float((g - w).abs().max() / w.abs().max().clamp_min(1e-30)))
    optimizer.zero_grad(set_to_none=True)
    for mod in modules:
        mod.train()
    check = agreed_check(loss, worst, ref_loss, (LOSS_TOLERANCE, GRAD_TOLERANCE)) | {
        "mode": "dropout off (eval) for the check; timed in train mode like one process",
        "chunks_per_rank": [chunks_of(layout, r)[1] for r in range(ctx.world_size)],
    }

    def step() -> None:
        forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return TorchRun(step, lambda: measure_step(forward_backward, params, optimizer), check)


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
    pipe = ElasticPipeline(
        specs(),
        optimizer=OPTIMIZER,
        loss_fn=F.mse_loss,
        schedule=name,
        n_microbatches=m,
        planning=PlanOptions(cost_cache=cache),
    )
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


def ours_record(
    name: str, pipe: ElasticPipeline, first_loss: float, ref_loss: float, timelines: Path | None
) -> dict[str, Any]:
    stats = pipe.stats()
    if timelines is not None:
        pipe.save_timeline(timelines / f"ours_{name}_M{stats.n_microbatches}.json")
    replay = replay_measured(name, stats)
    predicted = stats.predicted_iteration_s
    breakdown = []
    for s in stats.stages:
        other = s.total_s - s.forward_s - s.backward_s - s.wait_s - s.optimizer_s
        breakdown.append(
            {
                "stage": s.stage,
                "forward_s": s.forward_s,
                "backward_s": s.backward_s,
                "wait_s": s.wait_s,
                "optimizer_s": s.optimizer_s,
                "other_s": other,
                "total_s": s.total_s,
            }
        )
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
        "stage_breakdown_s": breakdown,
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


# -- the run, in both processes -----------------------------------------------------------------
def run_all(
    ctx: StageContext, rounds: int, steps: int, warmup: int, timelines: Path | None
) -> dict[str, Any]:
    cache = CostCache()
    runs: dict[str, Callable[[], None]] = {}
    records: dict[str, dict[str, Any]] = {}
    pipes: dict[str, tuple[str, ElasticPipeline, float, float]] = {}
    torch_runs: dict[str, TorchRun] = {}
    singles: dict[str, Callable[[], Any]] = {}
    registry = sorted(SCHEDULES)
    for m in MICROBATCHES:
        reference = reference_grads(m, ctx.device)
        ref_dropout = reference_loss_with_dropout(m)
        for name in registry:
            key = f"ours_{name}_M{m}"
            records[key] = {"kind": "ours", "schedule": name, "exact": name in EXACT}
            try:
                step, pipe, first_loss = ours_run(name, m, cache, steps)
            except Exception as error:  # raised on every rank by the runtime
                records[key]["error"] = f"{type(error).__name__}: {error}"[:2000]
                continue
            runs[key] = step
            pipes[key] = (name, pipe, first_loss, ref_dropout)
        for name, (cls, layout) in TORCH_SCHEDULES.items():
            key = f"torch_{name}_M{m}"
            try:
                run = torch_run(ctx, cls, layout, m, reference)
            except Exception as error:
                records[key] = {
                    "kind": "torch",
                    "schedule": cls.__name__,
                    "error": f"{type(error).__name__}: {error}"[:2000],
                }
                continue
            runs[key], torch_runs[key] = run.step, run
            records[key] = {
                "kind": "torch",
                "schedule": cls.__name__,
                "layout": layout,
                "check": run.check,
            }
        key = f"single_process_M{m}"
        runs[key], singles[key] = single_process(ctx, m)
        records[key] = {"kind": "single_process"}
        runs[f"perfect_split_M{m}"] = perfect_split(ctx, m)
        records[f"perfect_split_M{m}"] = {"kind": "bound"}

    failed = []
    for key, step in runs.items():  # warm-up: allocator, shape inference, connections
        # ours' first step (the plan) and torch's check step were the first warm-up step
        extra = warmup if key.startswith(("single_process", "perfect_split")) else warmup - 1
        try:
            for _ in range(extra):
                step()
        except Exception as error:
            failed.append(key)
            records[key]["error"] = f"{type(error).__name__}: {error}"[:2000]
    for key in failed:
        del runs[key]
        pipes.pop(key, None)
        torch_runs.pop(key, None)

    seconds = timed_rounds(runs, rounds, steps)

    memory: dict[str, Any] = {}
    for key, (name, pipe, first_loss, ref_loss) in pipes.items():
        records[key].update(ours_record(name, pipe, first_loss, ref_loss, timelines))
    for key, run in torch_runs.items():
        memory[key] = run.measure()
    for key, measure in singles.items():
        memory[key] = measure()
    gathered: list[Any] = [None] * ctx.world_size
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    dist.all_gather_object(gathered, (memory, rss))
    for key in memory:
        records[key]["memory_per_rank"] = [g[0].get(key) for g in gathered]
    for key, times in seconds.items():
        records[key]["per_round_step_s"] = times
    return {
        "records": records,
        "registry": registry,
        "process_maxrss_bytes": [g[1] for g in gathered],
    }


# -- the report ---------------------------------------------------------------------------------
def _best(
    runs: dict[str, dict[str, Any]], kind: str, ok: Callable[[dict[str, Any]], bool]
) -> tuple[str | None, float]:
    """The fastest measured run of `kind` that passes `ok`: (name, samples/s)."""
    cands = [
        (v["samples_per_s"], k)
        for k, v in runs.items()
        if v.get("kind") == kind and "samples_per_s" in v and ok(v)
    ]
    return (max(cands)[1], max(cands)[0]) if cands else (None, math.nan)


def summarize(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per M: samples/s, ratios, the bests and the `TARGETS`."""
    out: dict[str, Any] = {}
    for m in MICROBATCHES:
        mine = {k[: -len(f"_M{m}")]: v for k, v in records.items() if k.endswith(f"_M{m}")}
        for rec in mine.values():
            times = rec.get("per_round_step_s")
            if times:
                rec["median_step_s"] = statistics.median(times)
                rec["samples_per_s"] = BATCH / rec["median_step_s"]
                # the least disturbed round: a second view when the machine is shared
                rec["best_round_samples_per_s"] = BATCH / min(times)
        single = mine["single_process"]["samples_per_s"]
        bound = mine["perfect_split"]["samples_per_s"]
        flush = STAGES * m / (m + STAGES - 1)

        torch_best, torch_sps = _best(mine, "torch", lambda v: v["check"]["correct"])
        ours_best, ours_sps = _best(mine, "ours", lambda v: True)
        exact_best, exact_sps = _best(mine, "ours", lambda v: v["exact"])
        for rec in mine.values():
            if "samples_per_s" in rec:
                rec["vs_single_process"] = rec["samples_per_s"] / single
                rec["vs_torch_best"] = rec["samples_per_s"] / torch_sps
                rec["vs_flush_ideal"] = rec["samples_per_s"] / (single * flush)
            if rec.get("simulated_samples_per_s"):
                rec["simulated_vs_single_process"] = rec["simulated_samples_per_s"] / single
        out[f"M{m}"] = {
            "single_process_samples_per_s": single,
            "flush_ideal_factor": flush,
            "flush_ideal_samples_per_s": single * flush,
            "torch_best": torch_best,
            "torch_best_samples_per_s": torch_sps,
            "ours_best": ours_best,
            "ours_best_samples_per_s": ours_sps,
            "ours_best_exact": exact_best,
            "ours_best_exact_samples_per_s": exact_sps,
            "ours_best_vs_torch_best": ours_sps / torch_sps,
            "ours_best_exact_vs_torch_best": exact_sps / torch_sps,
            "perfect_split_samples_per_s": bound,
            "perfect_split_vs_torch_best": bound / torch_sps,
            "ours_best_vs_perfect_split": ours_sps / bound,
            "torch_best_vs_perfect_split": torch_sps / bound,
            "targets": TARGETS,
            "runs": mine,
        }
    return out


def print_table(by_m: dict[str, Any]) -> None:
    for label, res in by_m.items():
        print(
            f"\n{label}: one process {res['single_process_samples_per_s']:.2f} samples/s, "
            f"flush bound x{res['flush_ideal_factor']:.3f}"
        )
        print(
            f"  {'run':<24}{'samples/s':>10}{'best rnd':>10}{'x 1 proc':>10}"
            f"{'x torch best':>14}{'sim':>8}"
        )
        for name, rec in res["runs"].items():
            if "samples_per_s" not in rec:
                print(f"  {name:<24}  error: {rec.get('error', '?')[:60]}")
                continue
            sim = rec.get("simulated_samples_per_s")
            flag = "" if rec.get("check", {}).get("correct", True) else "  (INCORRECT)"
            sim_text = "" if sim is None else f"{sim:8.2f}"
            print(
                f"  {name:<24}{rec['samples_per_s']:>10.2f}"
                f"{rec['best_round_samples_per_s']:>10.2f}{rec['vs_single_process']:>10.3f}"
                f"{rec['vs_torch_best']:>14.3f}{sim_text}{flag}"
            )
        for ratio, (ours, peer) in {
            "ours_best_exact_vs_torch_best": ("ours_best_exact", "torch_best"),
            "ours_best_vs_perfect_split": ("ours_best", "perfect split"),
        }.items():
            print(
                f"  {res[ours]} / {res.get(peer, peer)}: {res[ratio]:.3f} (goal {TARGETS[ratio]})"
            )
        print(
            f"  perfect split (no messages, no bubble) / torch best: "
            f"{res['perfect_split_vs_torch_best']:.3f}"
        )


def _git(*args: str) -> str:
    """Output of a git command in the checkout this file lives in ('' outside git)."""
    try:
        return subprocess.run(
            ["git", *args], cwd=Path(__file__).parent, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=1, help="steps per run per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 1 step")
    parser.add_argument(
        "--timelines",
        type=Path,
        default=None,
        help="write ours' Chrome-trace timelines (last step) there",
    )
    default_out = Path(__file__).parent / "results" / "schedules.json"
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 1, 1
    if args.timelines is not None:
        args.timelines.mkdir(parents=True, exist_ok=True)
    commit = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--", "pipeline"))
    load_before = os.getloadavg()
    started = time.perf_counter()

    result = pipeline.launch(
        functools.partial(
            run_all,
            rounds=args.rounds,
            steps=args.steps,
            warmup=args.warmup,
            timelines=args.timelines,
        ),
        STAGES,
        threads_per_stage=1,
        timeout_s=600.0,
    )[0]
    by_m = summarize(result["records"])
    report = {
        "config": {
            "layers": LAYERS,
            "d_model": D_MODEL,
            "heads": HEADS,
            "seq": SEQ,
            "batch": BATCH,
            "microbatches": list(MICROBATCHES),
            "stages": STAGES,
            "threads_per_stage": 1,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "warmup_steps": args.warmup,
            "quick": args.quick,
            "torch": torch.__version__,
            "git_commit": commit,
            "pipeline_dir_has_uncommitted_changes": dirty,
            "our_schedules_registered": result["registry"],
            "exact_schedules": list(EXACT),
            "check_tolerances": {"loss_abs": LOSS_TOLERANCE, "grad_rel": GRAD_TOLERANCE},
            "single_process": "rank 0 alone (rank 1 idle at the barrier), timed in the rounds",
            "wall_s": time.perf_counter() - started,
            "load_average_1_5_15_before": load_before,
            "load_average_1_5_15_after": os.getloadavg(),
        },
        "memory_method": MEMORY_METHOD,
        "process_maxrss_bytes_per_rank": result["process_maxrss_bytes"],
        "summary": {
            label: {k: v for k, v in res.items() if k != "runs"} for label, res in by_m.items()
        },
        "by_microbatches": by_m,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print_table(by_m)


if __name__ == "__main__":
    main()
