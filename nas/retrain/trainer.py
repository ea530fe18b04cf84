"""Steps 2 to 4 of a retraining, inside every stage process: train, score, export.

`nas.retrain.stage` launches `stage_main` on every rank of a fresh pipeline runtime. Each
(model, training seed) run left is trained from scratch on the pipeline (rank 0 decides, with
the other workers' claims, which run comes next: `nas.retrain.claims`), scored on whole
splits, and, on rank 0, kept: the model exported when this run is its best seed so far
(`nas.export.writing`), and the run recorded beside the export (`nas.retrain.runs`).
"""

from __future__ import annotations

import functools
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from rich.progress import Progress

from nas import job_log
from nas.export.writing import export_model, write_model_card
from nas.learning_rate import LrSchedule
from nas.progress import progress_bars
from nas.retrain import runs as retrain_runs
from nas.retrain.claims import Run, RunClaims, Step, exclusive, export_lock
from nas.retrain.records import model_folder, model_records, run_digest
from nas.retrain.results import Model, RetrainRun, score
from nas.settings import NasSettings, TrainSettings
from nas.study import shape, training
from nas.study.checkpoints import RunCheckpoints
from nas.study.phases import TrialClock
from nas.tasks import Task, get_task
from pipeline import ElasticPipeline, StageContext
from pipeline.distributed.comm import Comm
from search_spaces.architecture import from_json

__all__ = ["stage_main"]

# A stage's outcome on rank 0: every run in model and seed order, the exported folders by
# model name, and the (model, seed) runs trained here.
StageOutcome = tuple[list[RetrainRun], dict[str, str], list[tuple[str, int]]]


def stage_main(
    ctx: StageContext,
    settings: NasSettings,
    models: tuple[Model, ...],
    done: dict[tuple[str, int], RetrainRun],
    show: bool = True,
) -> StageOutcome | None:
    """Steps 2-4 on one rank, skipping the runs `done` holds (recorded by an earlier,
    stopped retraining) and the runs other workers claimed (`nas.retrain.claims`: their
    records are read once written); rank 0 returns every run, in model and seed order, the
    exported folders and the runs trained here."""
    job_log.attach()  # this process logs to the CLI's job log too
    comm = Comm()
    task = comm.together(lambda: get_task(settings.task.name, **settings.task.options))
    steps = settings.retrain.steps or settings.train.steps
    seeds = settings.retrain.seeds
    left = [(m, seed) for m in models for seed in seeds if (m.name, seed) not in done]
    claims = RunClaims(settings.retrain.claim_wait_s) if ctx.rank == 0 else None
    progress = _progress(len(left) * steps, show) if ctx.rank == 0 else None
    runs = dict(done)
    trained: list[tuple[str, int]] = []
    try:
        while left:
            step = comm.agree(functools.partial(_next, settings, claims, left))
            if step.action == "wait":
                continue
            model, seed = left.pop(step.index)
            if step.record is not None:  # trained by another worker
                runs[model.name, seed] = RetrainRun(**step.record)
                if progress is not None:
                    progress[0].advance(progress[1], steps)
                continue
            run, state = _train(settings, task, model, seed, steps, progress)
            runs[model.name, seed] = run
            trained.append((model.name, seed))
            if claims is not None:
                _keep(settings, task, model, run, state)
                claims.release(_claimed(settings, model, seed))
    finally:
        if claims is not None:
            claims.release_all()
        if progress is not None:
            progress[0].stop()
    if ctx.rank != 0:
        return None
    exported = {
        m.name: str(model_folder(settings, m))
        for m in models
        if (model_folder(settings, m) / "metrics.json").exists()
    }
    return [runs[m.name, seed] for m in models for seed in seeds], exported, trained


def _next(
    settings: NasSettings, claims: RunClaims | None, left: Sequence[tuple[Model, int]]
) -> Step:
    """(Rank 0) Train, read or wait for which of the runs `left` (`RunClaims.next`)."""
    if claims is None:
        raise RuntimeError("only rank 0 holds the claims")
    return claims.next([_claimed(settings, model, seed) for model, seed in left])


def _claimed(settings: NasSettings, model: Model, seed: int) -> Run:
    return Run(model_folder(settings, model), seed, run_digest(settings, model))


