"""Bi-Partition where whole layers cannot balance two stages, against whole-layer peers.

Why it exists: Bi-Partition is meant for where it applies, beside the other
schedules. On the throughput stack of `benchmarks/schedules.py` (8 equal Transformer
layers) it does not: 4 + 4 layers already balance, and its layers are not separable. It
applies where the layers are coarse and uneven across the cut, and the layer at the cut is
separable (`pipeline.local.separable`). This benchmark trains such a stack: three big
Linear layers (d 1024 -> 1024, on 32 x 32 tokens) with GELU layers between them,

    lin0  gelu0  lin1  gelu1  lin2          (F ~ 1, B ~ 2 for each lin, small for gelu)

on 2 stages (CPU gloo, 1 thread each) at M=4 and M=8. Any whole-layer split puts two of
the three big layers on one stage (bottleneck ~ 2 x 3 = 6 units), in every schedule,
torch's interleaved and V schedules too (they also place whole layers). Bi-Partition hands
lin1's backward to stage 1: 2F + B ~ 4 units on stage 0, F + 2B ~ 5 on stage 1.

Runs, side by side in the same two processes, timed in interleaved rounds:

* ours 1f1b and zbh1 with `PlanOptions(planner="time")` (whole layers),
* ours 1f1b and zbh1 with `PlanOptions(planner="bipartition")` (the planner picks the cut),
* torch.distributed.pipelining Schedule1F1B and ScheduleGPipe on ours' whole-layer split,
* one process (gradient accumulation over the same micro-batches).

Each of ours is checked against one process on its first step (the same loss, dropout-free
stack: exact). Reported: median samples/s, ratios to the best whole-layer run, the plans'
simulated samples/s, and per-stage peak memory. Writes benchmarks/results/bipartition.json.

    python benchmarks/bipartition.py [--rounds 8] [--steps 2]
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _run import first_line, write_json
from common import accumulate, on_ranks, optimizer_step, timed_rounds, torch_pipelining_step
from torch import nn
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

from pipeline import (
    CostCache,
    ElasticPipeline,
    LayerSpec,
    PlanOptions,
    ReferenceTrainer,
    StageContext,
)
from pipeline.local.spec import build_layer

WIDTH, TOKENS, BATCH, STAGES = 1024, 32, 32, 2
OPTIMIZER = functools.partial(torch.optim.SGD, lr=1e-4)


def specs() -> list[LayerSpec]:
    out: list[LayerSpec] = []
    for i in range(3):
        if i:
            out.append(LayerSpec(f"gelu{i - 1}", nn.GELU))
        out.append(LayerSpec(f"lin{i}", functools.partial(nn.Linear, WIDTH, WIDTH)))
    return out


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(BATCH, TOKENS, WIDTH, generator=g),
        torch.randn(BATCH, TOKENS, WIDTH, generator=g),
    )


Step = Callable[[], None]


def ours(
    schedule: str, planner: str, m: int, cache: CostCache
) -> tuple[Step, ElasticPipeline, float]:
    pipe = ElasticPipeline(
        specs(),
        optimizer=OPTIMIZER,
        loss_fn=F.mse_loss,
        schedule=schedule,
        n_microbatches=m,
        planning=PlanOptions(planner=planner, cost_cache=cache),
    )
    x, y = batch()
    first = pipe.train_step(x, y)

    def step() -> None:
        pipe.train_step(x, y)

    return step, pipe, first


def one_process(ctx: StageContext, m: int) -> Callable[[], None]:
    model = nn.Sequential(*[build_layer(s, 0, ctx.device) for s in specs()])
    step = optimizer_step(accumulate(model, batch(), m), OPTIMIZER(model.parameters()))
    return step if ctx.rank == 0 else lambda: None


def record(pipe: ElasticPipeline, first: float, ref: float) -> dict[str, Any]:
    stats, plan = pipe.stats(), pipe.plan
    assert plan is not None
    return {
        "partition": list(pipe.sizes),
        "handoff": list(pipe.handoff),
        "planner": plan.planner,
        "first_step_loss_abs_diff": abs(first - ref),
        "simulated_samples_per_s": BATCH / plan.predicted_iteration_s,
        "predicted_stage_s": list(plan.predicted_stage_s),
        "measured_stage_compute_s": [s.forward_s + s.backward_s for s in stats.stages],
        "memory_per_stage": [
            {
                "stage": s.stage,
                "state_bytes": s.state_bytes,
                "activation_peak_bytes": s.activation_peak_bytes,
                "predicted_peak_bytes": s.predicted_peak_bytes,
            }
            for s in stats.stages
        ],
    }


def run_m(ctx: StageContext, m: int, rounds: int, steps: int) -> dict[str, Any]:
    torch.manual_seed(0)
    cache = CostCache()
    ref = ReferenceTrainer(specs(), optimizer=OPTIMIZER, loss_fn=F.mse_loss, n_microbatches=m)
    ref_loss = ref.train_step(*batch())
    runs: dict[str, Callable[[], None]] = {}
    records: dict[str, dict[str, Any]] = {}
    for schedule in ("1f1b", "zbh1"):
        for planner in ("time", "bipartition"):
            name = f"ours {schedule} {'whole layers' if planner == 'time' else 'bipartition'}"
            runs[name], pipe, first = ours(schedule, planner, m, cache)
            records[name] = {"kind": "ours", **record(pipe, first, ref_loss)}
    whole = records["ours 1f1b whole layers"]["partition"]
    for cls in (Schedule1F1B, ScheduleGPipe):
        name = f"torch {cls.__name__.removeprefix('Schedule')} whole layers"
        runs[name] = torch_pipelining_step(ctx, specs(), whole, cls, m, OPTIMIZER, batch())
        records[name] = {"kind": "torch", "partition": whole}
    runs["one process"], records["one process"] = one_process(ctx, m), {"kind": "one process"}
    for step in runs.values():
        step()
    seconds = timed_rounds(runs, rounds, steps)
    for name, times in seconds.items():
        records[name]["step_s"] = times
        records[name]["samples_per_s"] = BATCH / statistics.median(times)
    best_whole = max(r["samples_per_s"] for n, r in records.items() if "whole" in n)
    for r in records.values():
        r["x_best_whole_layers"] = r["samples_per_s"] / best_whole
    return records


def run_all(ctx: StageContext, rounds: int, steps: int) -> dict[str, Any]:
    torch.set_num_threads(1)
    return {f"M={m}": run_m(ctx, m, rounds, steps) for m in (4, 8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results/bipartition.json"))
    args = parser.parse_args()
    results = on_ranks(run_all, STAGES, timeout_s=1800, rounds=args.rounds, steps=args.steps)
    config = {
        "layers": [s.key for s in specs()],
        "width": WIDTH,
        "tokens": TOKENS,
        "batch": BATCH,
        "stages": STAGES,
        "rounds": args.rounds,
        "steps": args.steps,
    }
    write_json(Path(args.out), {"config": config, "results": results}, indent=1)
    for m, records in results.items():
        print(f"\n{m}: {'run':34s} samples/s  x best whole  simulated  partition  handoff")
        for name, r in records.items():
            sim = r.get("simulated_samples_per_s")
            print(
                f"    {name:34s} {r['samples_per_s']:8.1f}  {r['x_best_whole_layers']:10.3f}  "
                f"{'' if sim is None else f'{sim:8.1f}':>9s}  {r.get('partition', '')!s:9s}  "
                f"{r.get('handoff', '')}"
            )


if __name__ == "__main__":
    main()
