"""Planner speed at scale, and what planning buys over equal layer counts.

1. Planning time (median of --repeats runs) of the time planner and the memory planner
   (CAPSlog) for 1,000 and 10,000 layers on 8 and 64 stages, 1F1B, 8 micro-batches, with a
   per-stage memory budget that binds (the time planner must recompute to meet it).
   Target (docs/design.md, section 6): 10,000 layers x 64 stages in < 1 s.
2. Heterogeneous Transformer variants (attention with 4-16 heads, FFNs 1-8x wide, GLUs,
   separable convolutions; encoder and decoder cells, as an Evolved-Transformer-style search
   produces them), generated deterministically: the time planner's predicted bottleneck and
   iteration time vs equal layer counts, without and with a memory budget.

Costs come from shapes and FLOPs (bf16, Adam, an effective 150 TFLOP/s), not from a device,
so the numbers are the planners' predictions. Prints JSON and writes it to
benchmarks/results/planner.json.

    python benchmarks/planner.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from _run import RESULTS, first_line, write_json

from pipeline.pure.costs import LayerCost, LinkCost
from pipeline.pure.partition import equal_sizes
from pipeline.pure.planner import MemoryPlanner, Plan, Planner, TimePlanner

TOKENS, D_MODEL, BYTES = 4 * 512, 1024, 2  # micro-batch x sequence, residual width, bf16
FLOPS = 150e12  # effective FLOP/s
LINK = LinkCost(bandwidth_bytes_per_s=12e9, latency_s=10e-6)
SCHEDULE, MICROBATCHES = "1f1b", 8


def layer(key: str, kind: str, size: int) -> LayerCost:
    """One layer's costs from its shapes: attention(heads), ffn(width x), glu, conv(kernel)."""
    t, d = TOKENS, D_MODEL
    if kind == "attention":
        params, flops = 4 * d * d, 2 * t * 4 * d * d + 4 * t * t * d
        saved = 5 * t * d + 2 * size * t * t // 4  # q, k, v, out, input; scores (local windows)
    elif kind == "ffn":
        params, flops = 2 * d * size * d, 4 * t * size * d * d
        saved = t * d + 2 * t * size * d
    elif kind == "glu":
        params, flops = 2 * d * d, 4 * t * d * d
        saved = 4 * t * d
    elif kind == "conv":  # depthwise-separable: depthwise k x 1, then pointwise
        params, flops = d * size + d * d, 2 * t * (d * size + d * d)
        saved = 3 * t * d
    else:
        raise ValueError(kind)
    forward = flops / FLOPS
    return LayerCost(
        key,
        forward_s=forward,
        backward_s=2 * forward,
        activation_bytes=saved * BYTES,
        output_bytes=t * d * BYTES,
        param_bytes=params * BYTES,
        grad_bytes=params * BYTES,
        optimizer_bytes=params * 8,  # Adam: two fp32 moments
    )


def candidate(n_layers: int, seed: int) -> list[LayerCost]:
    """An encoder-decoder stack of cells whose blocks are drawn from the search space."""
    rng = random.Random(seed)
    encoder = [
        ("conv", rng.choice([3, 7, 11])),
        ("glu", 0),
        ("attention", rng.choice([4, 8])),
        ("ffn", rng.choice([2, 4])),
    ]
    decoder = [
        ("attention", rng.choice([8, 16])),
        ("attention", 8),
        ("conv", rng.choice([7, 11])),
        ("ffn", rng.choice([4, 8])),
    ]
    kinds: list[tuple[str, int]] = []
    while len(kinds) < n_layers:
        cell = encoder if len(kinds) < n_layers // 2 else decoder
        for kind, size in cell:
            if rng.random() < 0.3:  # mutate a block, as the search does
                kind, size = rng.choice(
                    [
                        ("attention", rng.choice([4, 8, 16])),
                        ("ffn", rng.choice([1, 2, 4, 8])),
                        ("glu", 0),
                        ("conv", rng.choice([3, 5, 7, 9, 11])),
                    ]
                )
            kinds.append((kind, size))
    return [layer(f"{i}.{k}{s or ''}", k, s) for i, (k, s) in enumerate(kinds[:n_layers])]


