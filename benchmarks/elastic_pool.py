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
of `--switches` each.

Run it alone on an idle machine: the JSON records the load average before and after.

    python benchmarks/elastic_pool.py [--minutes 30] [--steps 20] [--switches 5]
"""

from __future__ import annotations

import argparse
import functools
import random
import statistics
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from _run import RESULTS, Clock, first_paragraph, usable_cores, write_json

import pipeline
from pipeline import CostCache, ElasticPipeline, PlanOptions, PoolContext, StagePool
from pipeline.distributed.overheads import measure_overheads
from pipeline.local.models import transformer_stack
from pipeline.local.profiler import optimizer_state_ratio, sandbox, trace_shapes
from pipeline.local.spec import build_layer
from pipeline.pure.planner import TimePlanner, evaluate
from pipeline.pure.shape import RuntimeOverheads, stages_for

OUT = RESULTS / "elastic_pool.json"
BATCH, SEQ, HEADS = 16, 16, 4
WIDTHS, DEPTHS = (64, 96, 128), (2, 3, 4, 5, 6)
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)


@dataclass(frozen=True)
class Candidate:
    """One model of the stream, with its plan on the pool."""

    number: int
    d_model: int
    n_layers: int
    parameters: int
    single_stage_bytes: int  # predicted peak of one stage holding it all, 1 micro-batch
    fewest_bytes_one_stage: int  # the same at the micro-batch count that needs least
    two_stage_bytes: int  # the larger stage of an equal 2-stage split, 4 micro-batches
    pool_bytes: int  # the larger stage of the plan the pool runs
    n_stages: int  # what `stages_for` chose under the budget
    sizes: tuple[int, ...]
    n_microbatches: int


def specs_of(d_model: int, n_layers: int) -> list[pipeline.LayerSpec]:
    return transformer_stack(n_layers, d_model, HEADS)


def batch_of(d_model: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, SEQ, d_model, generator=g), torch.randn(
        BATCH, SEQ, d_model, generator=g
    )


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
                    costs_at(d, n)(1, BATCH // 4), list(_equal(n, 2)), n_microbatches=4
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


def train(
    d_model: int,
    n_layers: int,
    sizes: tuple[int, ...],
    n_microbatches: int,
    steps: int,
    seed: int,
    pipe: ElasticPipeline | None = None,
) -> tuple[ElasticPipeline, float]:
    """Build (or reconfigure `pipe` to) the candidate and train it; (pipe, first step at)."""
    specs = specs_of(d_model, n_layers)
    if pipe is None:
        pipe = ElasticPipeline(
            specs,
            optimizer=ADAM,
            loss_fn=F.mse_loss,
            n_microbatches=n_microbatches,
            seed=seed,
            planning=PlanOptions(partition=list(sizes)),
        )
    else:
        pipe.reconfigure(specs, partition=list(sizes))
    x, y = batch_of(d_model, seed)
    first = time.perf_counter()
    for _ in range(steps):
        pipe.train_step(x, y)
    return pipe, first


# -- the arms -----------------------------------------------------------------------------------
def pool_job(ctx: PoolContext, candidate: Candidate, steps: int) -> dict[str, float]:
    started = time.time()
    pipe, _ = train(
        candidate.d_model,
        candidate.n_layers,
        candidate.sizes,
        candidate.n_microbatches,
        steps,
        candidate.number,
    )
    pipe.close()
    return {"started": started, "ended": time.time()}


def pool_arm(candidates: list[Candidate], cores: int, steps: int, seconds: float) -> dict[str, Any]:
    done: list[dict[str, Any]] = []
    with StagePool(cores, timeout_s=300) as pool:
        clock = time.time()
        deadline = clock + seconds
        flight: list[tuple[Candidate, Future[list[Any]]]] = []
        queue = list(candidates)
        while (queue and time.time() < deadline) or flight:
            while queue and time.time() < deadline and sum(c.n_stages for c, _ in flight) < cores:
                candidate = queue.pop(0)
                flight.append(
                    (
                        candidate,
                        pool.submit(
                            functools.partial(pool_job, candidate=candidate, steps=steps),
                            candidate.n_stages,
                        ),
                    )
                )
            for item in [f for f in flight if f[1].done()]:
                flight.remove(item)
                candidate, future = item
                result = future.result()[0]
                done.append(
                    {**asdict(candidate), **result, "seconds": result["ended"] - result["started"]}
                )
            time.sleep(0.01)
        wall = time.time() - clock
    busy = sum(r["seconds"] * r["n_stages"] for r in done)
    return _arm(done, wall, extra={"busy_share": busy / (wall * cores)})


def worker_loop(
    ctx: pipeline.StageContext, mine: list[Candidate], n_stages: int, steps: int, deadline: float
) -> list[dict[str, Any]]:
    pipe = None
    out = []
    for candidate in mine:
        if time.time() >= deadline:
            break
        sizes = (
            candidate.sizes
            if len(candidate.sizes) == n_stages
            else _equal(candidate.n_layers, n_stages)
        )
        started = time.time()
        pipe, _ = train(
            candidate.d_model,
            candidate.n_layers,
            sizes,
            1 if n_stages == 1 else 4,
            steps,
            candidate.number,
            pipe,
        )
        out.append(
            {
                **asdict(candidate),
                "n_stages": n_stages,
                "started": started,
                "ended": time.time(),
                "seconds": time.time() - started,
            }
        )
    if pipe is not None:
        pipe.close()
    return out


def _equal(n_layers: int, n_stages: int) -> tuple[int, ...]:
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (s < extra) for s in range(n_stages))


def launched_arm(
    candidates: list[Candidate], workers: int, n_stages: int, steps: int, seconds: float
) -> dict[str, Any]:
    clock = time.time()
    deadline = clock + seconds
    results: list[list[dict[str, Any]]] = [[] for _ in range(workers)]

    def worker(k: int) -> None:
        mine = candidates[k::workers]
        fn = functools.partial(
            worker_loop, mine=mine, n_stages=n_stages, steps=steps, deadline=deadline
        )
        results[k] = pipeline.launch(fn, n_stages, threads_per_stage=1, timeout_s=600)[0]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - clock
    return _arm([r for part in results for r in part], wall)


def _arm(
    done: list[dict[str, Any]], wall: float, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    return {
        "wall_s": wall,
        "finished": len(done),
        "candidates_per_hour": len(done) / wall * 3600,
        "refused": 0,  # every arm trains what it is given (over budget counted in `main`)
        "median_candidate_s": statistics.median(r["seconds"] for r in done) if done else None,
        "stages": {
            str(s): sum(r["n_stages"] == s for r in done)
            for s in sorted({r["n_stages"] for r in done})
        },
        **(extra or {}),
        "candidates": done,
    }


# -- one candidate to the next: a pool job against a restart ------------------------------------
def keep_job(ctx: PoolContext, d_model: int, n_layers: int) -> None:
    pipe, _ = train(d_model, n_layers, (n_layers,), 1, 1, 0)
    ctx.keep(pipe.snapshot())
    pipe.close()


def grow_job(ctx: PoolContext, d_model: int, n_layers: int, submitted: float) -> float:
    """Seconds from the submit to the grown model's first step (group, build, inheritance)."""
    specs = specs_of(d_model, n_layers)
    pipe = ElasticPipeline(
        specs,
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=4,
        seed=0,
        planning=PlanOptions(partition=list(_equal(n_layers, 2))),
        inherit_from=ctx.resident,
    )
    pipe.close()
    return time.time() - submitted


