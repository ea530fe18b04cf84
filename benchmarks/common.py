"""Shared by the benchmarks: the deliberately unbalanced stack, interleaved timing, a
training step in one process (gradients accumulated over micro-batches) and one of
torch.distributed.pipelining (the peer) on any layer list and split, and an experiment's
settings. (`_run` holds the scaffolding around a measurement, `_torch_peer` the checked
multi-chunk torch schedules.)"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage

import pipeline
from pipeline import LayerSpec, StageContext
from pipeline.local.models import transformer_stack
from pipeline.local.spec import build_layer
from pipeline.pure.partition import bounds

if TYPE_CHECKING:
    from nas.settings import NasSettings

D_MODEL, HEADS, SEQ, BATCH = 256, 4, 64, 32

# The unbalanced workload of balance.py and rebalance.py: 16 pre-norm Transformer layers whose
# first 8 have an 8x wider feed-forward block (d_ff 8192 instead of 1024), so that one heavy
# layer costs about 5x a plain one (measured, 1 thread); batch 32 in 16 micro-batches of 2.
UNEVEN_LAYERS, UNEVEN_HEAVY, UNEVEN_WIDEN = 16, 8, 8
UNEVEN_BATCH, UNEVEN_MICROBATCHES = 32, 16


def uneven_stack(
    n_layers: int = UNEVEN_LAYERS, heavy: int = UNEVEN_HEAVY, widen: int = UNEVEN_WIDEN
) -> list[LayerSpec]:
    """Transformer layers whose first `heavy` have a `widen`x wider feed-forward block."""
    widths = [4 * D_MODEL * (widen if i < heavy else 1) for i in range(n_layers)]
    return transformer_stack(n_layers, D_MODEL, HEADS, d_ff=widths, dropout=0.1)


def uneven_config() -> dict[str, Any]:
    """The unbalanced workload, as benchmarks write it into their JSON."""
    return {
        "layers": UNEVEN_LAYERS,
        "d_model": D_MODEL,
        "seq": SEQ,
        "batch": UNEVEN_BATCH,
        "microbatches": UNEVEN_MICROBATCHES,
        "schedule": "1f1b",
        "stages": 2,
        "heavy_layers": f"0-{UNEVEN_HEAVY - 1}: d_ff {4 * D_MODEL * UNEVEN_WIDEN} "
        f"({UNEVEN_WIDEN}x the others' {4 * D_MODEL})",
    }


def batch(seed: int = 0, size: int = BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, SEQ, D_MODEL, generator=g)  # (batch, seq, d_model)
    return x, torch.randn(size, SEQ, D_MODEL, generator=g)


def barrier_timed(work: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds of `work()` on the slowest rank (barrier to barrier), and its result."""
    dist.barrier()
    t0 = time.perf_counter()
    result = work()
    dist.barrier()
    return time.perf_counter() - t0, result


def on_ranks(
    run: Callable[..., Any], stages: int = 2, timeout_s: float | None = None, **options: Any
) -> Any:
    """`run(ctx, **options)` in `stages` stage processes of one thread each (within
    `timeout_s`, default `pipeline.launch`'s); rank 0's result."""
    step = functools.partial(run, **options)
    if timeout_s is None:
        return pipeline.launch(step, stages, threads_per_stage=1)[0]
    return pipeline.launch(step, stages, threads_per_stage=1, timeout_s=timeout_s)[0]


def timed_rounds(
    runs: Mapping[str, Callable[[], object]], rounds: int, steps: int
) -> dict[str, list[float]]:
    """Seconds per step of each run, `rounds` times, runs interleaved, barrier to barrier."""
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, step in runs.items():
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            dist.barrier()
            seconds[name].append((time.perf_counter() - t0) / steps)
    return seconds


def optimizer_step(
    forward_backward: Callable[[], object], optimizer: torch.optim.Optimizer
) -> Callable[[], None]:
    """A training step: `forward_backward`, then the optimizer's step, gradients cleared."""

    def step() -> None:
        forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def accumulate(
    model: nn.Module,
    xy: tuple[torch.Tensor, torch.Tensor],
    m: int,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.mse_loss,
) -> Callable[[], None]:
    """Forward and backward of the batch `xy` in one process, gradients accumulated over
    its `m` micro-batches (what one process does for a pipeline's step)."""
    x, y = xy

    def forward_backward() -> None:
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            (loss_fn(model(xi), yi) / m).backward()

    return forward_backward


def torch_pipelining_step(
    ctx: StageContext,
    specs: list[LayerSpec],
    sizes: list[int],
    schedule_cls: type,
    n_microbatches: int,
    optimizer: Callable[..., torch.optim.Optimizer],
    xy: tuple[torch.Tensor, torch.Tensor],
) -> Callable[[], None]:
    """One training step (MSE loss) of torch.distributed.pipelining on this rank's share
    (`sizes`, one stage per rank) of the same layers, weights from `build_layer` seed 0."""
    start, stop = bounds(sizes)[ctx.rank]
    module = nn.Sequential(*[build_layer(s, 0, ctx.device) for s in specs[start:stop]])
    stage = PipelineStage(module, ctx.rank, len(sizes), ctx.device)
    schedule = schedule_cls(stage, n_microbatches=n_microbatches, loss_fn=F.mse_loss)
    x, y = xy

    def forward_backward() -> None:
        if ctx.rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])

    return optimizer_step(forward_backward, optimizer(module.parameters()))


def experiment_settings(experiment: str, overrides: list[str]) -> NasSettings:
    # the harness only here: the runtime's benchmarks run where only torch is installed
    from hydra import compose, initialize_config_dir

    from nas.config import CONFIG_DIR, register, to_settings

    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}", "tracker=none", *overrides])
    return to_settings(cfg)
