"""What `elastic_pool.py` runs in processes: the candidates' model and training, the three
arms (a stage pool, per-study workers, fixed 2-stage pipelines) and the switch from one
candidate to the next. Module-level, so the pool's and the launched processes import it.
"""

from __future__ import annotations

import functools
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import pipeline
from pipeline import ElasticPipeline, PlanOptions, PoolContext, StagePool
from pipeline.local.models import transformer_stack
from pipeline.pure.planner import Plan

BATCH, SEQ, HEADS = 16, 16, 4
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)


@dataclass(frozen=True)
class Placement:
    """How one arm trains a candidate: the planner's plan under the memory budget (the
    layers of each stage, the micro-batches, and which layers recompute to fit)."""

    plan: Plan

    @property
    def n_stages(self) -> int:
        return len(self.plan.sizes)

    @property
    def predicted_bytes(self) -> int:
        """The larger stage's predicted peak."""
        return int(max(self.plan.predicted_stage_bytes))


@dataclass(frozen=True)
class Candidate:
    """One model of the stream, with each arm's placement of it (None: the arm refuses it,
    no plan of its shape fits the budget)."""

    number: int
    d_model: int
    n_layers: int
    parameters: int
    unbudgeted_bytes: int  # one stage, 1 micro-batch: what a study without a budget trains
    placements: dict[str, Placement | None]


def specs_of(d_model: int, n_layers: int) -> list[pipeline.LayerSpec]:
    return transformer_stack(n_layers, d_model, HEADS)


def batch_of(d_model: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, SEQ, d_model, generator=g), torch.randn(
        BATCH, SEQ, d_model, generator=g
    )


def train(
    d_model: int,
    n_layers: int,
    plan: Plan | tuple[int, ...],
    n_microbatches: int,
    steps: int,
    seed: int,
    pipe: ElasticPipeline | None = None,
) -> tuple[ElasticPipeline, int]:
    """Build (or reconfigure `pipe` to) the candidate on `plan` (or these stage sizes) and
    train it; (pipe, the measured peak bytes of its larger stage)."""
    specs = specs_of(d_model, n_layers)
    partition = plan if isinstance(plan, Plan) else list(plan)
    if pipe is None:
        pipe = ElasticPipeline(
            specs,
            optimizer=ADAM,
            loss_fn=F.mse_loss,
            n_microbatches=n_microbatches,
            seed=seed,
            planning=PlanOptions(partition=partition),
        )
    else:
        pipe.reconfigure(specs, partition=partition)
    x, y = batch_of(d_model, seed)
    for _ in range(steps):
        pipe.train_step(x, y)
    measured = max(s.measured_peak_bytes for s in pipe.stats().stages)  # every rank
    return pipe, measured


# -- the arms -----------------------------------------------------------------------------------
def pool_job(ctx: PoolContext, candidate: Candidate, steps: int) -> dict[str, Any]:
    placement = candidate.placements["pool"]
    assert placement is not None, "a refused candidate is never submitted"
    started = time.time()
    pipe, measured = train(
        candidate.d_model,
        candidate.n_layers,
        placement.plan,
        placement.plan.n_microbatches,
        steps,
        candidate.number,
    )
    pipe.close()
    return {"started": started, "ended": time.time(), "measured_bytes": measured}


def pool_arm(candidates: list[Candidate], cores: int, steps: int, seconds: float) -> dict[str, Any]:
    """Each candidate on its own stage count, as many at a time as the pool's processes
    allow (first come, first served)."""
    done: list[dict[str, Any]] = []
    with StagePool(cores, timeout_s=300) as pool:
        clock = time.time()
        deadline = clock + seconds
        flight: list[tuple[Candidate, Placement, Future[list[Any]]]] = []
        queue = list(candidates)
        while (queue and time.time() < deadline) or flight:
            while (
                queue and time.time() < deadline and sum(p.n_stages for _, p, _ in flight) < cores
            ):
                candidate = queue.pop(0)
                placement = candidate.placements["pool"]
                if placement is None:
                    done.append(_record(candidate, None, 0.0, 0.0, 0))
                    continue
                job = functools.partial(pool_job, candidate=candidate, steps=steps)
                flight.append((candidate, placement, pool.submit(job, placement.n_stages)))
            for item in [f for f in flight if f[2].done()]:
                flight.remove(item)
                candidate, placement, future = item
                r = future.result()[0]
                done.append(
                    _record(candidate, placement, r["started"], r["ended"], r["measured_bytes"])
                )
            time.sleep(0.01)
        wall = time.time() - clock
    busy = sum(r["seconds"] * r["n_stages"] for r in done)
    return _arm(done, wall, extra={"busy_share": busy / (wall * cores)})


def _record(
    candidate: Candidate, placement: Placement | None, started: float, ended: float, peak: int
) -> dict[str, Any]:
    """One candidate as an arm handled it (`placement` None: refused, not trained)."""
    return {
        "number": candidate.number,
        "d_model": candidate.d_model,
        "n_layers": candidate.n_layers,
        "parameters": candidate.parameters,
        "refused": placement is None,
        "n_stages": 0 if placement is None else placement.n_stages,
        "sizes": None if placement is None else list(placement.plan.sizes),
        "n_microbatches": None if placement is None else placement.plan.n_microbatches,
        "recomputed_layers": None
        if placement is None
        else sum(a != "keep" for a in placement.plan.actions),
        "predicted_bytes": None if placement is None else placement.predicted_bytes,
        "measured_bytes": peak,
        "started": started,
        "ended": ended,
        "seconds": ended - started,
    }


