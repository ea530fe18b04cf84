"""The tracker a study's settings ask for, writing under the run folder.

Both the search (`nas.study.leader`) and the retrain stage (`nas.retrain.stage`) log through it: W&B
comes with its JSON-lines mirror beside it (W&B's run id is the one a trial keeps); it is
told the task's metric directions, which decide how its metrics summarise. A user's own
class (by import path) gets its options as they are.
"""

from __future__ import annotations

from pathlib import Path

from nas.settings import NasSettings, direction, task_metrics
from nas.tracking import CompositeTracker, Tracker, make_tracker

__all__ = ["run_directories", "study_tracker"]


def study_tracker(settings: NasSettings, *, study_run: bool = True) -> Tracker:
    """The configured tracker; `study_run=False`: no W&B run of its own for the study
    (the retrain stage's runs join the search's group)."""
    name, options = settings.tracker.name, dict(settings.tracker.options)
    directory = str(Path(settings.output_dir) / "tracking")
    if name == "wandb":
        directions = {metric: direction(metric) for metric in task_metrics(settings.task.name)}
        defaults = {"directory": directory, "study_run": study_run, "directions": directions}
        return CompositeTracker(
            [
                make_tracker("jsonl", directory=directory),
                make_tracker("wandb", **defaults | options),
            ],
            primary=1,
        )
    if name == "jsonl":
        options.setdefault("directory", directory)
    return make_tracker(name, **options)


def run_directories(tracker: Tracker) -> list[str]:
    """The run folders `tracker` (or the trackers it fans out to) wrote: W&B's offline runs,
    for `wandb sync`."""
    trackers = getattr(tracker, "trackers", [tracker])
    return [str(d) for t in trackers for d in getattr(t, "run_directories", [])]
