"""The CUDA path on one GPU: fused and per-layer steps, recompute and swap, checkpoints.

Why it exists: the tests run on CPU with gloo; this is what to run where a GPU is lent
(one process, NCCL, the stages of an interleaved or V placement sharing the GPU). For each
configuration it trains the same model twice, every step measured per layer
(`measure_memory_every=1`) and fused after each plan's first step (the default), and checks
both against `ReferenceTrainer` on the same device; then it saves a checkpoint mid-run,
resumes it in a new pipeline and checks the resumed losses; then it times fused against
per-layer steps on a larger stack (the per-layer path reads the clock around every layer,
which on a GPU synchronises). Writes `results/cuda_check.json` (or `--out`).

    python benchmarks/cuda_check.py [--out FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _run import RESULTS, first_line, write_json

import pipeline
from pipeline import (
    CheckpointOptions,
    ElasticOptions,
    ElasticPipeline,
    Plan,
    PlanOptions,
    StageContext,
)
from pipeline.local.models import transformer_stack
from pipeline.local.reference import ReferenceTrainer

ADAM = functools.partial(torch.optim.Adam, lr=1e-3)
STEPS, M = 5, 4


def plan(sizes: list[int], schedule: str, actions: list[str]) -> Plan:
    n = len(sizes)
    return Plan(tuple(sizes), tuple(actions), schedule, M, 0.0, (0.0,) * n, (0,) * n)


CONFIGS = {
    "1f1b keep": ("1f1b", [4], ["keep"] * 4),
    "1f1b recompute+swap": ("1f1b", [4], ["recompute", "swap", "recompute", "keep"]),
    "zbh1": ("zbh1", [4], ["keep"] * 4),
    "interleaved 2 stages": ("interleaved_1f1b", [2, 2], ["keep", "recompute", "swap", "keep"]),
    "zbv 2 stages": ("zbv", [2, 2], ["keep", "swap", "keep", "keep"]),
}


def data(device: torch.device, d: int, n: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(8, 16, d, generator=g), torch.randn(8, 16, d, generator=g)) for _ in range(n)
    ]


def make(schedule: str, partition: Any, every: int, **kwargs: Any) -> ElasticPipeline:
    return ElasticPipeline(
        transformer_stack(4, 64, 4, dropout=0.1),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        schedule=schedule,
        n_microbatches=M,
        seed=3,
        planning=PlanOptions(partition=partition),
        elastic=ElasticOptions(measure_memory_every=every),
        **kwargs,
    )


def max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(
        float((a[k][n].float().cpu() - b[k][n].float().cpu()).abs().max()) for k in a for n in a[k]
    )


def exactness(ctx: StageContext) -> dict[str, Any]:
    ref = ReferenceTrainer(
        transformer_stack(4, 64, 4, dropout=0.1),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=M,
        seed=3,
        device=ctx.device,
    )
    batches = data(ctx.device, 64)
    ref_losses = [ref.train_step(x.to(ctx.device), y.to(ctx.device)) for x, y in batches]
    ref_state = ref.full_state_dict()
    out: dict[str, Any] = {}
    for name, (schedule, sizes, actions) in CONFIGS.items():
        runs = {}
        for every in (1, 10):
            pipe = make(schedule, plan(sizes, schedule, actions), every)
            losses = [pipe.train_step(x, y) for x, y in batches]
            stage = pipe.stats(last_steps=STEPS).stages[0]
            runs[every] = (losses, pipe.full_state_dict(), stage)
            pipe.close()
        (l1, s1, st1), (l10, s10, st10) = runs[1], runs[10]
        out[name] = {
            "fused_vs_per_layer_loss": max(abs(a - b) for a, b in zip(l1, l10, strict=True)),
            "fused_vs_per_layer_state": max_diff(s1, s10),
            "fused_vs_reference_loss": max(
                abs(a - b) for a, b in zip(l10, ref_losses, strict=True)
            ),
            "fused_vs_reference_state": max_diff(s10, ref_state),
            "fused_share": st10.fused_share,
            "allocator_peak_bytes": {
                "per_layer": st1.allocator_peak_bytes,
                "fused": st10.allocator_peak_bytes,
            },
        }
    return out


def resume(ctx: StageContext) -> dict[str, Any]:
    batches = data(ctx.device, 64, 6)
    with tempfile.TemporaryDirectory() as tmp:
        pipe = make("1f1b", [4], 10)
        losses = [pipe.train_step(x, y) for x, y in batches[:3]]
        pipe.save_checkpoint(Path(tmp) / "ckpt")
        losses += [pipe.train_step(x, y) for x, y in batches[3:]]
        pipe.close()
        again = make(
            "interleaved_1f1b",
            [2, 2],
            10,
            checkpoint=CheckpointOptions(resume_from=Path(tmp) / "ckpt"),
        )
        resumed = [again.train_step(x, y) for x, y in batches[3:]]
        again.close()
    return {
        "resumed_vs_uninterrupted_loss": max(
            abs(a - b) for a, b in zip(resumed, losses[3:], strict=True)
        )
    }


def speed(ctx: StageContext, d: int = 1024, layers: int = 8, steps: int = 10) -> dict[str, Any]:
    x, y = torch.randn(32, 128, d), torch.randn(32, 128, d)
    out = {}
    for every in (1, 10**9):
        pipe = ElasticPipeline(
            transformer_stack(layers, d, 16, dropout=0.1),
            optimizer=ADAM,
            loss_fn=F.mse_loss,
            schedule="1f1b",
            n_microbatches=8,
            planning=PlanOptions(partition=[layers]),
            elastic=ElasticOptions(measure_memory_every=every),
        )
        for _ in range(2):
            pipe.train_step(x, y)
        times = []
        for _ in range(steps):
            torch.cuda.synchronize() if ctx.device.type == "cuda" else None
            t0 = time.perf_counter()
            pipe.train_step(x, y)
            torch.cuda.synchronize() if ctx.device.type == "cuda" else None
            times.append(time.perf_counter() - t0)
        out["per_layer" if every == 1 else "fused"] = statistics.median(times)
        pipe.close()
    out["fused_speedup"] = out["per_layer"] / out["fused"]
    return out


def check(ctx: StageContext, quick: bool) -> dict[str, Any]:
    result: dict[str, Any] = {"device": str(ctx.device), "backend": ctx.backend}
    if ctx.device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(ctx.device)
    result["exactness"] = exactness(ctx)
    result["resume"] = resume(ctx)
    result["speed"] = speed(ctx, d=64, layers=4, steps=2) if quick else speed(ctx)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--out", type=Path, default=RESULTS / "cuda_check.json")
    parser.add_argument("--quick", action="store_true", help="a small speed check (CPU smoke run)")
    args = parser.parse_args()
    result = pipeline.launch(functools.partial(check, quick=args.quick), 1, timeout_s=600)[0]
    write_json(args.out, result, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
