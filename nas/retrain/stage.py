"""The retrain stage: the search's best architectures, trained from scratch and exported.

A trial's score is a proxy: a short budget, one training seed, maybe weights inherited from
its parent. Before anyone uses what a study found, its best architectures (and, to compare,
both seed architectures) are trained again from scratch at the full budget with several
training seeds, on the same pipeline runtime, scored on whole splits and exported. It runs
after the search (`stages: [search, retrain]`) or alone against a stored study
(`stages: [retrain]`). In order:

    1. select  (caller)     the `retrain.top_k` complete trials with the best fitness, one
                            per network: two trials whose architectures compile to the same
                            network (`identity`) are one model, the better trial's, named
                            `trial-<number>`; with `retrain.seed_models` also `transformer`
                            and `evolved_transformer` (the trials skip their networks)
    2. train   (every rank) per model and training seed: a fresh pipeline seeded with it,
                            fed the training batches in the order that seed alone fixes
                            (`training.batches(task, batch_size, seed)`: every model sees the
                            same data order for a seed), `retrain.steps` steps with the
                            learning-rate schedule, evaluated every `train.eval_every` steps
                            as a trial is
    3. score   (every rank) the whole validation split, every pair decoded (or
                            `retrain.decode_pairs`), then the test split once; choices read
                            validation only
    4. export  (rank 0)     each model's best seed by validation fitness (`nas.export.writing`)
    5. compare (caller)     each model against the reference seed model, paired by training
                            seed (`nas.paired`): on the fitness and on `validation_chrf` when
                            the task has it
    6. track   (caller)     one tracker run per (model, seed): `job_type="retrain"`, in
                            the study's group, with its step history and final metrics; the
                            study summary holds the comparison

A run that fails (a layer error, a memory plan that cannot fit) is recorded with its cause
and the next one goes on. A stopped retraining resumes: every finished run is recorded beside
its model's export (`nas.retrain.runs`), and running it again trains only what is missing.
Several workers retraining one study at once (each at the end of its search) share its
runs: each run is claimed and trained by one of them, and the others wait for its record and
read it (`nas.retrain.claims`), so that all end with the same result.
`RetrainResult.selected` is the model with the best mean
validation fitness over its seeds: the study's answer. `RetrainResult.paired` holds each
other model's paired difference against `RetrainResult.reference`: the Evolved Transformer
when it was retrained (a seed trained), else the seed model with the best mean fitness,
else none (no seed model retrained: no comparison).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import optuna
from rich.progress import Progress

import pipeline
from nas import job_log, storage
from nas.export.writing import export_model, write_model_card
from nas.progress import progress_bars
from nas.retrain import runs as retrain_runs
from nas.retrain.claims import Run, RunClaims, Step, exclusive, export_lock
from nas.retrain.results import (
    Model,
    RetrainResult,
    RetrainRun,
    compare,
    model_table,
    paired_metrics,
    score,
)
from nas.settings import NasSettings, TrainSettings, lower_is_better
from nas.storage import url as storage_url
from nas.study import shape, training, trials, workers
from nas.study.tracker_setup import run_directories, study_tracker
from nas.tasks import Task, get_task
from nas.tracking.base import TrialEnd
from nas.tracking.exports import (
    export_metadata,
    exported_seed,
    model_artifact_name,
    record_exports,
)
from pipeline import ElasticPipeline, StageContext
from pipeline.distributed.comm import Comm
from search_spaces.architecture import from_json, functional_key, to_json
from search_spaces.evolved_transformer import seed_params

__all__ = [
    "Model",
    "RetrainResult",
    "RetrainRun",
    "compare",
    "identity",
    "model_table",
    "paired_metrics",
    "retrain",
    "retrain_models",
    "select_models",
]


def retrain(settings: NasSettings) -> RetrainResult:
    """Retrain and export the best of the stored study `settings.study.name` (module doc).

    With `retrain.selection_seeds` and more than one searched model, the searched models are
    first retrained on those seeds and only the best of them (mean validation fitness) goes
    on, with the seed models, to `retrain.seeds`: the seeds that judge it played no part in
    any choice (`RetrainResult.selection` holds the choosing retraining)."""
    study = _load_study(settings)
    models = select_models(study, settings)
    if not models:
        raise ValueError(f"study {settings.study.name!r} has no complete trial to retrain")
    searched = [m for m in models if m.trial is not None]
    choosing = settings.retrain.selection_seeds
    if not choosing or len(searched) < 2:
        return retrain_models(settings, models)
    selection = retrain_models(
        replace(settings, retrain=replace(settings.retrain, seeds=choosing, selection_seeds=())),
        searched,
    )
    winner = [m for m in searched if m.name == selection.selected] or searched[:1]
    judged = retrain_models(settings, winner + [m for m in models if m.trial is None])
    return replace(judged, selection=selection)


def retrain_models(
    settings: NasSettings,
    models: Sequence[Model],
    *,
    progress: bool = True,
    worker: int | None = None,
) -> RetrainResult:
    """Steps 2-5 for any `models` (e.g. architectures a benchmark picked).

    Shape values left "auto" are chosen for these models first (`nas.study.shape`); with more
    than one worker, local workers (`nas.study.workers`) share the runs, each running this
    function as `worker` k. `progress`: show the steps' bar (a worker leaves it to its
    caller)."""
    if worker is None:
        settings = _shaped(settings, models)
        workers = int(settings.study.workers)
        if workers > 1:
            return _on_workers(settings, models, workers)
    done, tracked = _recorded(settings, models)
    stage_main = functools.partial(
        _stage_main, settings=settings, models=tuple(models), done=done, show=progress
    )
    results = pipeline.launch(
        stage_main,
        settings.pipeline.stage_count,
        threads_per_stage=settings.pipeline.thread_count,
        timeout_s=settings.pipeline.timeout_s,
    )
    runs, exported, trained = results[0] if results[0] is not None else ((), {}, ())
    fitness = settings.study.fitness
    table = model_table(runs, fitness)
    selected = table[0]["model"] if table and math.isfinite(table[0][f"{fitness}_mean"]) else None
    reference, paired = compare(runs, fitness)
    comparison = {"reference": reference, "vs_reference": paired}
    # A run is tracked by the worker that trained it (not by one that read its record), or,
    # recorded but not tracked by an earlier retraining, by the one that finds it so.
    # Under torchrun every rank gets here with rank 0's runs; one of them tracks.
    mine = set(trained) | (done.keys() - tracked)
    fresh = [run for run in runs if (run.model, run.seed) in mine]
    fresh = fresh if pipeline.lead_process() else []
    run_dirs = _track(settings, runs, fresh, selected, comparison, exported) if fresh else ()
    by_name = {model.name: model for model in models}
    for run in fresh:
        if run.error is None:
            digest = _digest(settings, by_name[run.model])
            retrain_runs.mark_tracked(_folder(settings, by_name[run.model]), run.seed, digest)
    return RetrainResult(
        settings.study.name,
        tuple(runs),
        exported,
        selected,
        fitness,
        tuple(run_dirs),
        reference,
        paired,
    )


def _on_workers(settings: NasSettings, models: Sequence[Model], n_workers: int) -> RetrainResult:
    """Retrain `models` on `n_workers` local workers (`nas.study.workers`), each run trained
    by one of them. Every worker ends with every run; one worker's result is returned with
    the exports and tracked runs of all."""
    total = len(models) * len(settings.retrain.seeds)
    results = workers.run_workers(
        workers.WorkerJob("retrain", settings, functools.partial(_as_worker, models=tuple(models))),
        n_workers,
        settings.pipeline.stage_count * (settings.pipeline.thread_count or 1),
        ("retrain", total, lambda: recorded_runs(settings, models)),
    )
    exported = {name: folder for r in results for name, folder in r.exported.items()}
    return replace(
        results[0], exported=exported, run_dirs=tuple(d for r in results for d in r.run_dirs)
    )


def _as_worker(settings: NasSettings, number: int, *, models: tuple[Model, ...]) -> RetrainResult:
    """What worker `number` of `_on_workers` runs (module-level: pickled by name)."""
    return retrain_models(settings, models, progress=False, worker=number)


def recorded_runs(settings: NasSettings, models: Sequence[Model]) -> int:
    """How many of the runs of `models` are recorded (trained, or read from an earlier
    retraining): a retraining's progress as another process sees it."""
    return len(_recorded(settings, models)[0])


