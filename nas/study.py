"""One NAS study on long-lived stage processes: Optuna asks on rank 0, every stage trains.

`run_study(settings)` starts the stage processes once (`pipeline.launch`) and keeps them for
the whole study; each candidate is a `reconfigure` of the same `ElasticPipeline`, never a
restart. Per trial, numbered:

    1. rank 0 asks Optuna for a trial and samples an architecture define-by-run from it
       (an invalid one is told FAIL with its cause, and the next is asked);
    2. the architecture (JSON) is broadcast; every rank compiles it to layers and
       reconfigures (planned from the cost cache; weights inherited when asked);
    3. every rank trains `train.steps` steps; every `train.eval_every` steps the validation
       loss is measured on every rank, rank 0 reports it and decides whether to prune, and
       broadcasts the decision;
    4. a failure (a layer error, a NaN loss, a memory plan that cannot fit) is raised on
       every rank by the runtime: rank 0 tells FAIL and records the cause in the trial's
       user attributes; the study goes on with the same processes;
    5. rank 0 tells the objective values (validation loss, and tokens/s or peak memory for
       multi-objective studies) and the tracker logs the trial.

If a stage process dies, `launch` raises; the trial left RUNNING is failed with the cause
and the processes are started again, up to `study.max_restarts` times. Re-running with the
same study name resumes toward `study.n_trials` finished trials.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import pipeline
from nas import storage, trials
from nas.inheritance import WeightBank
from nas.settings import NasSettings
from nas.tasks import Task, TokenStats, get_task
from nas.tracking import pipeline_metrics
from pipeline import (
    ElasticPipeline,
    InfeasibleBudgetError,
    PipelineError,
    StageContext,
    WeightSnapshot,
)
from pipeline.distributed.comm import Comm
from search_spaces.architecture import InvalidArchitecture, from_json, summary
from search_spaces.compile import compile as compile_arch
from search_spaces.compile import parameter_count

__all__ = ["StudyResult", "run_study"]

_KEEP = 32  # trained trials whose weights a later candidate may start from (at least)
_TRIAL_ERRORS = (PipelineError, InfeasibleBudgetError, InvalidArchitecture, ValueError,
                 RuntimeError)  # fmt: skip


@dataclass(frozen=True)
class StudyResult:
    """What a finished `run_study` hands back: where the study lives and its trials."""

    study_name: str
    storage: str
    finished: int
    restarts: int
    run_dirs: tuple[str, ...]  # tracker run folders (W&B offline runs to sync)


def run_study(settings: NasSettings) -> StudyResult:
    """Run (or resume) the study described by `settings`; returns when it has enough trials.

    Under torchrun every process calls this: each is one stage, rank 0 alone opens the
    study, and a death is torchrun's to handle (restart the job: it resumes).
    """
    Path(settings.studies_dir).mkdir(parents=True, exist_ok=True)
    Path(settings.output_dir).mkdir(parents=True, exist_ok=True)
    owner = storage.this_owner()  # the trials this harness asks carry it (nas.storage)
    if pipeline.under_torchrun():
        finished, dirs = _launch(settings, owner)
        return StudyResult(settings.study.name, settings.storage_url, finished, 0, tuple(dirs))
    study = trials.open_study(settings)
    restarts = 0
    run_dirs: list[str] = []
    while trials.remaining(study, settings.study.n_trials) > 0:
        try:
            run_dirs.extend(_launch(settings, owner)[1])
        except pipeline.StageFailedError as error:
            trials.fail_running(study, f"stage {error.stage} died: {error.detail[-2000:]}", owner)
            restarts += 1
            if restarts > settings.study.max_restarts:
                raise
    return StudyResult(settings.study.name, settings.storage_url, trials.finished(study),
                       restarts, tuple(run_dirs))  # fmt: skip


def _launch(settings: NasSettings, owner: str) -> tuple[int, list[str]]:
    """Start the stage processes (or join torchrun's) and run trials until none are left;
    rank 0's (finished trials, tracker run folders)."""
    results = pipeline.launch(
        functools.partial(_stage_main, settings=settings, owner=owner),
        settings.pipeline.n_stages, threads_per_stage=settings.pipeline.threads_per_stage,
        timeout_s=settings.pipeline.timeout_s,
    )  # fmt: skip
    finished, run_dirs = results[0]
    return finished, run_dirs


# -- inside every stage process -------------------------------------------------------------
def _stage_main(ctx: StageContext, settings: NasSettings, owner: str) -> tuple[int, list[str]]:
    comm = Comm()
    task = get_task(settings.task.name, **settings.task.options)
    leader = trials.Leader(settings, task, owner) if ctx.rank == 0 else None
    bank = WeightBank(keep=max(_KEEP, int(settings.sampler.options.get("population_size", 0))))
    pipe: ElasticPipeline | None = None
    try:
        while True:
            order = comm.broadcast_object(leader.next_trial() if leader else None, src=0)
            if order is None:
                break
            number, arch_json, parent = order
            source = bank.source(parent) if settings.study.inherit_weights else None
            pipe, outcome = _run_trial(comm, settings, task, pipe, number, arch_json, leader,
                                       bank.get(source))  # fmt: skip
            if pipe is not None and source is not None:
                outcome.attrs["inherited_from"] = source
            if pipe is not None and settings.study.inherit_weights and outcome.state != "fail":
                bank.add(number, pipe)
            if leader is not None:
                leader.finish(number, outcome)
    finally:
        if pipe is not None:
            pipe.close()
        done = leader.close() if leader else (0, [])
    return done


def _run_trial(
    comm: Comm,
    settings: NasSettings,
    task: Task,
    pipe: ElasticPipeline | None,
    number: int,
    arch_json: str,
    leader: trials.Leader | None,
    inherit_from: WeightSnapshot | None,
) -> tuple[ElasticPipeline | None, trials.Outcome]:
    """Build and train one candidate on every rank; rank 0's `leader` reports and decides.

    `inherit_from`: the weights of the trial it came from (`nas.inheritance`), if any.
    """
    arch = from_json(arch_json)
    max_len = _max_len(task)
    specs = compile_arch(arch, len(task.vocab), max_len=max_len, dropout=settings.train.dropout)
    attrs: dict[str, Any] = {"architecture": summary(arch),
                             "parameters": parameter_count(arch, len(task.vocab), max_len=max_len)}
    started = time.perf_counter()
    try:
        pipe = _reconfigure(settings, task, pipe, specs, inherit_from)
        values, steps, pruned = _train(comm, settings, task, pipe, leader)
    except _TRIAL_ERRORS as error:  # raised on every rank by the runtime
        cause = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        detail = "".join(traceback.format_exception_only(error))[-4000:]
        return pipe, trials.Outcome("fail", attrs | {"fail_reason": cause, "detail": detail})
    stats = pipe.stats()
    attrs |= {"steps": steps, "seconds": time.perf_counter() - started,
              "partition": list(pipe.sizes), "migrations": len(stats.migrations),
              "partition_history": [[step, list(sizes)] for step, sizes in
                                    pipe.partition_history],
              "tokens_per_s": stats.tokens_per_s or 0.0,
              "peak_memory_bytes": max(s.measured_peak_bytes for s in stats.stages)}
    if settings.study.inherit_weights:
        attrs |= _inheritance(pipe)
    if pruned:
        return pipe, trials.Outcome("pruned", attrs | {"validation_loss": values[-1]})
    objectives = {"validation_loss": values[-1], **{k: attrs[k] for k in
                                                    ("tokens_per_s", "peak_memory_bytes")}}
    return pipe, trials.Outcome("complete", attrs | {"validation_loss": values[-1]},
                                [objectives[o] for o in settings.study.objectives])


def _inheritance(pipe: ElasticPipeline) -> dict[str, int]:
    """What this model took from the trial it came from (`inherit_weights`): layers and
    bytes inherited, and how many of them moved to another stage."""
    found = [e.details for e in pipe.events if e.kind == "inherit" and
             e.generation == pipe.generation]  # fmt: skip
    record = found[-1] if found else {"layers": 0, "bytes": 0, "moved": 0, "moved_bytes": 0}
    return {f"inherited_{k}": int(v) for k, v in record.items()}


def _reconfigure(
    settings: NasSettings,
    task: Task,
    pipe: ElasticPipeline | None,
    specs: list[Any],
    snapshot: WeightSnapshot | None,
) -> ElasticPipeline:
    if pipe is None:
        p = settings.pipeline
        optimizer = functools.partial(torch.optim.AdamW, lr=settings.train.lr, weight_decay=0.01)
        return ElasticPipeline(
            specs, optimizer=optimizer, loss_fn=task.loss_fn, schedule=p.schedule,
            n_microbatches=p.n_microbatches, seed=settings.seed, memory_budget=p.memory_budget,
            planner=p.planner, rebalance_every=p.rebalance_every,
            pipemare=dict(p.pipemare) if p.schedule == "pipemare" else None,
        )  # fmt: skip
    pipe.reconfigure(specs, inherit_from=snapshot)
    return pipe


def _train(
    comm: Comm,
    settings: NasSettings,
    task: Task,
    pipe: ElasticPipeline,
    leader: trials.Leader | None,
) -> tuple[list[float], int, bool]:
    """(validation losses at each evaluation, steps trained, pruned?).

    The steps between two evaluations are one `pipe.train` stream (no flush between them
    under "2bw"); the stream drains before each evaluation.
    """
    train = settings.train
    values: list[float] = []
    source = _endless(task, train.batch_size, settings.seed)
    step = 0
    while step < train.steps:
        segment = min(train.eval_every - step % train.eval_every, train.steps - step)
        last_loss = None
        for loss in pipe.train(itertools.islice(source, segment)):
            step += 1
            if last_loss is not None and leader is not None:  # all but the segment's last
                leader.step(step - 1, {"loss": last_loss})
            last_loss = loss
        if last_loss is None:
            raise ValueError(f"task {settings.task.name!r} yielded no training batches")
        # every rank: these are collectives
        values.append(_validation_loss(pipe, task, train.batch_size, train.eval_batches))
        metrics: dict[str, Any] = {"loss": last_loss, **pipeline_metrics(pipe.stats().to_dict()),
                                   "validation_loss": values[-1]}  # fmt: skip
        prune = leader.step(step, metrics) if leader else False
        if comm.broadcast_object(prune, src=0):
            return values, step, True
    return values, step, False


def _endless(task: Task, batch_size: int, seed: int) -> Iterator[tuple[Any, Any]]:
    """The task's training batches, epoch after epoch."""
    epoch = 0
    while True:
        yield from task.batches("train", batch_size, seed=seed, epoch=epoch)
        epoch += 1


def _validation_loss(pipe: ElasticPipeline, task: Task, batch_size: int, batches: int) -> float:
    stats = TokenStats()
    for i, (x, y) in enumerate(task.batches("validation", batch_size)):
        if i == batches:
            break
        stats.update(pipe.forward(x), y)
    loss = stats.loss
    return loss if math.isfinite(loss) else float("inf")


def _max_len(task: Task) -> int:
    """Positions the embeddings need: the task's longest sequence (+ BOS/EOS)."""
    if hasattr(task, "max_chars"):
        return int(task.max_chars) + 2
    return int(getattr(task, "seq_len", 64))
