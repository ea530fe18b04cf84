"""The collective side of planning: every rank profiles a share, rank 0 decides, all agree.

The planners (`pipeline.pure.planner`) are pure functions of layer costs. This module gets those
costs into every process and the decision back out, with one collective per exchange:

    first step ("auto")        re-plan (rebalance)
    1. every rank traces the   1. every stage reports its layers' measured costs
       shapes (meta device)       (smoothed forward/backward seconds, saved bytes)
    2. rank r times distinct   2. all_gather: every rank holds all costs
       signatures r, r+S, ...
    3. all_gather the timings  3. rank 0 runs `replan` (adopt only if it pays back)
    4. rank 0 plans            4. broadcast the decision
    5. broadcast the Plan

Rank 0's plan is the one in force, so ranks never act on plans that differ by timing noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from pipeline.distributed.comm import Comm
from pipeline.local.cost_cache import CostCache
from pipeline.local.profiler import estimate, sandbox, trace_shapes
from pipeline.local.spec import LayerSpec
from pipeline.local.stage import Stage
from pipeline.pure.costs import LayerCost

__all__ = ["measured_costs", "profile_costs"]


def profile_costs(
    comm: Comm,
    specs: Sequence[LayerSpec],
    example: Any,
    *,
    device: torch.device,
    opt_ratio: float,
    cache: CostCache,
    source: str = "sandbox",
) -> tuple[list[LayerCost], list[str]]:
    """Costs of every layer for one micro-batch shaped like `example`, the same on all ranks,
    and the layers' signatures (the keys their costs have in `cache`).

    source: "estimate" (FLOPs and shapes only) or "sandbox" (one timed run per distinct
    layer signature not yet in `cache`, shared out over the ranks). A layer that fails to
    build or run raises on every rank.
    """
    if source not in ("estimate", "sandbox"):
        raise ValueError(f"profile source must be 'estimate' or 'sandbox', got {source!r}")
    counted = source == "estimate"  # only an estimate reads the FLOPs
    shapes = comm.together(lambda: trace_shapes(specs, example, count_flops=counted))
    signatures = [shape.signature for shape in shapes]
    ratio = opt_ratio  # optimizer-state bytes per parameter byte
    if source == "estimate":
        return comm.agree(lambda: estimate(shapes, device, ratio)), signatures
    rank, world = comm.rank, comm.world_size
    comm.together(
        lambda: sandbox(specs, shapes, device, ratio, cache, mine=lambda i: i % world == rank)
    )
    for part in comm.all_gather_object(cache.entries()):
        cache.update(part)
    costs = comm.agree(lambda: sandbox(specs, shapes, device, ratio, cache, mine=lambda i: False))
    return costs, signatures


def measured_costs(
    comm: Comm, stages: Sequence[Stage], n_layers: int
) -> tuple[list[LayerCost], list[str]]:
    """Every layer's smoothed measured costs and memory action, from the stage running it
    (this rank's `stages`; gathered in stage order, whichever rank holds which)."""
    mine = [
        (
            stage.index,
            [(stage.measured_cost(i), layer.action) for i, layer in enumerate(stage.layers)],
        )
        for stage in stages
    ]
    parts = sorted(part for rank in comm.all_gather_object(mine) for part in rank)
    gathered = [entry for _, entries in parts for entry in entries]
    assert len(gathered) == n_layers, "every layer is owned by exactly one stage"
    return [c for c, _ in gathered], [a for _, a in gathered]
