"""Time to take the next NAS candidate: reconfigure vs cold restart vs torch.pipelining rebuild.

Candidates alternate between two Transformer stacks (8 layers d_model 256, and 6 layers
d_model 320), 2 stages, CPU gloo, 1 thread per stage. Measured side by side in one run:

* `reconfigure`: `pipe.reconfigure(next_specs, partition=sizes)` on the live processes
  (free the old layers, build the new ones);
* cold restart: new processes, new process group, build: from the call to
  `pipeline.distributed.launch` until the pipeline is constructed (layers built) on every stage;
* torch.distributed.pipelining on the live group: build the stage modules, `PipelineStage`
  and the schedule object for the next candidate.

Each is also reported as an overhead: the time until the new model's first training step
has finished, less one steady-state step. That includes the lazy shape inference of
torch.distributed.pipelining, and for `reconfigure` with partition="auto" the profiling
(served by the cost cache after the first candidate) and the planning. Prints JSON and writes it to
benchmarks/results/switch.json.

    python benchmarks/switch.py [--switches 6]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _run import RESULTS, first_line, print_json, write_json
from common import barrier_timed
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import pipeline
from pipeline import ElasticPipeline, LayerSpec, PlanOptions, StageContext
from pipeline.local.models import transformer_stack
from pipeline.local.spec import build_layer
from pipeline.pure.partition import bounds, equal_sizes

SEQ, BATCH, MICROBATCHES, STAGES = 64, 32, 8, 2
OPTIMIZER = functools.partial(torch.optim.AdamW, lr=1e-3)


def candidate(i: int) -> tuple[list[LayerSpec], int]:
    """(specs, d_model) of the i-th candidate."""
    if i % 2 == 0:
        return transformer_stack(8, 256, 4), 256
    return transformer_stack(6, 320, 4), 320


def batch(d_model: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shape = (BATCH, SEQ, d_model)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def equal(specs: list[LayerSpec]) -> list[int]:
    return equal_sizes(len(specs), STAGES)


def new_pipeline(specs: list[LayerSpec]) -> ElasticPipeline:
    """Built at once (explicit sizes), so construction includes building the layers."""
    return ElasticPipeline(
        specs,
        optimizer=OPTIMIZER,
        loss_fn=F.mse_loss,
        n_microbatches=MICROBATCHES,
        planning=PlanOptions(partition=equal(specs)),
    )


def timed(fn: Any) -> float:
    """Seconds of `fn()` on the slowest rank (barrier to barrier)."""
    return barrier_timed(fn)[0]


def live_switches(ctx: StageContext, switches: int) -> dict[str, list[float]]:
    specs, d = candidate(0)
    pipe = new_pipeline(specs)
    pipe.train_step(*batch(d))
    out: dict[str, list[float]] = {
        "reconfigure": [],
        "reconfigure_first_step": [],
        "steady_step": [],
        "reconfigure_auto_first_step": [],
        "torch_rebuild": [],
        "torch_first_step": [],
    }
    for i in range(1, switches + 1):
        specs, d = candidate(i)
        x, y = batch(d)
        # explicit sizes: reconfigure builds the layers at once
        out["reconfigure"].append(timed(lambda: pipe.reconfigure(specs, partition=equal(specs))))  # noqa: B023
        out["reconfigure_first_step"].append(timed(lambda: pipe.train_step(x, y)))  # noqa: B023
        out["steady_step"].append(timed(lambda: pipe.train_step(x, y)))  # noqa: B023
        # partition="auto": profiling (cost cache), planning and building happen in step 1
        pipe.reconfigure(specs)
        out["reconfigure_auto_first_step"].append(timed(lambda: pipe.train_step(x, y)))  # noqa: B023
    pipe.close()
    schedule: Any = None
    for i in range(1, switches + 1):
        specs, d = candidate(i)
        holder: dict[str, Any] = {}

        def rebuild() -> None:
            start, stop = bounds(equal_sizes(len(specs), STAGES))[ctx.rank]  # noqa: B023
            module = nn.Sequential(*[build_layer(s, 0, ctx.device) for s in specs[start:stop]])  # noqa: B023
            stage = PipelineStage(module, ctx.rank, STAGES, ctx.device)
            holder["schedule"] = Schedule1F1B(stage, MICROBATCHES, loss_fn=F.mse_loss)  # noqa: B023
            holder["optimizer"] = OPTIMIZER(module.parameters())  # noqa: B023

        del schedule  # free the previous candidate first, as reconfigure does
        out["torch_rebuild"].append(timed(rebuild))
        schedule = holder["schedule"]
        x, y = batch(d)

        def first_step() -> None:
            if ctx.rank == 0:
                schedule.step(x)  # noqa: B023
            else:
                schedule.step(target=y)  # noqa: B023
            holder["optimizer"].step()  # noqa: B023

        out["torch_first_step"].append(timed(first_step))
    return out


def cold_start(ctx: StageContext, i: int) -> float:
    specs, d = candidate(i)
    pipe = new_pipeline(specs)
    dist.barrier()
    ready = time.time()
    pipe.train_step(*batch(d))
    dist.barrier()
    first_step = time.time() - ready
    pipe.close()
    return ready if ctx.rank == 0 else first_step


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--switches", type=int, default=6)
    parser.add_argument("--out", type=Path, default=RESULTS / "switch.json")
    args = parser.parse_args()

    live = pipeline.launch(
        functools.partial(live_switches, switches=args.switches), STAGES, threads_per_stage=1
    )[0]
    cold: list[float] = []
    cold_step: list[float] = []
    for i in range(1, args.switches + 1):
        t0 = time.time()
        ready, first_step = pipeline.launch(
            functools.partial(cold_start, i=i), STAGES, threads_per_stage=1
        )
        cold.append(ready - t0)
        cold_step.append(ready - t0 + first_step)

    med = {k: statistics.median(v) for k, v in live.items()}
    med["cold_restart"] = statistics.median(cold)
    med["cold_restart_first_step"] = statistics.median(cold_step)
    report = {
        "config": {
            "stages": STAGES,
            "switches": args.switches,
            "seq": SEQ,
            "batch": BATCH,
            "candidates": ["8 x Transformer d256", "6 x Transformer d320"],
        },
        "median_s": med,
        # switch overhead = time to the end of the new model's first step, less one steady step
        "overhead_s": {
            "reconfigure": med["reconfigure"] + med["reconfigure_first_step"] - med["steady_step"],
            "reconfigure_auto_planned": med["reconfigure_auto_first_step"] - med["steady_step"],
            "cold_restart": med["cold_restart_first_step"] - med["steady_step"],
            "torch_rebuild": med["torch_rebuild"] + med["torch_first_step"] - med["steady_step"],
        },
        "ratios": {
            "cold_restart_vs_reconfigure": med["cold_restart"] / med["reconfigure"],
            "torch_rebuild_vs_reconfigure": med["torch_rebuild"] / med["reconfigure"],
        },
        "target": {"cold_restart_vs_reconfigure": 20.0},
        "runs_s": {**live, "cold_restart": cold, "cold_restart_first_step": cold_step},
    }
    overhead = report["overhead_s"]
    cold_overhead = overhead["cold_restart"]
    report["ratios"]["overhead_cold_vs_reconfigure"] = cold_overhead / overhead["reconfigure"]
    report["ratios"]["overhead_cold_vs_reconfigure_auto"] = (
        cold_overhead / overhead["reconfigure_auto_planned"]
    )
    write_json(args.out, report)
    print_json(report, ("median_s", "overhead_s", "ratios"))


if __name__ == "__main__":
    main()