def _shaped(settings: NasSettings, models: Sequence[Model]) -> NasSettings:
    """`settings` with its "auto" shape values chosen for `models`: at most one worker per
    run left; under torchrun, its processes are the stages of one worker."""
    if pipeline.under_torchrun():
        return shape.resolve_one(settings)[0]
    left = len(models) * len(settings.retrain.seeds) - recorded_runs(settings, models)
    architectures = [from_json(model.architecture) for model in models]
    return shape.resolve(settings, max_workers=max(1, left), architectures=architectures)[0]


def select_models(study: optuna.Study, settings: NasSettings) -> list[Model]:
    """Step 1: the `top_k` best complete trials, one per network (then the seeds)."""
    seeds = trials.seed_architectures(settings) if settings.retrain.seed_models else {}
    taken = {identity(to_json(arch)) for arch in seeds.values()}
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    fitness = settings.study.fitness
    ranked = sorted(complete, key=lambda t: (lower_is_better(fitness, t.values[0]), t.number))
    chosen: list[Model] = []
    for trial in ranked:
        if len(chosen) == settings.retrain.top_k:
            break
        architecture = trials.architecture_of(trial, settings)
        if identity(architecture) not in taken:
            taken.add(identity(architecture))
            chosen.append(
                Model(f"trial-{trial.number}", trial.number, dict(trial.params), architecture)
            )
    primitives = trials.space_primitives(settings)
    chosen += [
        Model(name, None, seed_params(arch, primitives=primitives), to_json(arch))
        for name, arch in seeds.items()
    ]
    return chosen


