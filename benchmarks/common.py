"""Shared by the benchmarks: the deliberately unbalanced stack, interleaved timing, and a
training step of torch.distributed.pipelining (the peer) on any layer list and split."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage

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


def agreed_check(
    loss: float | None, worst_grad: float, ref_loss: float, tolerances: tuple[float, float]
) -> dict[str, Any]:
    """A torch schedule's first step against one process, agreed by every rank: `loss` is
    the step's (None where this rank has no last chunk), `worst_grad` this rank's largest
    max |g - ref| / max |ref|; `tolerances` (loss abs, grad rel)."""
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (loss, worst_grad))
    step_loss = next(v[0] for v in gathered if v[0] is not None)
    grad_error = max(v[1] for v in gathered)
    return {
        "first_step_loss": step_loss,
        "single_process_loss": ref_loss,
        "loss_abs_diff": abs(step_loss - ref_loss),
        "max_rel_grad_diff": grad_error,
        "correct": abs(step_loss - ref_loss) <= tolerances[0] and grad_error <= tolerances[1],
    }


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
    opt = optimizer(module.parameters())
    x, y = xy

    def step() -> None:
        if ctx.rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def experiment_settings(experiment: str, overrides: list[str]) -> NasSettings:
    # the harness only here: the runtime's benchmarks run where only torch is installed
    from hydra import compose, initialize_config_dir

    from nas.config import CONFIG_DIR, register, to_settings

    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}", "tracker=none", *overrides])
    return to_settings(cfg)