def median_s(fn: Callable[[], Any], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def plan_with(planner: Planner, costs: list[LayerCost], n_stages: int, budget: int | None) -> Plan:
    return planner.plan(
        costs, n_stages, schedule=SCHEDULE, n_microbatches=MICROBATCHES, memory_budget=budget
    )


def scale(repeats: int) -> list[dict[str, Any]]:
    """Planning time at 1,000 / 10,000 layers on 8 / 64 stages, with binding budgets."""
    rows = []
    for n_layers in (1_000, 10_000):
        costs = candidate(n_layers, seed=0)
        for n_stages in (8, 64):
            fastest = plan_with(TimePlanner(), costs, n_stages, None)
            smallest = plan_with(MemoryPlanner(), costs, n_stages, None)
            budgets: list[tuple[Planner, int]] = [
                (TimePlanner(), int(0.8 * max(fastest.predicted_stage_bytes))),  # recompute
                (MemoryPlanner(), int(1.05 * max(smallest.predicted_stage_bytes))),
            ]
            for planner, budget in budgets:
                plan = plan_with(planner, costs, n_stages, budget)
                seconds = median_s(partial(plan_with, planner, costs, n_stages, budget), repeats)
                rows.append(
                    {
                        "planner": planner.name,
                        "layers": n_layers,
                        "stages": n_stages,
                        "memory_budget": budget,
                        "median_s": seconds,
                        "largest_stage_bytes": max(plan.predicted_stage_bytes),
                        "recomputed_layers": plan.actions.count("recompute"),
                        "bottleneck_s": plan.bottleneck_s,
                    }
                )
    return rows


def versus_equal(
    n_layers: int,
    n_stages: int,
    seed: int,
    n_microbatches: int,
    budget_fraction: float | None = None,
) -> dict[str, Any]:
    """The time planner vs equal layer counts on one generated candidate."""
    costs = candidate(n_layers, seed)
    options: dict[str, Any] = {"schedule": SCHEDULE, "n_microbatches": n_microbatches, "link": LINK}
    planner = TimePlanner()
    equal = planner.evaluate(costs, equal_sizes(n_layers, n_stages), **options)
    budget = None
    if budget_fraction is not None:
        budget = int(budget_fraction * max(equal.predicted_stage_bytes))
    plan = planner.plan(costs, n_stages, memory_budget=budget, **options)
    row = {
        "layers": n_layers,
        "stages": n_stages,
        "microbatches": n_microbatches,
        "seed": seed,
        "memory_budget": budget,
        "kinds": sorted({c.key.split(".")[1] for c in costs}),
        "planned_sizes": list(plan.sizes),
        "recomputed_layers": plan.actions.count("recompute"),
        "bottleneck_s": {"planned": plan.bottleneck_s, "equal": equal.bottleneck_s},
        "iteration_s": {
            "planned": plan.predicted_iteration_s,
            "equal": equal.predicted_iteration_s,
        },
        "bottleneck_ratio": equal.bottleneck_s / plan.bottleneck_s,
        "iteration_speedup": equal.predicted_iteration_s / plan.predicted_iteration_s,
    }
    if budget is not None:
        row["equal_fits_budget"] = max(equal.predicted_stage_bytes) <= budget
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS / "planner.json")
    args = parser.parse_args()

    timing = scale(args.repeats)
    shapes = [(48, 4), (96, 8)]
    hetero = [versus_equal(n, s, seed, m) for n, s in shapes for m in (8, 32) for seed in range(3)]
    budgeted = [versus_equal(96, 8, seed, 8, budget_fraction=0.7) for seed in range(3)]
    largest = [r["median_s"] for r in timing if (r["layers"], r["stages"]) == (10_000, 64)]
    report = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
        "settings": {"schedule": SCHEDULE, "n_microbatches": MICROBATCHES, "repeats": args.repeats},
        "planning_time": timing,
        "largest_10k_x_64_s": max(largest),
        "heterogeneous_vs_equal": hetero,
        "heterogeneous_vs_equal_with_budget": budgeted,
        "geomean_bottleneck_ratio": statistics.geometric_mean(
            [r["bottleneck_ratio"] for r in hetero]
        ),
        "geomean_iteration_speedup": {
            f"m{m}": statistics.geometric_mean(
                [r["iteration_speedup"] for r in hetero if r["microbatches"] == m]
            )
            for m in (8, 32)
        },
    }
    write_json(args.out, report, newline=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
