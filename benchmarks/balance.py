"""Planned partition vs equal layer counts on a deliberately unbalanced stack, for real.

16 Transformer layers (d_model 256, sequence 64, batch 32, 16 micro-batches, 1F1B) whose
first eight have an 8x wider feed-forward block (`common.uneven_stack`), on 2 stages (CPU
gloo, 1 thread per stage).
Equal layer counts put all the heavy layers on stage 0; partition="auto" profiles the
layers (sandbox) and plans. Both pipelines live in the same processes and are timed in
interleaved rounds. Reports the measured throughput ratio (target >= 1.25x) and the
planner's predicted iteration time against the measured one (target within 15%).

    python benchmarks/balance.py [--rounds 3] [--steps 3]
"""

from __future__ import annotations

import functools
import statistics
from typing import Any

import torch
import torch.nn.functional as F
from _run import print_json, rounds_parser, write_json
from common import (
    UNEVEN_BATCH,
    UNEVEN_LAYERS,
    UNEVEN_MICROBATCHES,
    batch,
    on_ranks,
    timed_rounds,
    uneven_config,
    uneven_stack,
)

from pipeline import ElasticPipeline, PlanOptions, StageContext
from pipeline.pure.planner import evaluate

MICROBATCHES, LAYERS = UNEVEN_MICROBATCHES, UNEVEN_LAYERS
EQUAL = [LAYERS // 2, LAYERS - LAYERS // 2]
OPTIMIZER = functools.partial(torch.optim.AdamW, lr=1e-4)


def run(ctx: StageContext, rounds: int, steps: int) -> dict[str, Any]:
    x, y = batch(size=UNEVEN_BATCH)
    pipes = {
        "equal": ElasticPipeline(
            uneven_stack(),
            optimizer=OPTIMIZER,
            loss_fn=F.mse_loss,
            n_microbatches=MICROBATCHES,
            planning=PlanOptions(partition=EQUAL),
        ),
        "planned": ElasticPipeline(
            uneven_stack(),
            optimizer=OPTIMIZER,
            loss_fn=F.mse_loss,
            n_microbatches=MICROBATCHES,
            planning=PlanOptions(partition="auto"),
        ),
    }
    for pipe in pipes.values():  # the first step plans ("auto"); then warm up
        for _ in range(2):
            pipe.train_step(x, y)
    seconds = timed_rounds(
        {k: functools.partial(p.train_step, x, y) for k, p in pipes.items()}, rounds, steps
    )
    planned = pipes["planned"]
    assert planned.plan is not None
    measured, actions = planned.layer_costs()
    stats = {name: pipe.stats() for name, pipe in pipes.items()}
    return {
        "seconds": seconds,
        "plan": planned.plan.to_dict(),
        "predicted_equal_s": evaluate(
            planned_costs(planned), EQUAL, n_microbatches=MICROBATCHES
        ).predicted_iteration_s,
        "repredicted_from_measured_costs_s": {
            name: evaluate(
                measured, sizes, actions, n_microbatches=MICROBATCHES
            ).predicted_iteration_s
            for name, sizes in (("planned", planned.sizes), ("equal", EQUAL))
        },
        "stats": stats,
    }


def planned_costs(pipe: ElasticPipeline) -> Any:
    """The sandbox costs the plan was made from (the cache holds them by signature)."""
    from pipeline.distributed.agreement import profile_costs

    example = batch(size=UNEVEN_BATCH)[0].chunk(MICROBATCHES)[0]
    costs, _ = profile_costs(
        pipe.comm, pipe.specs, example, device=pipe.device, opt_ratio=2.0, cache=pipe.cost_cache
    )
    return costs


def main() -> None:
    args = rounds_parser(__doc__, rounds=3, steps=3, out="balance.json").parse_args()
    r = on_ranks(run, rounds=args.rounds, steps=args.steps)
    med = {k: statistics.median(v) for k, v in r["seconds"].items()}
    predicted = r["plan"]["predicted_iteration_s"]
    report = {
        "config": {**uneven_config(), "rounds": args.rounds, "steps_per_round": args.steps},
        "planned_sizes": r["plan"]["sizes"],
        "planned_actions": r["plan"]["actions"],
        "median_step_s": med,
        "samples_per_s": {k: UNEVEN_BATCH / v for k, v in med.items()},
        "throughput_ratio_planned_vs_equal": med["equal"] / med["planned"],
        "predicted_iteration_s": {"planned": predicted, "equal": r["predicted_equal_s"]},
        "predicted_vs_measured_planned": predicted / med["planned"],
        "predicted_vs_measured_equal": r["predicted_equal_s"] / med["equal"],
        "repredicted_from_measured_costs_s": r["repredicted_from_measured_costs_s"],
        "targets": {"throughput_ratio": 1.25, "prediction_error": 0.15},
        "per_stage": {
            k: [
                {
                    f: s.to_dict()[f]
                    for f in ("stage", "layers", "forward_s", "backward_s", "wait_s", "total_s")
                }
                for s in v.stages
            ]
            for k, v in r["stats"].items()
        },
    }
    write_json(args.out, report)
    keys = (
        "planned_sizes",
        "median_step_s",
        "throughput_ratio_planned_vs_equal",
        "predicted_iteration_s",
        "predicted_vs_measured_planned",
        "predicted_vs_measured_equal",
    )
    print_json(report, keys)


if __name__ == "__main__":
    main()
