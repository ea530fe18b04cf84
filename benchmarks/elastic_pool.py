"""Candidates of many sizes on one machine: a stage pool's per-candidate pipelines beside a
per-study shape and a fixed 2-stage pipeline.

Why it exists (issue 51): a search's candidates span sizes, and under a memory budget the
large ones must be split while the small ones train fastest on one process each. A shape
chosen once per study either trains every candidate on one stage (the large ones fit no plan
under the budget and are refused; without the budget they would train past it, out of memory
on a GPU) or pipelines every one (the small ones pay a bubble for nothing).
`pipeline.StagePool` gives each candidate its own stage count
(`pipeline.pure.pool_shape.stages_for`: the fewest stages that fit) from one set of processes
started once.

The runtime's view of a search, without Optuna: a seeded stream of candidates, Transformer
encoder stacks (`pipeline.local.models.transformer_stack`, 4 heads) at d_model 64, 96 or 128
with 2 to 6 layers (about 12x in parameters), sequence 16, batch 16, Adam, each trained
`--steps` steps on random data. The memory budget is the `--budget-quantile` (0.67) of the
candidates' predicted peak bytes on one stage at one micro-batch (the planner's memory model;
what a study without a budget trains), so about a third exceed it. Layer costs are
profiled in this process first (the sandbox, as the harness's shape does) and shared by every
arm. Every arm trains a candidate on the planner's plan under the budget (stage sizes,
micro-batches, and the layers it recomputes to fit), as the harness does, or refuses it where
no plan of the arm's shape fits. Arms, each for `--minutes` of wall time over the same
stream, one after the other:

* `pool`: `StagePool(cores)`, each candidate on the stages `stages_for` chooses, as many at
  a time as fit (first come, first served);
* `per_study`: the shape `auto` gives a study of small seeds, one single-stage worker per
  core, each one `launch` for the whole arm, candidates by `reconfigure`; its micro-batch
  count is the study's, chosen for its seed (the stream's median model);
* `fixed_2`: one 2-stage pipeline, every candidate by `reconfigure`, its micro-batches the
  study's likewise.

Recorded per arm: candidates finished per hour, candidates refused, candidates over the
budget (the runtime's measured peak of the larger stage, `ElasticPipeline.stats()`), each
candidate's plan and seconds; for the pool its busy share (process-seconds in jobs over cores
x wall). Separately, the seconds from one candidate to the next: a pool job on 2 processes
that takes a resident 1-stage model (grown live: the group formed, the layers inherited)
against `launch` of 2 fresh processes from the runtime's warm forkserver and against a cold
restart (a new program: interpreters that import torch anew), each with the same build;
medians of `--switches` each. Last, `search_2h` itself (every candidate small, no budget)
for `--search-2h-minutes` on its per-study `auto` shape and on the pool
(`pipeline.per_candidate=true`): what the pool costs where no candidate needs it. What runs
in processes is in `elastic_pool_runs.py`.

Run it alone on an idle machine: the JSON records the load average before and after each
part (`measured`). `--parts` measures some of the three parts (the arms, the switch,
`search_2h`) and keeps the others from the JSON as they were, so a long measurement can be
taken in more than one sitting.

    python benchmarks/elastic_pool.py [--minutes 30] [--steps 100] [--switches 5] \
        [--search-2h-minutes 30] [--parts arms switch search_2h]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from _run import RESULTS, Clock, first_paragraph, usable_cores, write_json
from elastic_pool_runs import (
    ADAM,
    BATCH,
    Candidate,
    Placement,
    batch_of,
    launched_arm,
    pool_arm,
    specs_of,
    switches,
)
from search_throughput_slices import search_slice

from pipeline import CostCache
from pipeline.distributed.overheads import measure_overheads
from pipeline.local.profiler import optimizer_state_ratio, sandbox, trace_shapes
from pipeline.local.spec import build_layer
from pipeline.pure.planner import TimePlanner, evaluate
from pipeline.pure.pool_shape import stages_for
from pipeline.pure.shape import (
    RuntimeOverheads,
    ShapeLimits,
    ShapeOption,
    choose_shape,
)

OUT = RESULTS / "elastic_pool.json"
WIDTHS, DEPTHS = (64, 96, 128), (2, 3, 4, 5, 6)
PER_STUDY_ARMS = {"per_study": 1, "fixed_2": 2}  # arm -> the stages of its every pipeline


def stream(count: int, seed: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.choice(WIDTHS), rng.choice(DEPTHS)) for _ in range(count)]


def planned(
    pairs: list[tuple[int, int]], overheads: RuntimeOverheads, quantile: float, cores: int
) -> tuple[list[Candidate], int, dict[str, int]]:
    """Every candidate's costs (profiled once per distinct model), the budget, each arm's
    placement of each candidate, and the micro-batches of each per-study arm."""
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

    models = sorted(set(pairs))
    unbudgeted = {pair: peak(*pair, 1) for pair in models}
    # about a third exceed it as a study without a budget trains them
    ranked = sorted(unbudgeted[pair] for pair in pairs)
    budget = int(ranked[min(len(ranked) - 1, int(quantile * len(ranked)))])

    def shaped(pair: tuple[int, int], limits: ShapeLimits) -> ShapeOption | None:
        try:
            best, _ = choose_shape(
                TimePlanner(), costs_at(*pair), limits, overheads, memory_budget=budget
            )
        except ValueError:
            return None
        return best

    # a per-study shape's micro-batches are the study's, chosen for its seeds: the median model
    seed = sorted(models, key=lambda pair: unbudgeted[pair])[len(models) // 2]
    study: dict[str, int] = {}
    for arm, stages in PER_STUDY_ARMS.items():
        option = shaped(seed, ShapeLimits(cores, BATCH, n_stages=stages, threads_per_stage=1))
        if option is None:
            raise ValueError(f"the seed {seed} fits no {stages}-stage plan under {budget} bytes")
        study[arm] = option.shape.n_microbatches

    def placement(option: ShapeOption | None) -> Placement | None:
        if option is None or option.plan is None:
            return None
        return Placement(option.plan)

    def placements(pair: tuple[int, int]) -> dict[str, Placement | None]:
        found: dict[str, Placement | None] = {}
        try:
            best, _ = stages_for(
                TimePlanner(),
                costs_at(*pair),
                overheads,
                max_stages=cores,
                batch_size=BATCH,
                memory_budget=budget,
            )
            found["pool"] = placement(best)
        except ValueError:
            found["pool"] = None
        for arm, stages in PER_STUDY_ARMS.items():
            limits = ShapeLimits(stages, BATCH, 1, stages, 1, study[arm])
            found[arm] = placement(shaped(pair, limits))
        return found

    by_model = {pair: placements(pair) for pair in models}
    sizes = {
        pair: sum(
            p.numel()
            for spec in specs_of(*pair)
            for p in build_layer(spec, 0, torch.device("cpu")).parameters()
        )
        for pair in models
    }
    candidates = [
        Candidate(i, d, n, sizes[d, n], unbudgeted[d, n], by_model[d, n])
        for i, (d, n) in enumerate(pairs)
    ]
    return candidates, budget, study


PARTS = ("arms", "switch", "search_2h")  # measured in this order; each with its own load


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--candidates", type=int, default=2000)
    parser.add_argument("--budget-quantile", type=float, default=0.67)
    parser.add_argument("--switches", type=int, default=5)
    parser.add_argument("--search-2h-minutes", type=float, default=30.0)
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="what to measure; the others are kept from --out as it was (their own loads)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(OUT))
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = Path(args.out)
    kept = json.loads(out.read_text()) if out.exists() else {}
    document: dict[str, Any] = {
        "what": first_paragraph(__doc__),
        "cores": len(usable_cores()),
        "measured": dict(kept.get("measured", {})),
    }
    for part in PARTS:
        if part not in args.parts:
            if part not in kept:
                raise SystemExit(f"--parts leaves out {part!r}, which {out} does not hold")
            document[part] = kept[part]
            continue
        clock = Clock()
        document[part] = MEASURE[part](args, document["cores"])
        document["measured"][part] = {
            "at": datetime.now(UTC).isoformat(timespec="seconds"),
            **clock.load_average(),
        }
        write_json(out, document)  # what is measured is kept if what follows fails
    _summary(document)


def arms_part(args: argparse.Namespace, cores: int) -> dict[str, Any]:
    """The three arms over one stream under one budget, side by side (module doc)."""
    overheads = measure_overheads()
    pairs = stream(args.candidates, args.seed)
    candidates, budget, study_microbatches = planned(pairs, overheads, args.budget_quantile, cores)
    seconds = args.minutes * 60
    arms: dict[str, Any] = {"pool": pool_arm(candidates, cores, args.steps, seconds)}
    for arm, stages in PER_STUDY_ARMS.items():
        arms[arm] = launched_arm(
            candidates, arm, max(1, cores // stages), stages, args.steps, seconds
        )
    for arm in arms.values():
        for r in arm["candidates"]:
            r["over_budget"] = r["measured_bytes"] > budget
        arm["over_budget"] = sum(r["over_budget"] for r in arm["candidates"])
    rate = {name: arm["candidates_per_hour"] for name, arm in arms.items()}
    return {
        "minutes_per_arm": args.minutes,
        "steps_per_candidate": args.steps,
        "memory_budget_bytes": budget,
        "study_microbatches": study_microbatches,
        "share_over_budget_unbudgeted": sum(c.unbudgeted_bytes > budget for c in candidates)
        / len(candidates),
        "share_refused": {
            arm: sum(c.placements[arm] is None for c in candidates) / len(candidates)
            for arm in arms
        },
        "parameters_range": [
            min(c.parameters for c in candidates),
            max(c.parameters for c in candidates),
        ],
        "overheads": overheads.to_dict(),
        "pool_over": {arm: rate["pool"] / rate[arm] for arm in PER_STUDY_ARMS},
        "same_candidates": {
            arm: same_candidates(arms["pool"], arms[arm]) for arm in PER_STUDY_ARMS
        },
        "arms": arms,
    }


def same_candidates(pool: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """The pool against another arm on the candidates both trained (an arm that refuses the
    large ones finishes more per hour for it): process-seconds per candidate, and the pool's
    candidates per hour over the other's on that set (the ratio of their process-seconds)."""

    def process_s(arm: dict[str, Any]) -> dict[int, float]:
        return {
            r["number"]: r["seconds"] * r["n_stages"] for r in arm["candidates"] if not r["refused"]
        }

    mine, theirs = process_s(pool), process_s(other)
    both = sorted(mine.keys() & theirs.keys())
    if not both:
        return {"candidates": 0}
    pool_s, other_s = sum(mine[n] for n in both), sum(theirs[n] for n in both)
    return {
        "candidates": len(both),
        "pool_process_s_per_candidate": pool_s / len(both),
        "other_process_s_per_candidate": other_s / len(both),
        "pool_over": other_s / pool_s,
    }


