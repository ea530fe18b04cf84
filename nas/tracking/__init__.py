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
from pipeline.pure.registry import Registry

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

# Every tracker by name ("wandb" by import path: wandb is imported only when one is built);
# a user's `Tracker` subclass is found by import path as well.
TRACKERS: Registry[type[Tracker]] = Registry(
    "tracker",
    {"wandb": "nas.tracking.wandb:WandbTracker", "jsonl": JsonlTracker, "none": NoneTracker},
    base=Tracker,
)


def make_tracker(name: str, **options: Any) -> Tracker:
    """The tracker called `name` (`TRACKERS`), built with `options`.

    "wandb" takes `WandbTracker`'s arguments (project, mode, directory, entity, tags, ...),
    "jsonl" takes `JsonlTracker`'s (directory, fsync), "none" takes none. A user's own
    `Tracker` subclass is named by import path, "package.module:ClassName".
    """
    tracker: Tracker = TRACKERS.build(name, **options)
    return tracker
