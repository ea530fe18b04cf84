"""Throughput of this runtime vs torch.distributed.pipelining vs one process, side by side.

The same 8-layer Transformer stack (d_model 256, 4 heads, sequence 64, batch 32, 8
micro-batches) is trained on 2 stages (CPU, gloo, 1 thread per stage) by:

* this runtime, GPipe and 1F1B;
* torch.distributed.pipelining, ScheduleGPipe and Schedule1F1B, on the same stage split;
* one process with 1 thread (gradient accumulation over the same micro-batches),

and compared with the ideal S*M/(M+S-1) x single-process throughput. All four pipelines live
in the same two processes and are timed in interleaved rounds, so drift of the machine hits
them alike. Prints JSON and writes it to benchmarks/results/throughput.json.

    python benchmarks/throughput.py [--rounds 5] [--steps 5]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _run import Clock, print_json, rounds_parser, write_json
from common import accumulate, on_ranks, optimizer_step, timed_rounds, torch_pipelining_step
from torch import nn
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

from pipeline import ElasticPipeline, PlanOptions, StageContext
from pipeline.local.models import transformer_stack
from pipeline.local.spec import build_layer
from pipeline.pure.partition import equal_sizes

LAYERS, D_MODEL, HEADS, SEQ, BATCH, MICROBATCHES, STAGES = 8, 256, 4, 64, 32, 8, 2
OPTIMIZER = functools.partial(torch.optim.SGD, lr=1e-3)


def specs() -> list[Any]:
    return transformer_stack(LAYERS, D_MODEL, HEADS, dropout=0.1)


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCH, SEQ, D_MODEL, generator=g)  # (batch, seq, d_model)
    return x, torch.randn(BATCH, SEQ, D_MODEL, generator=g)


def torch_pipelining(ctx: StageContext, schedule_cls: type) -> Callable[[], None]:
    """One step of torch.distributed.pipelining on this rank's share of the same layers."""
    return torch_pipelining_step(
        ctx, specs(), equal_sizes(LAYERS, STAGES), schedule_cls, MICROBATCHES, OPTIMIZER, batch()
    )


def ours_pipeline(
    schedule: str, m: int = MICROBATCHES, planning: PlanOptions | None = None
) -> ElasticPipeline:
    """Ours on this stack (also `schedules.py`'s and `order_cost.py`'s): `schedule` with
    `m` micro-batches, SGD, MSE loss."""
    return ElasticPipeline(
        specs(),
        optimizer=OPTIMIZER,
        loss_fn=F.mse_loss,
        schedule=schedule,
        n_microbatches=m,
        planning=planning,
    )


def stack_config(microbatches: Any, args: argparse.Namespace) -> dict[str, Any]:
    """This stack and how it was timed (`args.rounds` of `args.steps` steps), as a JSON's
    `config` opens."""
    return {
        "layers": LAYERS,
        "d_model": D_MODEL,
        "heads": HEADS,
        "seq": SEQ,
        "batch": BATCH,
        "microbatches": microbatches,
        "stages": STAGES,
        "threads_per_stage": 1,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
    }


def ours(ctx: StageContext, schedule: str) -> tuple[Callable[[], None], ElasticPipeline]:
    pipe = ours_pipeline(schedule)
    x, y = batch()

    def step() -> None:
        pipe.train_step(x, y)

    return step, pipe


def run_pipelines(ctx: StageContext, rounds: int, steps: int) -> dict[str, Any]:
    ours_gpipe, pipe_gpipe = ours(ctx, "gpipe")
    ours_1f1b, pipe_1f1b = ours(ctx, "1f1b")
    runs = {
        "ours_gpipe": ours_gpipe,
        "ours_1f1b": ours_1f1b,
        "torch_gpipe": torch_pipelining(ctx, ScheduleGPipe),
        "torch_1f1b": torch_pipelining(ctx, Schedule1F1B),
    }
    for step in runs.values():  # warm-up: allocator, shape inference, connections
        for _ in range(2):
            step()
    seconds = timed_rounds(runs, rounds, steps)
    return {
        "step_s": seconds,
        "profile": {
            "ours_gpipe": pipe_gpipe.stats().to_dict(),
            "ours_1f1b": pipe_1f1b.stats().to_dict(),
        },
    }


def single_process(ctx: StageContext, rounds: int, steps: int) -> list[float]:
    model = nn.Sequential(*[build_layer(s, 0, ctx.device) for s in specs()])
    step = optimizer_step(accumulate(model, batch(), MICROBATCHES), OPTIMIZER(model.parameters()))
    for _ in range(2):
        step()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - t0) / steps)
    return times


def main() -> None:
    args = rounds_parser(__doc__, rounds=5, steps=5, out="throughput.json").parse_args()
    clock = Clock()
    single = on_ranks(single_process, 1, rounds=args.rounds, steps=args.steps)
    piped = on_ranks(run_pipelines, STAGES, rounds=args.rounds, steps=args.steps)

    def samples_per_s(times: list[float]) -> float:
        return BATCH / statistics.median(times)

    single_sps = samples_per_s(single)
    ideal = single_sps * STAGES * MICROBATCHES / (MICROBATCHES + STAGES - 1)
    results = {name: samples_per_s(t) for name, t in piped["step_s"].items()}
    report = {
        "config": {
            **stack_config(MICROBATCHES, args),
            "torch": torch.__version__,
            "wall_s": clock.seconds(),
            **clock.load_average(),
        },
        "samples_per_s": {"single_process": single_sps, "ideal": ideal, **results},
        "median_step_s": {
            "single_process": statistics.median(single),
            **{k: statistics.median(v) for k, v in piped["step_s"].items()},
        },
        "ratios": {
            "ours_gpipe_vs_torch_gpipe": results["ours_gpipe"] / results["torch_gpipe"],
            "ours_1f1b_vs_torch_1f1b": results["ours_1f1b"] / results["torch_1f1b"],
            "ours_gpipe_vs_ideal": results["ours_gpipe"] / ideal,
            "ours_1f1b_vs_ideal": results["ours_1f1b"] / ideal,
            "torch_gpipe_vs_ideal": results["torch_gpipe"] / ideal,
            "torch_1f1b_vs_ideal": results["torch_1f1b"] / ideal,
        },
        "targets": {"vs_torch_pipelining": 1.1, "vs_ideal": 0.85},
        "per_round_step_s": {"single_process": single, **piped["step_s"]},
        "ours_per_stage_profile": piped["profile"],
    }
    write_json(args.out, report)
    print_json(report, ("samples_per_s", "ratios"))


if __name__ == "__main__":
    main()
