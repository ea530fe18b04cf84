"""Candidates of many sizes on one machine: a stage pool's per-candidate pipelines beside a
per-study shape and a fixed 2-stage pipeline.

Why it exists (issue 51): a search's candidates span sizes, and under a memory budget the
large ones must be split while the small ones train fastest on one process each. A shape
chosen once per study either trains every candidate on one stage (the large ones past the
budget: a soft limit on CPU, an out-of-memory failure on a GPU) or pipelines every one (the
small ones pay a bubble for nothing). `pipeline.StagePool` gives each candidate its own stage
count (`pipeline.pure.shape.stages_for`: the fewest stages that fit) from one set of
processes started once.

The runtime's view of a search, without Optuna: a seeded stream of candidates, Transformer
encoder stacks (`pipeline.local.models.transformer_stack`, 4 heads) at d_model 64, 96 or 128
with 2 to 6 layers (about 12x in parameters), sequence 16, batch 16, Adam, each trained
`--steps` steps on random data. The memory budget is the `--budget-quantile` (0.67) of the
candidates' single-stage predicted peak bytes at the micro-batch count that needs least (the
planner's memory model), so about a third cannot fit one stage at all and need 2. Layer
costs are profiled in this process first (the sandbox, as the harness's shape does) and
shared by every arm. Arms, each for `--minutes` of wall time over the same stream, one
after the other:

* `pool`: `StagePool(cores)`, each candidate on the stages `stages_for` chooses, as many at
  a time as fit (first come, first served);
* `per_study`: the shape `auto` chooses for such a study from its seeds (small: one
  single-stage worker per core), each worker one `launch` for the whole arm, candidates by
  `reconfigure`; candidates over the budget are trained anyway and counted;
* `fixed_2`: one 2-stage pipeline, every candidate by `reconfigure`.

Recorded per arm: candidates finished per hour, candidates over the budget and refused,
each candidate's stage count and seconds; for the pool its busy share (process-seconds in
jobs over cores x wall). Separately, the seconds from one candidate to the next: a pool job
on 2 processes that takes a resident 1-stage model (grown live: the group formed, the layers
inherited) against `launch` of 2 fresh processes and the same build from a snapshot; medians
of `--switches` each. What runs in processes is in `elastic_pool_runs.py`.

Run it alone on an idle machine: the JSON records the load average before and after.

    python benchmarks/elastic_pool.py [--minutes 30] [--steps 20] [--switches 5]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import torch
from _run import RESULTS, Clock, first_paragraph, usable_cores, write_json
from elastic_pool_runs import (
    ADAM,
    BATCH,
    Candidate,
    batch_of,
    equal_split,
    launched_arm,
    pool_arm,
    specs_of,
    switches,
)

from pipeline import CostCache
from pipeline.distributed.overheads import measure_overheads
from pipeline.local.profiler import optimizer_state_ratio, sandbox, trace_shapes
from pipeline.local.spec import build_layer
from pipeline.pure.planner import TimePlanner, evaluate
from pipeline.pure.shape import RuntimeOverheads, stages_for

OUT = RESULTS / "elastic_pool.json"
WIDTHS, DEPTHS = (64, 96, 128), (2, 3, 4, 5, 6)


def stream(count: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.choice(WIDTHS), rng.choice(DEPTHS)) for _ in range(count)]


def planned(
    pairs: list[tuple[int, int]], overheads: RuntimeOverheads, quantile: float, cores: int
) -> tuple[list[Candidate], int]:
    """Every candidate's costs (profiled once per distinct layer), the budget, the plans."""
    cache, ratio = CostCache(), optimizer_state_ratio(ADAM)
    profiles: dict[tuple[int, int, int, int], Any] = {}

    def costs_at(d: int, n: int) -> Any:
        def at(threads: int, microbatch: int) -> list[Any]:
            key = (d, n, threads, microbatch)
            if key not in profiles:
                torch.set_num_threads(threads)
                example = batch_of(d, 0)[0][:microbatch]
                shapes = trace_shapes(specs_of(d, n), example)
                profiles[key] = sandbox(specs_of(d, n), shapes, torch.device("cpu"), ratio, cache)
                torch.set_num_threads(1)
            return profiles[key]

        return at

    def peak(d: int, n: int, microbatches: int) -> int:
        costs = costs_at(d, n)(1, BATCH // microbatches)
        return int(evaluate(costs, [n], n_microbatches=microbatches).predicted_stage_bytes[0])

    single = {pair: peak(*pair, 1) for pair in set(pairs)}
    halves = {
        (d, n): int(
            max(
                evaluate(
                    costs_at(d, n)(1, BATCH // 4), list(equal_split(n, 2)), n_microbatches=4
                ).predicted_stage_bytes
            )
        )
        for d, n in set(pairs)
    }
    fewest = {pair: min(peak(*pair, m) for m in (1, 2, 4, 8)) for pair in set(pairs)}
    # a third cannot fit one stage at any micro-batch count: they need two
    ranked = sorted(fewest[pair] for pair in pairs)
    budget = int(ranked[min(len(ranked) - 1, int(quantile * len(ranked)))])
    chosen: dict[tuple[int, int], Any] = {}
    for d, n in set(pairs):
        best, _ = stages_for(
            TimePlanner(),
            costs_at(d, n),
            overheads,
            max_stages=cores,
            batch_size=BATCH,
            memory_budget=budget,
        )
        chosen[d, n] = best
    sizes = {
        pair: sum(
            p.numel()
            for spec in specs_of(*pair)
            for p in build_layer(spec, 0, torch.device("cpu")).parameters()
        )
        for pair in set(pairs)
    }
    candidates = []
    for i, (d, n) in enumerate(pairs):
        best = chosen[d, n]
        candidates.append(
            Candidate(
                i,
                d,
                n,
                sizes[d, n],
                single[d, n],
                fewest[d, n],
                halves[d, n],
                int(max(best.plan.predicted_stage_bytes)),
                best.shape.n_stages,
                tuple(best.plan.sizes),
                best.shape.n_microbatches,
            )
        )
    return candidates, budget


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--candidates", type=int, default=2000)
    parser.add_argument("--budget-quantile", type=float, default=0.67)
    parser.add_argument("--switches", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    clock = Clock()
    torch.set_num_threads(1)
    cores = len(usable_cores())
    overheads = measure_overheads()
    pairs = stream(args.candidates, args.seed)
    candidates, budget = planned(pairs, overheads, args.budget_quantile, cores)
    needs_two = {c.number for c in candidates if c.fewest_bytes_one_stage > budget}
    seconds = args.minutes * 60
    arms: dict[str, Any] = {}
    arms["pool"] = pool_arm(candidates, cores, args.steps, seconds)
    arms["per_study"] = launched_arm(candidates, cores, 1, args.steps, seconds)
    arms["fixed_2"] = launched_arm(candidates, max(1, cores // 2), 2, args.steps, seconds)
    peaks = {  # the predicted peak of the larger stage as each arm trains a candidate
        "pool": lambda c: c.pool_bytes,
        "per_study": lambda c: c.single_stage_bytes,  # one stage, 1 micro-batch
        "fixed_2": lambda c: c.two_stage_bytes,
    }
    by_number = {c.number: c for c in candidates}
    for name, arm in arms.items():
        for r in arm["candidates"]:
            r["over_budget"] = peaks[name](by_number[r["number"]]) > budget
        arm["over_budget"] = sum(r["over_budget"] for r in arm["candidates"])
    best_other = max(
        arms["per_study"]["candidates_per_hour"], arms["fixed_2"]["candidates_per_hour"]
    )
    within = [
        a["candidates_per_hour"] for n, a in arms.items() if n != "pool" and not a["over_budget"]
    ]
    document = {
        "what": first_paragraph(__doc__),
        "cores": cores,
        "minutes_per_arm": args.minutes,
        "steps_per_candidate": args.steps,
        "memory_budget_bytes": budget,
        "share_over_budget_on_one_stage_1_microbatch": sum(
            c.single_stage_bytes > budget for c in candidates
        )
        / len(candidates),
        "share_needing_two_stages": len(needs_two) / len(candidates),
        "parameters_range": [
            min(c.parameters for c in candidates),
            max(c.parameters for c in candidates),
        ],
        "overheads": overheads.to_dict(),
        "arms": arms,
        "pool_over_best_other": arms["pool"]["candidates_per_hour"] / best_other,
        # against the best arm that kept every candidate within the budget
        "pool_over_best_within_budget": arms["pool"]["candidates_per_hour"] / max(within)
        if within
        else None,
        "switch": switches(args.switches),
        **clock.load_average(),
    }
    write_json(Path(args.out), document)
    print(
        {
            k: document[k]
            for k in (
                "memory_budget_bytes",
                "share_needing_two_stages",
                "pool_over_best_other",
                "pool_over_best_within_budget",
            )
        }
    )
    for name, arm in arms.items():
        print(
            name, {k: arm[k] for k in ("candidates_per_hour", "over_budget", "stages", "finished")}
        )
    print(
        "switch",
        {
            k: document["switch"][k]
            for k in ("median_pool_s", "median_restart_s", "restart_over_pool")
        },
    )


if __name__ == "__main__":
    main()
