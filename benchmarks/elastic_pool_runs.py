"""What `elastic_pool.py` runs in processes: the candidates' model and training, the three
arms (a stage pool, per-study workers, fixed 2-stage pipelines) and the switch from one
candidate to the next. Module-level, so the pool's and the launched processes import it.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F

import pipeline
from pipeline import ElasticPipeline, PlanOptions, PoolContext, StagePool
from pipeline.local.models import transformer_stack

BATCH, SEQ, HEADS = 16, 16, 4
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
            else equal_split(candidate.n_layers, n_stages)
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


def equal_split(n_layers: int, n_stages: int) -> tuple[int, ...]:
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
    pool_s, restart_s = statistics.median(pooled), statistics.median(restarted)
    return {
        "model": {"d_model": d_model, "n_layers": n_layers},
        "pool_grow_1_to_2_s": pooled,
        "restart_2_s": restarted,
        "median_pool_s": pool_s,
        "median_restart_s": restart_s,
        "restart_over_pool": restart_s / pool_s,
    }