def _keep(
    settings: NasSettings, task: Task, model: Model, run: RetrainRun, state: dict[str, Any]
) -> None:
    """Rank 0, after each run, holding the model's export lock (other workers may keep runs
    of it at once: `nas.retrain.claims`): export the model if this run is its best seed of
    those recorded so far (`nas.retrain.runs`), else refresh the export's per-seed figures;
    then record the run."""
    folder = model_folder(settings, model)
    with exclusive(export_lock(folder), settings.retrain.claim_wait_s):
        recorded = model_records(settings, model)
        mine = [
            run if seed == run.seed else recorded[seed][0]
            for seed in settings.retrain.seeds
            if seed == run.seed or seed in recorded
        ]
        best = min(mine, key=lambda r: score(r, settings.study.fitness))
        if state and best is run:
            _export(settings, task, model, run, state, mine)
        elif (folder / "metrics.json").exists():
            metrics = json.loads((folder / "metrics.json").read_text())
            metrics["per_seed"] = [{"seed": r.seed, **r.metrics} for r in mine if r.error is None]
            (folder / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
            write_model_card(folder)  # the card's per-seed table too
        if run.error is None:  # a failed run is tried again by the next retraining
            retrain_runs.save(folder, run.seed, run_digest(settings, model), asdict(run))


def _train(
    settings: NasSettings,
    task: Task,
    model: Model,
    seed: int,
    steps: int,
    progress: tuple[Progress, Any] | None,
) -> tuple[RetrainRun, dict[str, Any]]:
    """Steps 2 and 3 for one (model, seed): the run, and rank 0's weights ({} elsewhere);
    the run records its seconds by phase (`nas.study.phases`).

    With `retrain.checkpoint_every` the run saves a checkpoint every N steps and resumes from
    its latest one (a killed retraining's) with its history, skipping the batches trained
    already (`nas.study.checkpoints.RunCheckpoints`)."""
    arch = from_json(model.architecture)
    specs, parameters = training.compile_model(arch, task, settings.train.dropout)
    run = RetrainRun(model.name, seed, model.trial, model.params, parameters)
    if progress is not None:
        progress[0].update(progress[1], description=f"retrain {model.name} seed {seed}")
    schedule = training.rates(settings.train, steps)
    every = settings.retrain.checkpoint_every
    saves = RunCheckpoints(
        retrain_runs.checkpoint_folder(model_folder(settings, model), seed),
        run_digest(settings, model),
        every,
        steps,
        label=f"retrain {model.name} seed {seed}",
    )
    pipe: ElasticPipeline | None = None
    started, clock = time.perf_counter(), TrialClock()
    try:
        with clock.running():
            pipe = training.build(
                settings,
                task,
                specs,
                schedule,
                seed=seed,
                checkpoint=saves.options(),
                cost_cache=shape.load_cache(),
            )
            _train_steps(settings, task, pipe, run, saves, schedule, progress)
            run.steps, run.seconds = steps, time.perf_counter() - started
            _score(settings, task, pipe, run)
        return run, pipe.full_state_dict()
    except training.RUN_ERRORS as error:  # raised on every rank by the runtime
        reason, detail = training.failure(error)
        run.error = f"{reason}\n{detail[-2000:]}"
        return run, {}
    finally:
        run.time_s = clock.seconds()
        if pipe is not None:
            pipe.close()


def _train_steps(
    settings: NasSettings,
    task: Task,
    pipe: ElasticPipeline,
    run: RetrainRun,
    saves: RunCheckpoints,
    schedule: LrSchedule,
    progress: tuple[Progress, Any] | None,
) -> None:
    """Step 2: train `run` to its last step on the seed's batches (`training.batches`: the
    seed alone fixes their order), from its checkpoint if it has one, evaluating every
    `train.eval_every` steps; each step's entry goes to `run.history` and `saves`."""
    start, run.history = saves.resumed(pipe)
    if progress is not None:
        progress[0].advance(progress[1], start)
    source = training.batches(task, settings.train.batch_size, run.seed)  # the seed's order
    source = itertools.islice(source, start, None)  # from the first batch not trained
    steps = saves.steps
    for step, loss in training.steps(pipe, source, start=start, count=steps - start):
        entry = {"step": step, "loss": loss, "lr": schedule.rate(step - 1)}
        if step % settings.train.eval_every == 0 and step != steps:
            entry |= training.evaluate(settings.train, task, pipe, final=False)
        run.history.append(entry)
        saves.stepped(pipe, entry)
        if progress is not None:
            progress[0].advance(progress[1])


def _score(settings: NasSettings, task: Task, pipe: ElasticPipeline, run: RetrainRun) -> None:
    """Step 3: the trained `run`'s throughput, memory and figures on the whole validation
    split, then the test split (read once); the last history entry gets the validation
    figures."""
    stats = pipe.stats()
    run.samples_per_s, run.tokens_per_s = stats.samples_per_s or 0.0, stats.tokens_per_s or 0.0
    run.peak_memory_bytes = max(s.measured_peak_bytes for s in stats.stages)
    final = _final_train(settings)
    run.metrics = training.evaluate(final, task, pipe, final=True)
    run.metrics |= training.evaluate(final, task, pipe, "test", final=True)
    if run.history:
        run.history[-1] |= {k: v for k, v in run.metrics.items() if k.startswith("validation_")}


def _final_train(settings: NasSettings) -> TrainSettings:
    """The final scoring decodes `retrain.decode_pairs` (default every pair), whatever the
    search's trials decoded."""
    return replace(settings.train, final_decode_pairs=settings.retrain.decode_pairs)


def _export(
    settings: NasSettings,
    task: Task,
    model: Model,
    run: RetrainRun,
    state: dict[str, Any],
    runs: Sequence[RetrainRun],
) -> Path:
    """Step 4: the model's best seed, with every seed's validation figures beside it; the
    task's headline metrics (`Task.headline_metrics`) also by their own names."""
    metrics: dict[str, Any] = dict(run.metrics)
    for name in type(task).headline_metrics:
        if f"validation_{name}" in metrics:
            metrics[name] = metrics[f"validation_{name}"]
    mine = [r for r in runs if r.model == model.name and r.error is None]
    metrics |= {
        "params": run.parameters,
        "steps": run.steps,
        "seed": run.seed,
        "samples_per_s": run.samples_per_s,
        "trial": model.trial,
        "per_seed": [{"seed": r.seed, **r.metrics} for r in mine],
        "data": task.describe(),  # the splits' sizes, the scorers' signatures, ...
    }
    return export_model(
        model_folder(settings, model),
        state=state,
        arch=from_json(model.architecture),
        params=model.params,
        task=task,
        settings=settings,
        metrics=metrics,
        max_len=training.max_len(task),
    )


def _progress(total: int, show: bool) -> tuple[Progress, Any]:
    progress = progress_bars("steps", show=show)
    bar = progress.add_task("retrain", total=total)
    progress.start()
    return progress, bar