def search_2h_part(args: argparse.Namespace, cores: int) -> dict[str, Any]:
    """`search_2h` (every candidate small, no budget) on its per-study `auto` shape and on
    the pool, `--search-2h-minutes` each: what the pool costs where no candidate needs it."""
    with tempfile.TemporaryDirectory() as tmp:
        slices: dict[str, Any] = {
            mode: search_slice(mode, args.search_2h_minutes, Path(tmp)) for mode in ("auto", "pool")
        }
    slices["pool_over_auto"] = {
        key: slices["pool"][key] / max(slices["auto"][key], 1e-9)
        for key in ("candidates_per_h", "full_budget_candidates_per_h", "steps_per_h")
    }
    return slices


MEASURE = {
    "arms": arms_part,
    "switch": lambda args, cores: switches(args.switches),
    "search_2h": search_2h_part,
}


def _summary(document: dict[str, Any]) -> None:
    headline = ("memory_budget_bytes", "share_refused", "pool_over", "same_candidates")
    print({k: document["arms"][k] for k in headline})
    for name, arm in document["arms"]["arms"].items():
        keys = ("candidates_per_hour", "refused", "over_budget", "stages", "finished")
        print(name, {k: arm[k] for k in keys})
    switch = document["switch"]
    ratios = ("median_pool_s", "median_restart_s", "restart_over_pool", "cold_restart_over_pool")
    print("switch", {k: switch[k] for k in ratios})
    print("search_2h", document["search_2h"]["pool_over_auto"])


if __name__ == "__main__":
    main()
