"""Experiment tracking for the NAS harness: where a study's progress is written.

The study loop talks to one `Tracker` (lifecycle in `nas.tracking.base.Tracker`):
`start_study`, then per trial `start_trial`, `log_step`..., `log_event`..., `end_trial`,
then `end_study` and `close`; the retrain stage also logs each exported model in the run
of the seed it exported (`log_model`), and a trial's `run_id` is kept on its Optuna trial
(`TRACKER_RUN_ID`). Trackers:

* "wandb": `nas.tracking.wandb.WandbTracker`, a W&B run per trial grouped by study plus a
  study run with the trials table and the Pareto front; offline by default (`wandb sync`
  later); the only place wandb is imported, lazily.
* "jsonl": `nas.tracking.jsonl.JsonlTracker`, one JSON-lines file per study (a local
  mirror readable with no service).
* "none": `NoneTracker`, nothing.

`make_tracker(name, **options)` builds one by name (the `tracker=` config choice);
`CompositeTracker` fans out to several (W&B and its JSONL mirror); a backend checks the
lifecycle through `nas.tracking.lifecycle.LifecycleTracker`. `nas.tracking.plots` draws a
study's pictures (the report's, and the W&B study run's front). This package imports
without wandb installed: only building a "wandb" tracker needs it.
"""

from __future__ import annotations

from typing import Any

from nas.plugins import is_import_path, load_class
from nas.tracking.base import (
    TRACKER_RUN_ID,
    TRIAL_STATES,
    CompositeTracker,
    Metrics,
    NoneTracker,
    Tracker,
    TrialEnd,
    artifact_name,
    clean_metrics,
    json_safe,
)
from nas.tracking.jsonl import JsonlTracker, read_jsonl
from nas.tracking.pipeline_stats import pipeline_metrics

__all__ = [
    "TRACKERS",
    "TRACKER_RUN_ID",
    "TRIAL_STATES",
    "CompositeTracker",
    "JsonlTracker",
    "Metrics",
    "NoneTracker",
    "Tracker",
    "TrialEnd",
    "artifact_name",
    "clean_metrics",
    "json_safe",
    "make_tracker",
    "pipeline_metrics",
    "read_jsonl",
]

TRACKERS = ("wandb", "jsonl", "none")


def make_tracker(name: str, **options: Any) -> Tracker:
    """The tracker called `name` ("wandb", "jsonl" or "none"), built with `options`.

    "wandb" takes `WandbTracker`'s arguments (project, mode, directory, entity, tags, ...),
    "jsonl" takes `JsonlTracker`'s (directory, fsync), "none" takes none. A user's own
    `Tracker` subclass is named by import path, "package.module:ClassName" (`nas.plugins`).
    """
    if is_import_path(name):
        return load_class("tracker", name, Tracker)(**options)
    if name == "none":
        if options:
            raise TypeError(f"the 'none' tracker takes no options, got {sorted(options)}")
        return NoneTracker()
    if name == "jsonl":
        return JsonlTracker(**options)
    if name == "wandb":
        from nas.tracking.wandb import WandbTracker

        return WandbTracker(**options)
    raise ValueError(f"unknown tracker {name!r}; valid trackers: {', '.join(TRACKERS)}")