def worker_loop(
    ctx: pipeline.StageContext, mine: list[Candidate], arm: str, steps: int, deadline: float
) -> list[dict[str, Any]]:
    """One worker of a per-study shape: one pipeline for the whole arm, reconfigured to each
    candidate (its micro-batch count is the study's: every placement of the arm has it)."""
    pipe = None
    out = []
    for candidate in mine:
        if time.time() >= deadline:
            break
        placement = candidate.placements[arm]
        if placement is None:
            out.append(_record(candidate, None, 0.0, 0.0, 0))
            continue
        started = time.time()
        pipe, measured = train(
            candidate.d_model,
            candidate.n_layers,
            placement.plan,
            placement.plan.n_microbatches,
            steps,
            candidate.number,
            pipe,
        )
        out.append(_record(candidate, placement, started, time.time(), measured))
    if pipe is not None:
        pipe.close()
    return out


def equal_split(n_layers: int, n_stages: int) -> tuple[int, ...]:
    base, extra = divmod(n_layers, n_stages)
    return tuple(base + (s < extra) for s in range(n_stages))


def launched_arm(
    candidates: list[Candidate], arm: str, workers: int, n_stages: int, steps: int, seconds: float
) -> dict[str, Any]:
    """A per-study shape: `workers` pipelines of `n_stages`, each one `launch` for the whole
    arm, the stream dealt out among them."""
    clock = time.time()
    deadline = clock + seconds
    results: list[list[dict[str, Any]]] = [[] for _ in range(workers)]

    def worker(k: int) -> None:
        mine = candidates[k::workers]
        fn = functools.partial(worker_loop, mine=mine, arm=arm, steps=steps, deadline=deadline)
        results[k] = pipeline.launch(fn, n_stages, threads_per_stage=1, timeout_s=600)[0]

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.time() - clock
    return _arm([r for part in results for r in part], wall)


def _arm(
    handled: list[dict[str, Any]], wall: float, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    done = [r for r in handled if not r["refused"]]
    return {
        "wall_s": wall,
        "finished": len(done),
        "candidates_per_hour": len(done) / wall * 3600,
        "refused": len(handled) - len(done),
        "median_candidate_s": statistics.median(r["seconds"] for r in done) if done else None,
        "stages": {
            str(s): sum(r["n_stages"] == s for r in done)
            for s in sorted({r["n_stages"] for r in done})
        },
        **(extra or {}),
        "candidates": handled,
    }


# -- one candidate to the next: a pool job against a restart ------------------------------------
def keep_job(ctx: PoolContext, d_model: int, n_layers: int) -> None:
    pipe, _ = train(d_model, n_layers, (n_layers,), 1, 1, 0)
    ctx.keep(pipe.snapshot())
    pipe.close()


def grow_job(ctx: PoolContext, d_model: int, n_layers: int, submitted: float) -> float:
    """Seconds from the submit to the grown model, built and ready for its first step
    (the job's group formed, the resident layers inherited)."""
    return _built_s(d_model, n_layers, submitted, ctx.resident)


def restart_job(ctx: pipeline.StageContext, d_model: int, n_layers: int, submitted: float) -> float:
    """The same from a fresh launch: processes, group, build (weights from a file stand-in:
    a fresh build, which is no slower than loading)."""
    return _built_s(d_model, n_layers, submitted, None)


def _built_s(
    d_model: int, n_layers: int, submitted: float, inherit_from: pipeline.WeightSnapshot | None
) -> float:
    pipe = ElasticPipeline(
        specs_of(d_model, n_layers),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=4,
        seed=0,
        planning=PlanOptions(partition=list(equal_split(n_layers, 2))),
        inherit_from=inherit_from,
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
    cold = [_cold_restart_s(d_model, n_layers) for _ in range(count)]
    pool_s, restart_s = statistics.median(pooled), statistics.median(restarted)
    return {
        "model": {"d_model": d_model, "n_layers": n_layers},
        "pool_grow_1_to_2_s": pooled,
        "restart_2_s": restarted,
        "cold_restart_2_s": cold,
        "median_pool_s": pool_s,
        "median_restart_s": restart_s,
        "median_cold_restart_s": statistics.median(cold),
        "restart_over_pool": restart_s / pool_s,
        "cold_restart_over_pool": statistics.median(cold) / pool_s,
    }


def _cold_restart_s(d_model: int, n_layers: int) -> float:
    """A restart from nothing, as an elastic launcher restarts its workers: a new program
    whose `launch` starts new interpreters (its forkserver imports torch anew)."""
    submitted = time.time()
    code = (
        f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        f"import elastic_pool_runs as r; r.cold_restart({d_model}, {n_layers}, {submitted})"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout.split()[-1])


def cold_restart(d_model: int, n_layers: int, submitted: float) -> None:
    """The program `_cold_restart_s` runs: prints the seconds to the built model."""
    job = functools.partial(restart_job, d_model=d_model, n_layers=n_layers, submitted=submitted)
    print(pipeline.launch(job, 2, threads_per_stage=1)[0])
