"""How fast a failure in one stage is seen on every rank, and what it costs afterwards.

On the throughput stack (8 Transformer layers, d_model 256, batch 32 in 8 micro-batches,
2 stages, CPU gloo, 1 thread each), an exception is injected in the middle of a step (step 3,
micro-batch 4) in each phase (a layer's forward, its backward, the loss, the optimizer step)
on each stage. Reported per case: the failed `train_step`'s seconds on every rank (from the
call to the `StageError`, the time to learn of the failure included) beside the median
healthy step, and whether the next `reconfigure` + step worked. Then a stage is killed with
SIGKILL (and another exits with os._exit) mid-step: seconds from the death to `launch`
raising `StageFailedError` in the caller.

    python benchmarks/faults.py        # JSON to stdout and benchmarks/results/faults.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _run import first_line
from common import BATCH, D_MODEL, HEADS, batch
from torch import nn

import pipeline
from pipeline import (
    ElasticPipeline,
    LayerSpec,
    PlanOptions,
    StageContext,
    StageError,
    StageFailedError,
)
from pipeline.local.models import transformer_stack

LAYERS, MICROBATCHES, STEP, MICROBATCH = 8, 8, 3, 4
PHASES = ["forward", "backward", "loss", "optimizer"]


class Armed:
    """The injected fault: (rank, phase), counted from `arm`; read in every stage process."""

    rank, phase, calls = -1, "", 0
    stamp = ""  # where a dying stage writes the time of its death

    @classmethod
    def arm(cls, rank: int, phase: str) -> None:
        cls.rank, cls.phase, cls.calls = rank, phase, 0

    @classmethod
    def due(cls, phase: str, per_step: int) -> bool:
        if phase != cls.phase or dist.get_rank() != cls.rank:
            return False
        cls.calls += 1
        return cls.calls == STEP * per_step + (MICROBATCH if per_step > 1 else 0) + 1


class _Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if Armed.due("backward", MICROBATCHES):
            raise RuntimeError("injected backward failure")
        return grad


class Tripwire(nn.Module):
    """An identity layer at the end of each stage that raises (or dies) when armed."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if Armed.due("forward", MICROBATCHES):
            raise RuntimeError("injected forward failure")
        if Armed.phase in ("kill", "exit") and Armed.due(Armed.phase, MICROBATCHES):
            Path(Armed.stamp).write_text(str(time.time()))
            if Armed.phase == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        return _Backward.apply(x)


def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if Armed.due("loss", MICROBATCHES):
        raise RuntimeError("injected loss failure")
    return F.mse_loss(out, y)


class SGD(torch.optim.SGD):
    def step(self, closure: Any = None) -> Any:
        if Armed.due("optimizer", 1):
            raise RuntimeError("injected optimizer failure")
        return super().step(closure)


def specs() -> list[LayerSpec]:
    blocks = transformer_stack(LAYERS, D_MODEL, HEADS, dropout=0.1)
    half = LAYERS // 2
    return [
        *blocks[:half],
        LayerSpec("trip0", Tripwire),
        *blocks[half:],
        LayerSpec("trip1", Tripwire),
    ]


def cases(ctx: StageContext) -> list[dict[str, Any]]:
    opt = functools.partial(SGD, lr=1e-3)
    half = LAYERS // 2 + 1
    pipe = ElasticPipeline(
        specs(),
        optimizer=opt,
        loss_fn=loss_fn,
        n_microbatches=MICROBATCHES,
        planning=PlanOptions(partition=[half, half]),
    )
    x, y = batch()
    out = []
    for rank in range(ctx.world_size):
        for phase in PHASES:
            if phase == "loss" and rank != ctx.world_size - 1:
                continue
            pipe.reconfigure(specs(), partition=[half, half])
            Armed.arm(rank, phase)
            healthy, failed, error = [], 0.0, ""
            for _ in range(STEP + 1):
                t0 = time.perf_counter()
                try:
                    pipe.train_step(x, y)
                    healthy.append(time.perf_counter() - t0)
                except StageError as exc:
                    failed, error = time.perf_counter() - t0, f"{exc.phase} {exc.layer}"
            Armed.arm(-1, "")
            pipe.reconfigure(specs(), partition=[half, half])
            t0 = time.perf_counter()
            pipe.train_step(x, y)
            out.append(
                {
                    "stage": rank,
                    "phase": phase,
                    "error": error,
                    "failed_step_s": failed,
                    "healthy_step_s": statistics.median(healthy),
                    "next_step_after_reconfigure_s": time.perf_counter() - t0,
                }
            )
    pipe.close()
    return out


def dies(ctx: StageContext, how: str, stamp: str) -> None:
    Armed.stamp = stamp
    Armed.arm(1, how)
    half = LAYERS // 2 + 1
    pipe = ElasticPipeline(
        specs(),
        optimizer=functools.partial(SGD, lr=1e-3),
        loss_fn=loss_fn,
        n_microbatches=MICROBATCHES,
        planning=PlanOptions(partition=[half, half]),
    )
    x, y = batch()
    for _ in range(STEP + 2):
        pipe.train_step(x, y)


def death(how: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        stamp = str(Path(tmp) / "died")
        try:
            pipeline.launch(
                functools.partial(dies, how=how, stamp=stamp), 2, threads_per_stage=1, timeout_s=300
            )
        except StageFailedError as error:
            seen = time.time()
            return {
                "how": how,
                "stage": error.stage,
                "timeout_s": 300,
                "detected_s": seen - float(Path(stamp).read_text()),
            }
    raise AssertionError("launch did not raise")


def main() -> None:
    argparse.ArgumentParser(description=first_line(__doc__)).parse_args()  # --help; no options
    results = pipeline.launch(cases, 2, threads_per_stage=1, timeout_s=300)
    per_case = []
    for rank_cases in zip(*results, strict=True):
        first = rank_cases[0]
        per_case.append(
            {
                **{k: first[k] for k in ("stage", "phase", "error")},
                "failed_step_s_per_rank": [c["failed_step_s"] for c in rank_cases],
                "healthy_step_s": first["healthy_step_s"],
                "next_step_after_reconfigure_s": first["next_step_after_reconfigure_s"],
            }
        )
    out = {
        "config": {
            "layers": LAYERS,
            "d_model": D_MODEL,
            "batch": BATCH,
            "microbatches": MICROBATCHES,
            "stages": 2,
            "schedule": "1f1b",
            "injected_at": {"step": STEP, "microbatch": MICROBATCH},
        },
        "failures": per_case,
        "deaths": [death("kill"), death("exit")],
    }
    text = json.dumps(out, indent=2)
    print(text)
    path = Path(__file__).parent / "results" / "faults.json"
    path.write_text(text + "\n")


if __name__ == "__main__":
    main()
