"""Rank 0's progress bars of a study: one for the study's trials, one for the trial's steps.

The study bar counts finished trials toward `study.n_trials` and says when the storage is
out of reach (its calls wait and retry, `nas.storage.retrying`); the trial bar counts the
current trial's steps under its architecture's summary. A worker leaves them to its caller
(`show=False`: bars that draw nothing).
"""

from __future__ import annotations

from nas.progress import progress_bars

__all__ = ["StudyBars"]


class StudyBars:
    """The two bars of one study run (module docstring); `start` draws them, `stop` ends."""

    def __init__(self, name: str, n_trials: int, finished: int, steps: int, *, show: bool) -> None:
        self._progress = progress_bars(show=show)
        self._name = f"study {name}"
        self._steps = steps
        self._study = self._progress.add_task(self._name, total=n_trials, completed=finished)
        self._trial = self._progress.add_task("trial", total=steps)

    def start(self) -> None:
        self._progress.start()

    def stop(self) -> None:
        self._progress.stop()

    def trial_begins(self, number: int, text: str) -> None:
        """The trial bar restarts for trial `number`, its description the summary `text`."""
        self._progress.reset(
            self._trial, total=self._steps, description=f"trial {number}: {text[:60]}"
        )

    def trial_at(self, step: int) -> None:
        self._progress.update(self._trial, completed=step)

    def trial_ends(self) -> None:
        self._progress.advance(self._study)

    def storage_waits(self, message: str | None) -> None:
        """The storage is unreachable (`message`: why its calls wait) or answers again
        (None): the study bar says which."""
        description = f"{self._name}: {message}" if message else self._name
        self._progress.update(self._study, description=description)
