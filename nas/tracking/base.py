"""The tracker interface: what the study loop tells a logger, and in which order.

The harness reports a study to any number of loggers (W&B, a local JSON-lines mirror, none)
through one small interface, so the study loop never names a logging library and
`tracker=none` costs nothing. `Tracker` does nothing by default (a subclass overrides what
it needs, as torchtitan's loggers do); `NoneTracker` is that default; `CompositeTracker`
fans every call out to several trackers. A backend checks the call order through
`nas.tracking.lifecycle.LifecycleTracker`.

Also here, because every tracker needs them: `json_safe` (plain JSON values: tuples as
lists, NaN and infinities as None), `clean_metrics` (the checked form of one step's
metrics) and `artifact_name` (a model's name as every backend takes it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from pipeline.distributed.events import plain as json_safe  # one converter for both
from pipeline.pure.checks import is_int

__all__ = [
    "ARTIFACT_NAME_MAX",
    "TRACKER_RUN_ID",
    "TRIAL_STATES",
    "CompositeTracker",
    "Metrics",
    "NoneTracker",
    "Rows",
    "Summary",
    "Tracker",
    "artifact_name",
    "check_state",
    "check_step",
    "clean_metrics",
    "json_safe",
]


class TrialEnd(StrEnum):
    """How a trial ended, as the study tells Optuna and the trackers record it (a `str`, so
    a tracker may compare it with the text)."""

    COMPLETE = "complete"
    PRUNED = "pruned"
    FAILED = "failed"


TRIAL_STATES: tuple[TrialEnd, ...] = tuple(TrialEnd)

# One step's metrics as the study loop hands them over; None = not measured at this step.
Metrics = Mapping[str, float | int | None]
# A summary (of a trial, a study) and one row of a table (a trial's): names to values.
Summary = Mapping[str, Any]
Rows = Sequence[Mapping[str, Any]]

# The Optuna user attribute that holds a trial's tracker run id (`Tracker.run_id`).
TRACKER_RUN_ID = "tracker_run_id"
ARTIFACT_NAME_MAX = 128  # W&B's limit on an artifact name


class Tracker:
    """Receives a study's progress. Every method does nothing here; subclasses override.

    Lifecycle (one tracker object per study; the study loop calls, in this order)::

        start_study(study_name, config)
            start_trial(trial_number, params, config)      # once per trial, then:
                log_step(step, metrics)                    # any number, steps increasing
                log_event(step, event)                     # any number (pipeline events)
                log_model(name, folder, metadata)          # any number (exported models)
            end_trial(state, summary, error)               # exactly once per started trial
            ...                                            # the next trial
        end_study(trials_table, pareto_front, summary)
        close()                                            # always (also after a crash)

    * `config` of `start_study`: the study's resolved configuration (plain values).
    * `config` of `start_trial`: what identifies the trial: the architecture as JSON, its
      one-line summary, the trial number and the sampled parameters (plain values). A run
      that is not a search trial says so: `job_type` ("retrain") and `run_name`
      ("retrain-trial-7-seed-1"); the trial number is then the run's index.
    * `metrics` of `log_step`: numbers keyed by name: loss, validation metric, tokens/s,
      per-stage time and memory, bubble fraction, migration bytes and pause
      (`pipeline_metrics` flattens a `PipelineStats.to_dict()` into these). A None value
      means "not measured at this step" and is left out by every tracker; NaN and
      infinities are kept where the backend can hold them (W&B) and become None where it
      cannot (JSON). One call per step; steps must increase within a trial.
    * `event` of `log_event`: a `PipelineEvent.to_dict()` (builds, migrations, rollbacks,
      errors), kept apart from the step metrics.
    * `log_model`: an exported model's folder (`nas.export.writing`) as an output of the open run
      (a W&B artifact of type "model"), named `name` (`artifact_name` makes one), with
      `metadata` (plain values: parameters, validation figures, the trial number).
    * `run_id`: the id of the open trial's run in the backend (W&B's run id; the JSONL
      mirror's `<study>/<run name>`), None outside a trial or where the backend has none;
      the search stores it on the Optuna trial (`TRACKER_RUN_ID`).
    * `state` of `end_trial`: one of `TRIAL_STATES` ("complete", "pruned", "failed"; Optuna's
      names "COMPLETE", "PRUNED", "FAIL" are accepted, see `check_state`);
      `summary`: the trial's final figures (objective values, throughput, peak memory,
      parameter count, ...); `error`: the failure cause of a failed trial (else None).
    * `end_study`: the table of every trial (one dict per trial, the same keys in each
      where possible), the Pareto front (the rows of the best trials), and a summary
      (best values; `summary["objectives"]`, when it names two columns of the trials
      table, lets a tracker draw the front).
    * `close`: releases files and processes; a trial still open is ended as failed.
      Idempotent. A tracker is also a context manager that closes on exit.

    `mirrored`: a tracker whose records live in a service (W&B) is given a JSON-lines mirror
    beside it by the harness (`nas.study.tracker_setup`), readable with no service.
    `preload`: the modules its runs import in each process that opens one (a backend's
    package); the harness has the stage processes' server import them once, before it
    forks the processes (`pipeline.distributed.server.prestart`).
    """

    mirrored: ClassVar[bool] = False
    preload: ClassVar[tuple[str, ...]] = ()

    def start_study(self, study_name: str, config: Mapping[str, Any]) -> None:
        """A study begins (or resumes): its name and resolved configuration."""

    def start_trial(
        self, trial_number: int, params: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        """A trial begins: its number, sampled parameters and identifying configuration."""

    def log_step(self, step: int, metrics: Metrics) -> None:
        """One training step's metrics (see the class doc for what None and NaN mean)."""

    def log_event(self, step: int, event: Mapping[str, Any]) -> None:
        """One pipeline event (a `PipelineEvent.to_dict()`) at `step` of the current trial."""

    def log_model(self, name: str, folder: str | Path, metadata: Mapping[str, Any]) -> None:
        """An exported model's folder as an output of the current trial's run."""

    @property
    def run_id(self) -> str | None:
        """The id of the open trial's run in the backend; None outside a trial or here."""
        return None

    def end_trial(self, state: TrialEnd | str, summary: Summary, error: str | None = None) -> None:
        """The current trial ended: complete, pruned or failed (with its cause)."""

    def end_study(self, trials_table: Rows, pareto_front: Rows, summary: Summary) -> None:
        """The study ended: every trial's row, the Pareto front's rows, and a summary."""

    def close(self) -> None:
        """Release everything; a trial still open ends as failed. Safe to call twice."""

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class NoneTracker(Tracker):
    """Tracks nothing (`tracker=none`): every call returns at once."""