def restart_job(ctx: pipeline.StageContext, d_model: int, n_layers: int, submitted: float) -> float:
    """The same from a fresh launch: processes, group, build (weights from a file stand-in:
    a fresh build, which is no slower than loading)."""
    specs = specs_of(d_model, n_layers)
    pipe = ElasticPipeline(
        specs,
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=4,
        seed=0,
        planning=PlanOptions(partition=list(_equal(n_layers, 2))),
    )
    pipe.close()
    return time.time() - submitted


def switches(count: int, d_model: int = 128, n_layers: int = 6) -> dict[str, Any]:
    pooled, restarted = [], []
    with StagePool(2, timeout_s=300) as pool:
        for i in range(count):
            pool.run(
                functools.partial(keep_job, d_model=d_model, n_layers=n_layers), 1, keep=f"m{i}"
            )
            submitted = time.time()
            pooled.append(
                pool.run(
                    functools.partial(
                        grow_job, d_model=d_model, n_layers=n_layers, submitted=submitted
                    ),
                    2,
                    take=f"m{i}",
                )[0]
            )
    for _ in range(count):
        submitted = time.time()
        restarted.append(
            pipeline.launch(
                functools.partial(
                    restart_job, d_model=d_model, n_layers=n_layers, submitted=submitted
                ),
                2,
                threads_per_stage=1,
            )[0]
        )
    pool_s, restart_s = statistics.median(pooled), statistics.median(restarted)
    return {
        "model": {"d_model": d_model, "n_layers": n_layers},
        "pool_grow_1_to_2_s": pooled,
        "restart_2_s": restarted,
        "median_pool_s": pool_s,
        "median_restart_s": restart_s,
        "restart_over_pool": restart_s / pool_s,
    }


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
