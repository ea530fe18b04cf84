"""The checked lifecycle of a tracker that writes somewhere: what the study loop may call when.

A backend (W&B, the JSON-lines mirror, a user's own) should not each re-check that a trial
starts inside a study, that steps come inside a trial, that a state or a model name is one
it can take: `LifecycleTracker` checks the order and the values of every call of the
`nas.tracking.base.Tracker` lifecycle once, and hands its subclass's hooks only calls that
are in order and well formed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nas.tracking.base import (
    ARTIFACT_NAME_MAX,
    Metrics,
    Rows,
    Summary,
    Tracker,
    TrialEnd,
    artifact_name,
    check_state,
    check_step,
)
from pipeline.pure.checks import is_int

__all__ = ["LifecycleTracker"]


class LifecycleTracker(Tracker):
    """A tracker that checks the lifecycle (the class doc of `Tracker`) for its subclass.

    The public methods refuse a call out of order (a trial before its study, a step outside
    a trial, a second study while one runs, anything after `close`) and a malformed value (a
    trial number that is not an int, a bad step or state, a model name a backend refuses, a
    model folder that is not there), naming the tracker; then they call the subclass's hook,
    which only writes: `_on_start_study`, `_on_start_trial`, `_on_step`, `_on_event`,
    `_on_model`, `_on_end_trial`, `_on_end_study`, `_on_close`. `_study` and
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

    def _on_model(self, name: str, folder: Path, metadata: Mapping[str, Any]) -> None: ...

    def _on_end_trial(self, state: TrialEnd, summary: Summary, error: str | None) -> None: ...

    def _on_end_study(self, trials_table: Rows, pareto_front: Rows, summary: Summary) -> None: ...

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
        if not is_int(trial_number):
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

    def log_model(self, name: str, folder: str | Path, metadata: Mapping[str, Any]) -> None:
        self._require_trial("log_model")
        if not isinstance(name, str) or not name or artifact_name(name) != name:
            raise ValueError(
                f"a model name must be 1 to {ARTIFACT_NAME_MAX} letters, digits, '.', '_' or "
                f"'-', got {name!r} (artifact_name makes one)"
            )
        path = Path(folder)
        if not path.is_dir():
            raise NotADirectoryError(f"a model is logged from its folder; {path} is not one")
        if not isinstance(metadata, Mapping):
            raise TypeError(f"a model's metadata must be a mapping, got {metadata!r}")
        self._on_model(name, path, metadata)

    def end_trial(self, state: TrialEnd | str, summary: Summary, error: str | None = None) -> None:
        self._require_trial("end_trial")
        state = check_state(state)
        try:
            self._on_end_trial(state, summary, error)
        finally:
            self._trial = None

    def end_study(self, trials_table: Rows, pareto_front: Rows, summary: Summary) -> None:
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