class CompositeTracker(Tracker):
    """Fans every call out to several trackers, in order.

    A tracker that raises does not stop the others: every tracker gets the call, then the
    first exception is raised again (the later ones attached to it as notes). `run_id` is
    the one of `trackers[primary]` (the service a run id names: W&B, not its JSONL mirror).
    """

    def __init__(self, trackers: Sequence[Tracker], *, primary: int = 0) -> None:
        self.trackers: tuple[Tracker, ...] = tuple(trackers)
        for tracker in self.trackers:
            if not isinstance(tracker, Tracker):
                raise TypeError(f"CompositeTracker takes Tracker objects, got {tracker!r}")
        count = len(self.trackers)
        if (
            isinstance(primary, bool)
            or not isinstance(primary, int)
            or not -count <= primary < max(count, 1)
        ):
            raise ValueError(f"primary={primary!r} is not an index of the {count} trackers")
        self.primary = primary

    def _each(self, method: str, *args: Any) -> None:
        errors: list[BaseException] = []
        for tracker in self.trackers:
            try:
                getattr(tracker, method)(*args)
            except Exception as error:
                errors.append(error)
        if errors:
            first = errors[0]
            for other in errors[1:]:
                first.add_note(f"also raised by another tracker: {other!r}")
            raise first

    def start_study(self, study_name: str, config: Mapping[str, Any]) -> None:
        self._each("start_study", study_name, config)

    def start_trial(
        self, trial_number: int, params: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        self._each("start_trial", trial_number, params, config)

    def log_step(self, step: int, metrics: Metrics) -> None:
        self._each("log_step", step, metrics)

    def log_event(self, step: int, event: Mapping[str, Any]) -> None:
        self._each("log_event", step, event)

    def log_model(self, name: str, folder: str | Path, metadata: Mapping[str, Any]) -> None:
        self._each("log_model", name, folder, metadata)

    @property
    def run_id(self) -> str | None:
        """The primary tracker's run id, else the first other tracker's that has one."""
        if not self.trackers:
            return None
        ordered = (self.trackers[self.primary], *self.trackers)
        return next((i for t in ordered if (i := t.run_id) is not None), None)

    def end_trial(self, state: TrialEnd | str, summary: Summary, error: str | None = None) -> None:
        self._each("end_trial", state, summary, error)

    def end_study(self, trials_table: Rows, pareto_front: Rows, summary: Summary) -> None:
        self._each("end_study", trials_table, pareto_front, summary)

    def close(self) -> None:
        self._each("close")


# -- values ------------------------------------------------------------------------------------
def _number(value: Any) -> float | int | None:
    """A metric value as a Python number; None stays None; anything else is an error."""
    if value is None or isinstance(value, bool):
        return value if value is None else int(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):  # also numpy.float64, a float subclass
        return float(value)
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            out = item()
        except (ValueError, RuntimeError):  # more than one element
            out = None
        if isinstance(out, int | float) and not isinstance(out, bool):
            return out
        if isinstance(out, bool):
            return int(out)
    raise TypeError(f"a metric must be a number or None, got {value!r}")


def clean_metrics(metrics: Metrics) -> dict[str, float | int]:
    """One step's metrics checked: string keys, numbers (numpy/torch scalars converted,
    booleans as 0/1), None values left out; NaN and infinities kept."""
    if not isinstance(metrics, Mapping):
        raise TypeError(f"metrics must be a mapping of name to number, got {metrics!r}")
    out: dict[str, float | int] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"a metric name must be a non-empty string, got {key!r}")
        try:
            number = _number(value)
        except TypeError as error:
            raise TypeError(f"metric {key!r}: {error}") from None
        if number is not None:
            out[key] = number
    return out


def artifact_name(text: str) -> str:
    """`text` as a model's (artifact's) name every backend takes: each run of characters
    other than letters, digits, '.', '_' and '-' becomes one '-', at most
    `ARTIFACT_NAME_MAX` characters (W&B's rule), e.g. "study 1/trial-3" -> "study-1-trial-3"."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-")[:ARTIFACT_NAME_MAX].strip("-")
    if not name:
        raise ValueError(f"no artifact name can be made from {text!r}: it has no letter or digit")
    return name


_STATE_ALIASES = {"fail": "failed"}  # Optuna's TrialState.FAIL


def check_state(state: TrialEnd | str) -> TrialEnd:
    """A trial's end state as one of `TRIAL_STATES`. Optuna's `TrialState` names are taken
    too, in any case ("COMPLETE", "PRUNED", "FAIL" -> "failed"); anything else is an error."""
    name = state.lower() if isinstance(state, str) else state
    name = _STATE_ALIASES.get(name, name)
    if name not in set(TRIAL_STATES):
        raise ValueError(f"unknown trial state {state!r}; valid states: {', '.join(TRIAL_STATES)}")
    return TrialEnd(name)


def check_step(step: int) -> None:
    """A step is a non-negative int."""
    if not is_int(step) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")
