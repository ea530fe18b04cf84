"""The retrain stage: the search's best architectures, trained from scratch and exported.

A trial's score is a proxy: a short budget, one training seed, maybe weights inherited from
its parent. Before anyone uses what a study found, its best architectures (and, to compare,
both seed architectures) are trained again from scratch at the full budget with several
training seeds, on the same pipeline runtime, scored on whole splits and exported. It runs
after the search (`stages: [search, retrain]`) or alone against a stored study
(`stages: [retrain]`). In order:

    1. select  (caller)     once the trials of every worker searching the study are told
                            (`nas.study.orphans.settle`: two workers then choose alike;
                            meanwhile the seed models are retrained, judged whatever the
                            search finds), the `retrain.top_k` complete trials with the
                            best fitness, one per network: two trials whose architectures
                            compile to the same network (`identity`) are one model, the
                            better trial's, named
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
    4. export  (rank 0)     each model's best seed by validation fitness (`nas.export.writing`);
                            steps 2 to 4 are `nas.retrain.trainer`'s
    5. compare (caller)     each model against the reference seed model, paired by training
                            seed (`nas.paired`): on the fitness and on the task's headline
                            metrics (`Task.headline_metrics`)
    6. track   (caller)     one tracker run per (model, seed): `job_type="retrain"`, in
                            the study's group, with its step history and final metrics; the
                            study summary holds the comparison (`nas.retrain.track`)

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
import math
from collections.abc import Sequence
from dataclasses import replace

import optuna

import pipeline
from nas.retrain import runs as retrain_runs
from nas.retrain.records import load_study, model_folder, recorded, run_digest
from nas.retrain.results import (
    Model,
    RetrainResult,
    RetrainRun,
    against_seed_models,
    compare,
    headline_objectives,
    model_table,
    paired_metrics,
)
from nas.retrain.track import track
from nas.retrain.trainer import stage_main
from nas.search.fidelity import Fidelity, is_measured
from nas.settings import NasSettings
from nas.study import leading, orphans, shape, shape_trials, workers
from nas.study.space import architecture_of, configured_space, seed_models
from search_spaces.architecture import from_json, functional_key, to_json

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
    study = load_study(settings)
    if "search" in settings.stages:  # peers may be searching it still (module doc, 1.)
        _after_peers(study, settings)
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


def _after_peers(study: optuna.Study, settings: NasSettings) -> None:
    """Step 1's wait: while peers searching the same study still train trials, retrain the
    seed models (judged whatever the search finds), then wait for those trials to end or
    fail (`nas.study.orphans.settle`), so that every worker chooses the same models."""
    running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
    seeds = [m for m in select_models(study, settings) if m.trial is None]
    if running and seeds:
        retrain_models(settings, seeds)
    orphans.settle(study, settings.retrain.claim_wait_s, settings.study.max_retries)


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
        if int(settings.study.workers) > 1:
            return _on_workers(settings, models)
    done, tracked = recorded(settings, models)
    on_each_rank = functools.partial(
        stage_main, settings=settings, models=tuple(models), done=done, show=progress
    )
    results = pipeline.launch(
        on_each_rank,
        settings.pipeline.stage_count,
        threads_per_stage=settings.pipeline.thread_count,
        timeout_s=settings.pipeline.timeout_s,
    )
    runs, exported, trained = results[0] if results[0] is not None else ((), {}, ())
    fitness = settings.study.fitness
    table = model_table(runs, fitness)
    selected = table[0]["model"] if table and math.isfinite(table[0][f"{fitness}_mean"]) else None
    headline = headline_objectives(settings.task.name)
    reference, paired = compare(runs, fitness, headline=headline)
    against = against_seed_models(runs, fitness, headline=headline)
    comparison = {"reference": reference, "vs_reference": paired, "vs_seed_models": against}
    # A run is tracked by the worker that trained it (not by one that read its record), or,
    # recorded but not tracked by an earlier retraining, by the one that finds it so.
    # Under torchrun every rank gets here with rank 0's runs; one of them tracks.
    mine = set(trained) | (done.keys() - tracked)
    fresh = [run for run in runs if (run.model, run.seed) in mine]
    fresh = fresh if pipeline.lead_process() else []
    run_dirs = track(settings, runs, fresh, selected, comparison, exported) if fresh else ()
    by_name = {model.name: model for model in models}
    for run in fresh:
        if run.error is None:
            model = by_name[run.model]
            retrain_runs.mark_tracked(
                model_folder(settings, model), run.seed, run_digest(settings, model)
            )
    return RetrainResult(
        settings.study.name,
        tuple(runs),
        exported,
        selected,
        fitness,
        tuple(run_dirs),
        reference,
        paired,
        against,
    )


def _on_workers(settings: NasSettings, models: Sequence[Model]) -> RetrainResult:
    """Retrain `models` on its `study.workers` local workers (`nas.study.workers`), each run trained
    by one of them. Every worker ends with every run; one worker's result is returned with
    the exports and tracked runs of all."""
    total = len(models) * len(settings.retrain.seeds)
    results = workers.run_workers(
        workers.WorkerJob("retrain", settings, functools.partial(_as_worker, models=tuple(models))),
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
    return len(recorded(settings, models)[0])


def _shaped(settings: NasSettings, models: Sequence[Model]) -> NasSettings:
    """`settings` with its "auto" shape values chosen for `models`: at most one worker per
    run left (one worker: the shape among the predicted best that measures fastest,
    `nas.study.shape_trials`); under torchrun, its processes are the stages of one worker."""
    if pipeline.under_torchrun():
        return shape.resolve_one(settings)[0]
    left = len(models) * len(settings.retrain.seeds) - recorded_runs(settings, models)
    architectures = [from_json(model.architecture) for model in models]
    shaped, choice = shape.resolve(settings, max_workers=max(1, left), architectures=architectures)
    if choice is None or choice.shape.workers != 1:
        return shaped
    # one pipeline on the whole machine: its leading shapes measured, the fastest kept
    steps = left * (settings.retrain.steps or settings.train.steps)
    kept = shape_trials.fastest(settings, choice, architectures[0], steps)[0]
    return shape.with_shape(settings, kept)


def select_models(study: optuna.Study, settings: NasSettings) -> list[Model]:
    """Step 1: the `top_k` best complete trials, one per network (then the seeds); of a
    study at inherited fidelity that promotes, those measured at the full budget (its best
    estimates were measured again: `nas.study.judging`, 4.)."""
    space = configured_space(settings)
    seeds = seed_models(settings, space) if settings.retrain.seed_models else {}
    taken = {identity(to_json(arch)) for arch in seeds.values()}
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    measured = [t for t in complete if is_measured(t)]
    if settings.study.fidelity == Fidelity.INHERITED and settings.study.promote and measured:
        complete = measured
    fitness = settings.study.fitness
    attrs = study.user_attrs  # a leader's later seeds (`nas.study.leading`): its mean ranks
    ranked = sorted(
        complete, key=lambda t: (leading.standing(t, attrs, settings.seed, fitness), t.number)
    )
    chosen: list[Model] = []
    for trial in ranked:
        if len(chosen) == settings.retrain.top_k:
            break
        architecture = architecture_of(trial, settings)
        if identity(architecture) not in taken:
            taken.add(identity(architecture))
            chosen.append(
                Model(f"trial-{trial.number}", trial.number, dict(trial.params), architecture)
            )
    chosen += [
        Model(name, None, space.seed_params(arch), to_json(arch)) for name, arch in seeds.items()
    ]
    return chosen


def identity(architecture: str) -> str:
    """What makes two architectures (JSON) one model: `functional_key`, equal for the same
    network however the branches of its blocks are ordered."""
    return functional_key(from_json(architecture))