def identity(architecture: str) -> str:
    """What makes two architectures (JSON) one model: `functional_key`, equal for the same
    network however the branches of its blocks are ordered."""
    return functional_key(from_json(architecture))


# -- inside every stage process -------------------------------------------------------------
def _stage_main(
    ctx: StageContext,
    settings: NasSettings,
    models: tuple[Model, ...],
    done: dict[tuple[str, int], RetrainRun],
    show: bool = True,
) -> tuple[list[RetrainRun], dict[str, str], list[tuple[str, int]]] | None:
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
        m.name: str(_folder(settings, m))
        for m in models
        if (_folder(settings, m) / "metrics.json").exists()
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
    return Run(_folder(settings, model), seed, _digest(settings, model))


def _keep(
    settings: NasSettings, task: Task, model: Model, run: RetrainRun, state: dict[str, Any]
) -> None:
    """Rank 0, after each run, holding the model's export lock (other workers may keep runs
    of it at once: `nas.retrain.claims`): export the model if this run is its best seed of
    those recorded so far (`nas.retrain.runs`), else refresh the export's per-seed figures;
    then record the run."""
    folder = _folder(settings, model)
    with exclusive(export_lock(folder), settings.retrain.claim_wait_s):
        recorded = _records(settings, model)
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
            retrain_runs.save(folder, run.seed, _digest(settings, model), asdict(run))


def _folder(settings: NasSettings, model: Model) -> Path:
    return Path(settings.retrain.models_dir) / settings.study.name / model.name


def _digest(settings: NasSettings, model: Model) -> str:
    """How a run of `model` trains: equal digests, the same run (`nas.retrain.runs`)."""
    how = {
        "train": asdict(settings.train),
        "task": asdict(settings.task),
        "decode_pairs": settings.retrain.decode_pairs,
    }
    return retrain_runs.fingerprint(
        model.architecture, settings.retrain.steps or settings.train.steps, how
    )


def _recorded(
    settings: NasSettings, models: Sequence[Model]
) -> tuple[dict[tuple[str, int], RetrainRun], set[tuple[str, int]]]:
    """The runs an earlier retraining of these models finished and recorded, and which of
    them were tracked."""
    done, tracked = {}, set()
    for model in models:
        for seed, (run, was_tracked) in _records(settings, model).items():
            done[model.name, seed] = run
            if was_tracked:
                tracked.add((model.name, seed))
    return done, tracked


def _records(settings: NasSettings, model: Model) -> dict[int, tuple[RetrainRun, bool]]:
    """`model`'s recorded runs trained as now, by seed, and whether each was tracked."""
    digest, folder = _digest(settings, model), _folder(settings, model)
    found = {seed: retrain_runs.load(folder, seed, digest) for seed in settings.retrain.seeds}
    return {seed: (RetrainRun(**f[0]), f[1]) for seed, f in found.items() if f is not None}


