"""The trial rank 0 trains now: the Optuna trial, its heartbeat, and a logging error held.

A trial is RUNNING in the storage from its ask to its tell; its heartbeat thread
(`nas.storage.Heartbeat`) tells peers it is alive meanwhile. Training steps between two
evaluations make no decision, so an error logging one is held here and raised at the next
decision (`check`), as is a heartbeat thread that died: then it reaches every rank.
"""

from __future__ import annotations

from collections.abc import Callable

import optuna

from nas import storage
from nas.errors import LeaderError

__all__ = ["RunningTrial"]


class RunningTrial:
    """One asked trial while it trains: its heartbeat beats from construction to `stop`."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial) -> None:
        self.trial = trial
        self.heartbeat = storage.Heartbeat(study, trial)
        self.heartbeat.start()
        self._held: BaseException | None = None  # an error logging a step, for the next check

    @property
    def number(self) -> int:
        return self.trial.number

    def attempt(self, work: Callable[[], None]) -> None:
        """Run `work` (logging a step) unless an error is held already; hold its error."""
        if self._held is None:
            try:
                work()
            except Exception as error:
                self._held = error

    def check(self) -> None:
        """Raise what went wrong since the last check: the heartbeat's error, or the held
        one as a `LeaderError` (then forgotten)."""
        self.heartbeat.check()
        if self._held is not None:
            error, self._held = self._held, None
            raise LeaderError.of("log a training step", error)

    def stop(self) -> None:
        self.heartbeat.stop()
