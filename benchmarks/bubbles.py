"""Simulated bubbles of 1F1B, interleaved 1F1B and ZB-V beside their closed forms.

Why it exists: several stages per rank cut the pipeline bubble (Megatron's
interleaving: (R - 1) / (v * M) of the ideal time instead of 1F1B's (R - 1) / M; ZB-V: only
the ramp of the first forwards left); this gives the bubble of each on S = 8 stages on 4
ranks and S = 16 on 8 ranks against the formulas, with no process: this replays the
schedules' lists in the simulator (`pipeline.pure.simulate`) with equal stage costs.

The model: a forward of f = 1 and a backward of b = 2 per micro-batch (the usual 1:2), a
split backward's weight gradient W = b / 2 (so a chunk's F = BI = W, the zero-bubble
paper's assumption), no link time. 1F1B cuts it into R stages; interleaved 1F1B (v = 2) and
ZB-V into S = 2R stages of half the cost. Per schedule and M:

    bubble       the ranks' idle share of the step: sum(idle) / (R * iteration)
    over_ideal   iteration / (M * (f + b)) - 1: what the bubble adds to the ideal step
    formula      1F1B: (R - 1) / (M + R - 1) of the step, (R - 1) / M over the ideal;
                 interleaved: (R - 1) / (v M + R - 1) of the step, (R - 1) / (v M) over the
                 ideal (Megatron); ZB-V: the ramp (R - 1) f / 2, exact for M >= 2R - 1
    peak_memory  the largest activation memory of a rank, in micro-batches of a whole
                 1F1B stage's activations

Then the same with the planner in the loop ("planned" rows): a model of 32 layers whose
costs vary (f in [0.7, 1.3], b = 2f, seeded), cut by the time planner into each schedule's
S stages (`pipeline.pure.planner`: R stages for 1F1B, 2R for the others) and replayed on
the plan: the bubble then holds the imbalance of whole layers as well as the schedule's.

    python benchmarks/bubbles.py            # a second; writes benchmarks/results/bubbles.json
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

from _run import first_line, write_json

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import get_planner
from pipeline.pure.simulate import StageCost, simulate, stage_costs

HERE = Path(__file__).resolve().parent
F, B = 1.0, 2.0
SHAPES = ((4, 8), (8, 16))  # (ranks, stages of the two-chunk schedules)
MICROBATCHES = (8, 16, 32)
V = 2


def formula(name: str, n_ranks: int, m: int) -> tuple[float, float]:
    """(bubble fraction of the step, added over the ideal step) by the closed form."""
    ideal = m * (F + B)
    extra = {
        "1f1b": (n_ranks - 1) * (F + B),
        "interleaved_1f1b": (n_ranks - 1) * (F + B) / V,
        "zbv": (n_ranks - 1) * F / V,  # the ramp; exact once M >= 2R - 1
    }[name]
    return extra / (ideal + extra), extra / ideal


def row(name: str, n_ranks: int, m: int) -> dict[str, Any]:
    # activation bytes: 2 per micro-batch for a whole stage, 1 for a half (a chunk)
    if name == "1f1b":
        stages = [StageCost(F, B, activation_bytes=2)] * n_ranks
    else:
        stages = [StageCost(F / V, B / V, activation_bytes=1)] * (V * n_ranks)
    result = simulate(name, stages, m)
    bubble, over = formula(name, n_ranks, m)
    return {
        "schedule": name,
        "ranks": n_ranks,
        "stages": len(stages),
        "microbatches": m,
        "iteration": result.iteration_s,
        "bubble": result.bubble_fraction,
        "bubble_formula": bubble,
        "over_ideal": result.iteration_s / (m * (F + B)) - 1,
        "over_ideal_formula": over,
        "formula_exact": name != "zbv" or m >= 2 * n_ranks - 1,
        "peak_memory": max(result.peak_rank_activation_bytes) / 2,
    }


def planned_row(name: str, n_ranks: int, m: int, costs: list[LayerCost]) -> dict[str, Any]:
    n_stages = n_ranks if name == "1f1b" else V * n_ranks
    plan = get_planner("time").plan(costs, n_stages, schedule=name, n_microbatches=m)
    result = simulate(name, stage_costs(costs, plan.sizes, plan.actions), m)
    work = m * sum(c.forward_s + c.backward_s for c in costs) / n_ranks  # a rank's share
    bubble, over = formula(name, n_ranks, m)
    return {
        "schedule": name,
        "ranks": n_ranks,
        "stages": n_stages,
        "microbatches": m,
        "sizes": list(plan.sizes),
        "iteration": result.iteration_s,
        "predicted_iteration": plan.predicted_iteration_s,
        "bubble": result.bubble_fraction,
        "bubble_formula_equal_stages": bubble,
        "over_ideal": result.iteration_s / work - 1,
        "over_ideal_formula_equal_stages": over,
    }


def model_costs(n_layers: int = 32, seed: int = 0) -> list[LayerCost]:
    rng = random.Random(seed)
    out = []
    for i in range(n_layers):
        f = F * rng.uniform(0.7, 1.3)
        out.append(LayerCost(f"layer{i}", f, 2 * f, activation_bytes=1, output_bytes=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--out", type=Path, default=HERE / "results" / "bubbles.json")
    args = parser.parse_args()
    rows = [
        row(name, n_ranks, m)
        for n_ranks, _ in SHAPES
        for m in MICROBATCHES
        for name in ("1f1b", "interleaved_1f1b", "zbv")
    ]
    print(
        f"{'schedule':<17} {'R':>2} {'S':>3} {'M':>3} {'bubble':>7} {'formula':>7} "
        f"{'+ideal':>7} {'formula':>7} {'peak mem':>8}"
    )
    for r in rows:
        mark = "" if r["formula_exact"] else "  (formula: M >= 2R - 1)"
        print(
            f"{r['schedule']:<17} {r['ranks']:>2} {r['stages']:>3} {r['microbatches']:>3} "
            f"{r['bubble']:>7.4f} {r['bubble_formula']:>7.4f} {r['over_ideal']:>7.4f} "
            f"{r['over_ideal_formula']:>7.4f} {r['peak_memory']:>8.1f}{mark}"
        )
    costs = model_costs()
    planned = [
        planned_row(name, n_ranks, m, costs)
        for n_ranks, _ in SHAPES
        for m in MICROBATCHES
        for name in ("1f1b", "interleaved_1f1b", "zbv")
    ]
    print("\nplanned (32 layers of varying cost, the time planner's partition):")
    print(
        f"{'schedule':<17} {'R':>2} {'S':>3} {'M':>3} {'bubble':>7} {'equal':>7} "
        f"{'+ideal':>7} {'equal':>7}"
    )
    for r in planned:
        print(
            f"{r['schedule']:<17} {r['ranks']:>2} {r['stages']:>3} {r['microbatches']:>3} "
            f"{r['bubble']:>7.4f} {r['bubble_formula_equal_stages']:>7.4f} "
            f"{r['over_ideal']:>7.4f} {r['over_ideal_formula_equal_stages']:>7.4f}"
        )
    config = {
        "forward": F,
        "backward": B,
        "weight": B / 2,
        "chunks_per_rank": V,
        "link": "free",
        "planned_model": "32 layers, f in [0.7, 1.3] (seed 0), b = 2f",
        "command": "python benchmarks/bubbles.py",
    }
    write_json(args.out, {"config": config, "rows": rows, "planned": planned}, newline=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
