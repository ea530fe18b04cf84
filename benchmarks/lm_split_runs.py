"""The runs of `lm_split.py`, built and timed in both stage processes.

Why it exists: `lm_split.py` is the entry point; this is what its two processes do: every
run at each M (torch's schedules at the user's, the brute-force and the hand-swept splits,
each checked against one process; ours with `partition="auto"`; one process), a warm-up
step each, then all of them in the same interleaved rounds.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from _torch_peer import Workload, chain, checked_torch_schedule, chunks_of, reference_grads
from common import accumulate, optimizer_step, timed_rounds
from lm_split_model import (
    LMConfig,
    all_splits,
    best_splits,
    layer_times,
    lm_loss,
    rank_times,
    user_split,
)
from torch.distributed.pipelining import (
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)

import pipeline
from pipeline import CostCache, ElasticPipeline, PlanOptions, StageContext
from pipeline.pure.schedule import SCHEDULES, is_stream

OPTIMIZER = functools.partial(torch.optim.SGD, lr=1e-3)
OURS = ("auto", "gpipe", "1f1b", "zbh1", "interleaved_1f1b", "zbv", "2bw")
EXACT = ("auto", "gpipe", "1f1b", "zbh1", "interleaved_1f1b", "zbv")  # 2bw: another update
TORCH_SCHEDULES: dict[str, tuple[type, str]] = {  # name: (class, layout of `chunks_of`)
    "1f1b": (Schedule1F1B, "single"),
    "interleaved_1f1b": (ScheduleInterleaved1F1B, "loop"),
    "zbv": (ScheduleZBVZeroBubble, "v"),
}
LOSS_TOLERANCE, GRAD_TOLERANCE = 1e-4, 1e-4  # abs loss; max |g - ref| / max |ref| per tensor
Step = Callable[[], None]


def _error(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:2000]


def single_process(ctx: StageContext, cfg: LMConfig, m: int) -> Step:
    """One step of the whole model on rank 0, accumulating over m micro-batches."""
    if ctx.rank != 0:
        return lambda: None
    model = chain(cfg.specs(), ctx.device)
    optimizer = OPTIMIZER(model.parameters())
    return optimizer_step(accumulate(model, cfg.data(), m, lm_loss), optimizer)


CORRECTION_WAIT = 40  # steps at most after `correction_steps` until the correction ran


def ours_run(
    cfg: LMConfig, name: str, m: int, cache: CostCache, steps: int, correction_steps: int
) -> tuple[Step, ElasticPipeline, float]:
    """(step, pipeline, first loss); the first step plans, schedule="auto" tries the plans
    its cost model cannot rank (`ElasticOptions.try_plans`) until it keeps one, and the next
    `correction_steps` let the plan be corrected from measured costs
    (`ElasticOptions.correct_after`, on by default; after a tryout it comes later: up to
    `CORRECTION_WAIT` more steps), and the other schedules' plans tried at the correction
    run, before anything is timed. 2bw trains a stream per round."""
    pipe = ElasticPipeline(
        cfg.specs(),
        optimizer=OPTIMIZER,
        loss_fn=lm_loss,
        schedule=name,
        n_microbatches=m,
        planning=PlanOptions(partition="auto", cost_cache=cache),
    )
    x, y = cfg.data()
    first_loss = pipe.train_step(x, y)
    if name == "auto" or not is_stream(name):
        while pipe.trying is not None:  # the plans tried first
            pipe.train_step(x, y)
        for _ in range(correction_steps):
            pipe.train_step(x, y)
        for _ in range(CORRECTION_WAIT):  # a plan kept by a tryout is corrected later
            if any(e.kind == "replan" for e in pipe.events):
                break
            pipe.train_step(x, y)
        while pipe.trying is not None:  # the plans tried at the correction
            pipe.train_step(x, y)
    calls = itertools.count()

    def step() -> None:
        if name == "auto" or not is_stream(name):
            pipe.train_step(x, y)
        elif next(calls) % steps == 0:
            for _ in pipe.train(itertools.repeat((x, y), steps)):
                pass

    return step, pipe, first_loss


def ours_record(pipe: ElasticPipeline, first_loss: float, ref_loss: float) -> dict[str, Any]:
    """What ours chose (schedule, partition, plan) and its first step's loss check."""
    stats = pipe.stats()
    return {
        "chosen_schedule": stats.schedule,
        "partition": list(stats.partition),
        "partition_history": pipe.partition_history,
        "replans": [e.details for e in pipe.events if e.kind in ("trigger", "replan")],
        "tryouts": [e.details for e in pipe.events if e.kind == "tryout"],
        "plan": stats.plan.to_dict() if stats.plan is not None else None,
        "first_step_loss": first_loss,
        "reference_first_step_loss": ref_loss,
        "loss_abs_diff": abs(first_loss - ref_loss),
        "predicted_iteration_s": stats.predicted_iteration_s,
        "bubble_fraction": stats.bubble_fraction,
        "tokens_per_s_last_step": stats.tokens_per_s,
    }


def _key(name: str, sizes: Sequence[int], m: int) -> str:
    return f"torch_{name}_{'-'.join(map(str, sizes))}_M{m}"


