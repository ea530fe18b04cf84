"""The tracker interface: what the study loop tells a logger, and in which order.

The harness reports a study to any number of loggers (W&B, a local JSON-lines mirror, none)
through one small interface, so the study loop never names a logging library and
`tracker=none` costs nothing. `Tracker` does nothing by default (a subclass overrides what
it needs, as torchtitan's loggers do); `NoneTracker` is that default; `CompositeTracker`
fans every call out to several trackers.

Also here, because every tracker needs them: `json_safe` (plain JSON values: tuples as
lists, NaN and infinities as None), `clean_metrics` (the checked form of one step's
metrics) and `pipeline_metrics` (a `PipelineStats.to_dict()` flattened into step metrics).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from types import TracebackType
from typing import Any

from pipeline.distributed.events import plain as json_safe  # one converter for both

__all__ = [
    "TRIAL_STATES",
    "CompositeTracker",
    "LifecycleTracker",
    "Metrics",
    "NoneTracker",
    "Tracker",
    "check_state",
    "check_step",
    "clean_metrics",
    "json_safe",
    "pipeline_metrics",
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


class Tracker:
    """Receives a study's progress. Every method does nothing here; subclasses override.

    Lifecycle (one tracker object per study; the study loop calls, in this order)::

        start_study(study_name, config)
            start_trial(trial_number, params, config)      # once per trial, then:
                log_step(step, metrics)                    # any number, steps increasing
                log_event(step, event)                     # any number (pipeline events)
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
    """

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

    def end_trial(
        self, state: TrialEnd | str, summary: Mapping[str, Any], error: str | None = None
    ) -> None:
        """The current trial ended: complete, pruned or failed (with its cause)."""

    def end_study(
        self,
        trials_table: Sequence[Mapping[str, Any]],
        pareto_front: Sequence[Mapping[str, Any]],
        summary: Mapping[str, Any],
    ) -> None:
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


class LifecycleTracker(Tracker):
    """A tracker that checks the lifecycle (the class doc of `Tracker`) for its subclass.

    The public methods refuse a call out of order (a trial before its study, a step outside
    a trial, a second study while one runs, anything after `close`) and a malformed value (a
    trial number that is not an int, a bad step or state), naming the tracker; then they call
    the subclass's hook, which only writes: `_on_start_study`, `_on_start_trial`,
    `_on_step`, `_on_event`, `_on_end_trial`, `_on_end_study`, `_on_close`. `_study` and
    `_trial` hold the open study's name and trial number (set before the start hooks run,
    cleared after the end hooks, even when a hook raises).
    """

    _study: str | None = None
    _trial: int | None = None
    _closed: bool = False

    def _on_start_study(self, study_name: str, config: Mapping[str, Any]) -> None: ...

    def _on_start_trial(
        self, number: int, params: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None: ...

    def _on_step(self, step: int, metrics: Metrics) -> None: ...

    def _on_event(self, step: int, event: Mapping[str, Any]) -> None: ...

    def _on_end_trial(
        self, state: TrialEnd, summary: Mapping[str, Any], error: str | None
    ) -> None: ...

    def _on_end_study(
        self,
        trials_table: Sequence[Mapping[str, Any]],
        pareto_front: Sequence[Mapping[str, Any]],
        summary: Mapping[str, Any],
    ) -> None: ...

    def _on_close(self) -> None: ...

    def _refuse(self, what: str) -> RuntimeError:
        return RuntimeError(f"{type(self).__name__}: {what}")

    def _require_trial(self, what: str) -> int:
        if self._trial is None:
            raise self._refuse(f"{what} outside a trial (call start_trial first)")
        return self._trial

    def start_study(self, study_name: str, config: Mapping[str, Any]) -> None:
        if self._closed:
            raise self._refuse("start_study after close")
        if self._study is not None:
            raise self._refuse(f"study {self._study!r} is still running")
        if not isinstance(study_name, str) or not study_name.strip():
            raise ValueError(f"a study name must be a non-empty string, got {study_name!r}")
        self._study = study_name
        try:
            self._on_start_study(study_name, config)
        except BaseException:
            self._study = None
            raise

    def start_trial(
        self, trial_number: int, params: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        if self._study is None:
            raise self._refuse("start_trial before start_study")
        if self._trial is not None:
            raise self._refuse(f"trial {self._trial} has not ended")
        if isinstance(trial_number, bool) or not isinstance(trial_number, int):
            raise TypeError(f"trial_number must be an int, got {trial_number!r}")
        self._trial = trial_number
        try:
            self._on_start_trial(trial_number, params, config)
        except BaseException:
            self._trial = None
            raise

    def log_step(self, step: int, metrics: Metrics) -> None:
        self._require_trial("log_step")
        check_step(step)
        self._on_step(step, metrics)

    def log_event(self, step: int, event: Mapping[str, Any]) -> None:
        self._require_trial("log_event")
        check_step(step)
        self._on_event(step, event)

    def end_trial(
        self, state: TrialEnd | str, summary: Mapping[str, Any], error: str | None = None
    ) -> None:
        self._require_trial("end_trial")
        state = check_state(state)
        try:
            self._on_end_trial(state, summary, error)
        finally:
            self._trial = None

    def end_study(
        self,
        trials_table: Sequence[Mapping[str, Any]],
        pareto_front: Sequence[Mapping[str, Any]],
        summary: Mapping[str, Any],
    ) -> None:
        if self._study is None:
            raise self._refuse("end_study before start_study")
        if self._trial is not None:
            raise self._refuse(f"end_study while trial {self._trial} is open")
        try:
            self._on_end_study(trials_table, pareto_front, summary)
        finally:
            self._study = None

    def close(self) -> None:
        """End an open trial as failed and release everything. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._trial is not None:
                self.end_trial(TrialEnd.FAILED, {}, "the tracker was closed before the trial ended")
        finally:
            self._on_close()
            self._study = None


