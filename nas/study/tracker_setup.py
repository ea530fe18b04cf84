"""The tracker a study's settings ask for, writing under the run folder.

Both the search (`nas.study.leader`) and the retrain stage (`nas.retrain.stage`) log through
it. The configured tracker (built in or a user's, by import path) gets what the harness
knows where its constructor takes it (`TRACKERS.takes`), unless its options set it: its
`directory` (the run folder's `tracking/`), `study_run`, and the task's metric
`directions`, which decide how its metrics summarise. A tracker whose records live in a
service (`Tracker.mirrored`: W&B) comes with a JSON-lines mirror beside it, whose run ids
are the service's (the one a trial keeps).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nas.settings import NasSettings, direction, task_metrics
from nas.tracking import TRACKERS, CompositeTracker, JsonlTracker, Tracker, make_tracker

__all__ = ["run_directories", "study_tracker"]


def study_tracker(settings: NasSettings, *, study_run: bool = True) -> Tracker:
    """The configured tracker; `study_run=False`: no run of its own for the study (the
    retrain stage's runs join the search's group)."""
    name, options = settings.tracker.name, dict(settings.tracker.options)
    directory = str(Path(settings.output_dir) / "tracking")
    given: dict[str, Any] = {"directory": directory, "study_run": study_run}
    if TRACKERS.takes(name, "directions"):
        given["directions"] = {m: direction(m) for m in task_metrics(settings.task.name)}
    for option, value in given.items():
        if TRACKERS.takes(name, option):
            options.setdefault(option, value)
    tracker = make_tracker(name, **options)
    if not tracker.mirrored:
        return tracker
    return CompositeTracker([JsonlTracker(directory), tracker], primary=1)


def run_directories(tracker: Tracker) -> list[str]:
    """The run folders `tracker` (or the trackers it fans out to) wrote: W&B's offline runs,
    for `wandb sync`."""
    trackers = getattr(tracker, "trackers", [tracker])
    return [str(d) for t in trackers for d in getattr(t, "run_directories", [])]
