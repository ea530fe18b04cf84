"""The runtime's own costs on this machine, measured once: per micro-batch, per message, per step.

A shape's prediction (`pipeline.pure.shape`) adds to the layers' costs what the runtime
itself spends: a fixed cost per micro-batch on every stage, the latency of each message
between two stage processes, and a fixed cost per step (the optimizer, the loss agreed on
every rank). They depend on the machine and the Python, not on the model, so they are
measured once, on layers that cost next to nothing, and kept in the cost cache:

    1. one stage:   steps at M = 1 and M = 8 (batch 8)  ->  t1(M) = step_s + M x microbatch_s
    2. two stages:  the same                           ->  t2(M) = c + M x (microbatch_s
                                                               + 2 x message_s)
       (in 1F1B's steady state each stage receives one activation and one gradient per
       micro-batch, and sends one of each; a send and a receive make one message's latency)

Each time is the median of the timed steps after a warm-up, on one thread per stage.
"""

from __future__ import annotations

import functools
import statistics
import time

import torch
from torch import nn

from pipeline.distributed.elastic import ElasticPipeline
from pipeline.distributed.launch import StageContext, launch
from pipeline.distributed.options import PlanOptions
from pipeline.local.spec import LayerSpec
from pipeline.pure.shape import RuntimeOverheads

__all__ = ["measure_overheads"]

_BATCH, _MANY = 8, 8  # a batch of 8 rows, split into 1 or 8 micro-batches
_WIDTH = 4


def measure_overheads(*, steps: int = 30, timeout_s: float = 120.0) -> RuntimeOverheads:
    """Time a pipeline of two near-free layers on one and on two stages (module doc)."""
    one, two = (  # processes of its own, even in a torchrun rank (a nas study's rank 0)
        launch(
            functools.partial(_timed, steps=steps),
            n_stages,
            threads_per_stage=1,
            timeout_s=timeout_s,
            local=True,
        )[0]
        for n_stages in (1, 2)
    )
    microbatch_s = max(0.0, (one[_MANY] - one[1]) / (_MANY - 1))
    step_s = max(0.0, one[1] - microbatch_s)
    slope_two = (two[_MANY] - two[1]) / (_MANY - 1)
    message_s = max(0.0, (slope_two - microbatch_s) / 2)
    return RuntimeOverheads(microbatch_s=microbatch_s, message_s=message_s, step_s=step_s)


def _layer() -> nn.Module:
    return nn.Linear(_WIDTH, _WIDTH)


def _timed(ctx: StageContext, steps: int) -> dict[int, float]:
    """Median step seconds at 1 and at `_MANY` micro-batches (every rank; rank 0's kept)."""
    specs = [LayerSpec(f"overhead{i}", _layer) for i in range(2)]
    sizes = [2] if ctx.world_size == 1 else [1, 1]
    x, y = torch.randn(_BATCH, _WIDTH), torch.randn(_BATCH, _WIDTH)
    medians = {}
    for m in (1, _MANY):
        pipe = ElasticPipeline(
            specs,
            optimizer=functools.partial(torch.optim.SGD, lr=1e-3),
            loss_fn=nn.functional.mse_loss,
            schedule="1f1b",
            n_microbatches=m,
            planning=PlanOptions(partition=sizes),
        )
        try:
            times = []
            for step in range(steps + 5):
                started = time.perf_counter()
                pipe.train_step(x, y)
                if step >= 5:  # warm-up: allocator, first measured steps
                    times.append(time.perf_counter() - started)
        finally:
            pipe.close()
        medians[m] = statistics.median(times)
    return medians