class NoneTracker(Tracker):
    """Tracks nothing (`tracker=none`): every call returns at once."""


class CompositeTracker(Tracker):
    """Fans every call out to several trackers, in order.

    A tracker that raises does not stop the others: every tracker gets the call, then the
    first exception is raised again (the later ones attached to it as notes).
    """

    def __init__(self, trackers: Sequence[Tracker]) -> None:
        self.trackers: tuple[Tracker, ...] = tuple(trackers)
        for tracker in self.trackers:
            if not isinstance(tracker, Tracker):
                raise TypeError(f"CompositeTracker takes Tracker objects, got {tracker!r}")

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

    def end_trial(
        self, state: TrialEnd | str, summary: Mapping[str, Any], error: str | None = None
    ) -> None:
        self._each("end_trial", state, summary, error)

    def end_study(
        self,
        trials_table: Sequence[Mapping[str, Any]],
        pareto_front: Sequence[Mapping[str, Any]],
        summary: Mapping[str, Any],
    ) -> None:
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
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative int, got {step!r}")


# -- the runtime's statistics as step metrics ----------------------------------------------------
_TOP = (
    "samples_per_s",
    "tokens_per_s",
    "iteration_s",
    "predicted_iteration_s",
    "bubble_fraction",
    "predicted_bubble_fraction",
    "plan_version",
    "generation",
)
_STAGE = (
    "forward_s",
    "backward_s",
    "wait_s",
    "optimizer_s",
    "total_s",
    "param_bytes",
    "state_bytes",
    "activation_peak_bytes",
    "measured_peak_bytes",
    "predicted_peak_bytes",
    "predicted_compute_s",
    "allocator_peak_bytes",
    "process_peak_bytes",
)


def pipeline_metrics(stats: Mapping[str, Any]) -> dict[str, float | int | None]:
    """A `PipelineStats.to_dict()` flattened into step metrics.

    Keys: the pipeline's figures by their own names (`tokens_per_s`, `samples_per_s`,
    `iteration_s`, `bubble_fraction`, their `predicted_*` twins, `plan_version`,
    `generation`), `peak_bytes` (the largest stage's measured peak), per stage
    `stage{i}/<field>` (times, bytes, `stage{i}/layers` = its number of layers), and
    `migrations/count`, `migrations/bytes_moved`, `migrations/pause_s` (totals so far).
    Values the runtime reports as None (no plan, no token ids) stay None.
    """
    out: dict[str, float | int | None] = {key: stats.get(key) for key in _TOP if key in stats}
    stages = stats.get("stages") or []
    peaks: list[int] = []
    for stage in stages:
        index = stage.get("stage", len(peaks))
        for key in _STAGE:
            if key in stage:
                out[f"stage{index}/{key}"] = stage[key]
        out[f"stage{index}/layers"] = len(stage.get("layers") or ())
        if isinstance(stage.get("measured_peak_bytes"), int):
            peaks.append(stage["measured_peak_bytes"])
    if stages:
        out["peak_bytes"] = max(peaks) if peaks else None
    migrations = stats.get("migrations")
    if migrations is not None:
        out["migrations/count"] = len(migrations)
        out["migrations/bytes_moved"] = sum(int(m.get("bytes_moved") or 0) for m in migrations)
        out["migrations/pause_s"] = sum(float(m.get("pause_s") or 0.0) for m in migrations)
    return out
