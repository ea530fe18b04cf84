"""Step 6 of a retraining, in the caller: every run as a tracker run, every export recorded.

Each (model, training seed) run not tracked yet becomes one tracker run in the study's
group (`job_type="retrain"`) with its step history and final figures; the run of the seed a
model's export holds logs that folder as a model artifact; the study summary holds every
model's table and the comparison with the reference seed model; and the stored study keeps
where each model was exported, with the tracker run that logged it
(`nas.tracking.exports`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from nas.retrain.records import load_study
from nas.retrain.results import RetrainRun, model_table
from nas.settings import NasSettings
from nas.study.tracker_setup import run_directories, study_tracker
from nas.tasks import task_class
from nas.tracking import Tracker, TrialEnd
from nas.tracking.exports import (
    export_metadata,
    exported_seed,
    model_artifact_name,
    record_exports,
)

__all__ = ["track"]


def track(
    settings: NasSettings,
    runs: Sequence[RetrainRun],
    fresh: Sequence[RetrainRun],
    selected: str | None,
    comparison: dict[str, Any],
    exported: dict[str, str],
) -> list[str]:
    """A tracker run per (model, seed) not tracked yet (`fresh`: a resumed retraining's
    runs tracked before are not again), in the study's group; the summary holds every run's
    table and `comparison` (the reference and the paired differences). Returns the run
    folders the tracker wrote (W&B's offline runs, for `wandb sync`)."""
    tracker = study_tracker(settings, study_run=False)
    run_ids: dict[tuple[str, int], str] = {}
    try:
        tracker.start_study(settings.study.name, asdict(settings))
        for index, run in enumerate(fresh):
            run_id = _track_run(tracker, settings, index, run, selected, exported)
            if run_id is not None:
                run_ids[run.model, run.seed] = run_id
        rows = model_table(runs, settings.study.fitness)
        tracker.end_study(
            rows,
            [r for r in rows if r["model"] == selected],
            {"selected": selected, "stage": "retrain", **comparison},
        )
    finally:
        tracker.close()
    try:
        study = load_study(settings)
    except ValueError:  # models retrained without a stored study (a benchmark's)
        study = None
    if study is not None:
        record_exports(study, exported, run_ids)
    return run_directories(tracker)


def _track_run(
    tracker: Tracker,
    settings: NasSettings,
    index: int,
    run: RetrainRun,
    selected: str | None,
    exported: dict[str, str],
) -> str | None:
    """One run as the tracker's run number `index`: its history, its export when it holds
    this seed's weights, its final figures; returns the tracker's run id."""
    config = {
        "job_type": "retrain",
        "run_name": f"retrain-{run.model}-seed-{run.seed}",
        "model": run.model,
        "seed": run.seed,
        "trial": run.trial,
    }
    tracker.start_trial(index, run.params, config)
    run_id = tracker.run_id
    for entry in run.history:
        tracker.log_step(int(entry["step"]), {k: v for k, v in entry.items() if k != "step"})
    folder = exported.get(run.model)
    if folder is not None and run.error is None and exported_seed(folder) == run.seed:
        metadata = export_metadata(
            folder,
            headline_metrics=task_class(settings.task.name).headline_metrics,
            model=run.model,
            params=dict(run.params),
        )
        tracker.log_model(model_artifact_name(settings.study.name, run.model), folder, metadata)
    summary = {
        **run.metrics,
        "parameters": run.parameters,
        "steps": run.steps,
        "samples_per_s": run.samples_per_s,
        "selected": run.model == selected,
    }
    tracker.end_trial(TrialEnd.FAILED if run.error else TrialEnd.COMPLETE, summary, run.error)
    return run_id