def _torch_runs(
    ctx: StageContext, cfg: LMConfig, m: int, top: int, full: bool, per_layer: list[float]
) -> tuple[dict[str, Step], dict[str, dict[str, Any]], float]:
    """torch's schedules at M = m on the user's split (`full`), the `top` brute-force splits
    and (`full`, 1F1B) every 2-way cut: (steps, records, the reference loss)."""
    runs: dict[str, Step] = {}
    records: dict[str, dict[str, Any]] = {}
    reference = reference_grads(chain(cfg.specs(), ctx.device), cfg.data(), m, lm_loss)
    work = Workload(cfg.specs(), cfg.data(), lm_loss, OPTIMIZER)
    for name, (cls, layout) in TORCH_SCHEDULES.items():
        equal = user_split(cfg, chunks_of(layout, 0)[0])
        searched = best_splits(per_layer, layout, top)
        # 1F1B by hand: every cut between the blocks and the head (the model's own runs)
        swept = list(all_splits(cfg.layers, 2)) if full and layout == "single" else []
        chosen = [*([equal] if full else []), *searched, *swept]
        for sizes in [s for i, s in enumerate(chosen) if s not in chosen[:i]]:
            key = _key(name, sizes, m)
            records[key] = {
                "kind": "torch",
                "schedule": cls.__name__,
                "layout": layout,
                "chunk_sizes": sizes,
                "user_split": sizes == equal,
                "brute_force_rank": searched.index(sizes) if sizes in searched else None,
                "hand_swept": sizes in swept,
                "scored_rank_times_s": rank_times(sizes, layout, per_layer),
            }
            try:
                run = checked_torch_schedule(
                    ctx, work, (cls, layout), sizes, m, reference, (LOSS_TOLERANCE, GRAD_TOLERANCE)
                )
                runs[key], records[key]["check"] = run.step, run.check
            except Exception as error:
                records[key]["error"] = _error(error)
    return runs, records, reference[0]


def build_m(
    ctx: StageContext,
    cfg: LMConfig,
    m: int,
    top: int,
    steps: int,
    cache: CostCache,
    full: bool,
    correction_steps: int,
) -> tuple[dict[str, Step], dict[str, Any], dict[str, Any]]:
    """Every run at M = m (not `full`: only torch's brute-force splits, ours (auto) and one
    process): (steps by key, records by key, the per-layer times and the reference loss)."""
    times: list[Any] = [layer_times(cfg, m, ctx.device) if ctx.rank == 0 else None]
    dist.broadcast_object_list(times, src=0)  # both ranks pick the same splits
    per_layer: list[float] = times[0]
    runs, records, ref_loss_dropout_off = _torch_runs(ctx, cfg, m, top, full, per_layer)
    ref_loss = pipeline.ReferenceTrainer(
        cfg.specs(), optimizer=OPTIMIZER, loss_fn=lm_loss, n_microbatches=m
    ).train_step(*cfg.data())
    for name in OURS if full else ("auto",):
        key = f"ours_{name}_M{m}"
        records[key] = {"kind": "ours", "schedule": name, "exact": name in EXACT}
        try:
            runs[key], pipe, first = ours_run(cfg, name, m, cache, steps, correction_steps)
            records[key]["_pipe"] = (pipe, first, ref_loss)
        except Exception as error:
            records[key]["error"] = _error(error)
    runs[f"single_process_M{m}"] = single_process(ctx, cfg, m)
    records[f"single_process_M{m}"] = {"kind": "single_process"}
    names = [s.key for s in cfg.specs()]
    return (
        runs,
        records,
        {"layer_names": names, "times_s": per_layer, "ref_loss": ref_loss_dropout_off},
    )


def run_all(
    ctx: StageContext,
    models: Sequence[tuple[LMConfig, bool]],
    ms: Sequence[int],
    rounds: int,
    steps: int,
    top: int,
    correction_steps: int,
) -> dict[str, Any]:
    """In both processes: build every run of every (model, full?) at every M, warm up, time
    them all in the same rounds. Keys: "<model label>/<run>_M<m>"."""
    cache = CostCache()
    runs: dict[str, Step] = {}
    records: dict[str, dict[str, Any]] = {}
    layers: dict[str, dict[str, Any]] = {}
    for cfg, full in models:
        layers[cfg.label] = {}
        for m in ms:
            r, rec, layers[cfg.label][f"M{m}"] = build_m(
                ctx, cfg, m, top, steps, cache, full, correction_steps
            )
            runs.update({f"{cfg.label}/{k}": v for k, v in r.items()})
            records.update({f"{cfg.label}/{k}": v for k, v in rec.items()})
    for key, step in list(runs.items()):  # a second warm-up step (the first: plan / check)
        try:
            step()
        except Exception as error:
            records[key]["error"] = _error(error)
            del runs[key]
    seconds = timed_rounds(runs, rounds, steps)
    for key, rec in records.items():
        ours = rec.pop("_pipe", None)
        if ours is not None and key in seconds:
            rec.update(ours_record(*ours))
        if key in seconds:
            rec["per_round_step_s"] = seconds[key]
    by_model = {
        label: {k.split("/", 1)[1]: v for k, v in records.items() if k.startswith(f"{label}/")}
        for label in layers
    }
    return {"records": by_model, "layer_times": layers, "registry": sorted(SCHEDULES)}
