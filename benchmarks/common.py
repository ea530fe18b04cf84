"""Shared by the benchmarks: the deliberately unbalanced stack and interleaved timing."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist

from pipeline import LayerSpec
from pipeline.models import transformer_stack

D_MODEL, HEADS, SEQ, BATCH = 256, 4, 64, 32


def uneven_stack(n_layers: int = 16, heavy: int = 8, widen: int = 4) -> list[LayerSpec]:
    """Transformer layers whose first `heavy` have a `widen`x wider feed-forward block."""
    widths = [4 * D_MODEL * (widen if i < heavy else 1) for i in range(n_layers)]
    return transformer_stack(n_layers, D_MODEL, HEADS, d_ff=widths, dropout=0.1)


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, SEQ, D_MODEL, generator=g)  # (batch, seq, d_model)
    return x, torch.randn(BATCH, SEQ, D_MODEL, generator=g)


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