def _train(
    settings: NasSettings,
    task: Task,
    model: Model,
    seed: int,
    steps: int,
    progress: tuple[Progress, Any] | None,
) -> tuple[RetrainRun, dict[str, Any]]:
    """Steps 2 and 3 for one (model, seed): the run, and rank 0's weights ({} elsewhere).

    With `retrain.checkpoint_every` the run saves a checkpoint every N steps and resumes from
    its latest one (a killed retraining's) with its history, skipping the batches trained
    already (`nas.retrain.runs.RunCheckpoints`)."""
    arch = from_json(model.architecture)
    specs, parameters = training.compile_model(arch, task, settings.train.dropout)
    run = RetrainRun(model.name, seed, model.trial, model.params, parameters)
    if progress is not None:
        progress[0].update(progress[1], description=f"retrain {model.name} seed {seed}")
    schedule = training.rates(settings.train, steps)
    every = settings.retrain.checkpoint_every
    saves = retrain_runs.RunCheckpoints(
        _folder(settings, model), seed, _digest(settings, model), every, steps
    )
    pipe: ElasticPipeline | None = None
    started = time.perf_counter()
    try:
        pipe = training.build(
            settings,
            task,
            specs,
            schedule,
            seed=seed,
            checkpoint=saves.options(),
            cost_cache=shape.load_cache(),
        )
        start, run.history = saves.resumed(pipe)
        if progress is not None:
            progress[0].advance(progress[1], start)
        source = training.batches(task, settings.train.batch_size, seed)  # the seed's order
        source = itertools.islice(source, start, None)  # from the first batch not trained
        for step, loss in training.steps(pipe, source, start=start, count=steps - start):
            entry = {"step": step, "loss": loss, "lr": schedule.rate(step - 1)}
            if step % settings.train.eval_every == 0 and step != steps:
                entry |= training.evaluate(settings.train, task, pipe, final=False)
            run.history.append(entry)
            saves.stepped(pipe, entry)
            if progress is not None:
                progress[0].advance(progress[1])
        stats = pipe.stats()
        run.steps, run.seconds = steps, time.perf_counter() - started
        run.samples_per_s, run.tokens_per_s = stats.samples_per_s or 0.0, stats.tokens_per_s or 0.0
        run.peak_memory_bytes = max(s.measured_peak_bytes for s in stats.stages)
        final = _final_train(settings)
        run.metrics = training.evaluate(final, task, pipe, final=True)
        run.metrics |= training.evaluate(final, task, pipe, "test", final=True)
        if run.history:
            run.history[-1] |= {k: v for k, v in run.metrics.items() if k.startswith("validation_")}
        return run, pipe.full_state_dict()
    except training.RUN_ERRORS as error:  # raised on every rank by the runtime
        reason, detail = training.failure(error)
        run.error = f"{reason}\n{detail[-2000:]}"
        return run, {}
    finally:
        if pipe is not None:
            pipe.close()


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
    """Step 4: the model's best seed, with every seed's validation figures beside it."""
    metrics: dict[str, Any] = dict(run.metrics)
    for name in ("chrf", "bleu", "exact_match"):  # the names a translation user looks for
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
        "data": task.describe(),  # the splits' sizes, cleaning, BLEU's sacreBLEU signature
    }
    return export_model(
        _folder(settings, model),
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


# -- in the caller --------------------------------------------------------------------------
def _load_study(settings: NasSettings) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    missing = ValueError(
        f"no study {settings.study.name!r} in {storage_url.masked(settings.storage_url)}; run "
        "the search first (stages=[search])"
    )
    url = settings.storage_url
    for prefix in ("sqlite:///", storage.JOURNAL):  # a file that is not there: no study
        if url.startswith(prefix) and not Path(url[len(prefix) :].split("?")[0]).exists():
            raise missing
    try:
        return optuna.load_study(
            study_name=settings.study.name,
            storage=storage.make_storage(
                settings.storage_url, max_retries=settings.study.max_retries
            ),
        )
    except KeyError as error:
        raise missing from error


def _track(
    settings: NasSettings,
    runs: Sequence[RetrainRun],
    fresh: Sequence[RetrainRun],
    selected: str | None,
    comparison: dict[str, Any],
    exported: dict[str, str],
) -> list[str]:
    """Step 6: a tracker run per (model, seed) not tracked yet (`fresh`: a resumed
    retraining's runs tracked before are not again), in the study's group; the summary holds
    every run's table and `comparison` (the reference and the paired differences). The run
    of the seed a model's export holds logs that folder as a model artifact, and the stored
    study records every export with that run's id (`nas.tracking.exports`)."""
    tracker = study_tracker(settings, study_run=False)
    run_ids: dict[tuple[str, int], str] = {}
    try:
        tracker.start_study(settings.study.name, asdict(settings))
        for index, run in enumerate(fresh):
            config = {
                "job_type": "retrain",
                "run_name": f"retrain-{run.model}-seed-{run.seed}",
                "model": run.model,
                "seed": run.seed,
                "trial": run.trial,
            }
            tracker.start_trial(index, run.params, config)
            if tracker.run_id is not None:
                run_ids[run.model, run.seed] = tracker.run_id
            for entry in run.history:
                tracker.log_step(
                    int(entry["step"]), {k: v for k, v in entry.items() if k != "step"}
                )
            folder = exported.get(run.model)
            if folder is not None and run.error is None and exported_seed(folder) == run.seed:
                name = model_artifact_name(settings.study.name, run.model)
                metadata = export_metadata(folder, model=run.model, params=dict(run.params))
                tracker.log_model(name, folder, metadata)
            summary_ = {
                **run.metrics,
                "parameters": run.parameters,
                "steps": run.steps,
                "samples_per_s": run.samples_per_s,
                "selected": run.model == selected,
            }
            tracker.end_trial(
                TrialEnd.FAILED if run.error else TrialEnd.COMPLETE, summary_, run.error
            )
        rows = model_table(runs, settings.study.fitness)
        tracker.end_study(
            rows,
            [r for r in rows if r["model"] == selected],
            {"selected": selected, "stage": "retrain", **comparison},
        )
    finally:
        tracker.close()
    try:
        study = _load_study(settings)
    except ValueError:  # models retrained without a stored study (a benchmark's)
        study = None
    if study is not None:
        record_exports(study, exported, run_ids)
    return run_directories(tracker)
