"""Where a trial's seconds go: its training steps, and the fixed costs around them.

Candidates train fast, so what surrounds their steps shows in candidates per hour: the
worker's start-up (the shape chosen, seed models profiled, stage processes started), the
study's calls between two trials (the previous one told, the next one asked), building the
pipeline (compile, plan, reconfigure, weights placed), evaluation and decoding (chrF and
BLEU), checkpoints, the weights a parent keeps for its children, rank 0's decisions
during the trial (each a call to the study, agreed by every rank) and its step records to
the tracker. Each trial records them (`TrialClock.attrs`): `time_s`, the seconds of every
`Phase`, "other" (the rest) and "total", in one attribute (one call to the storage), and
`time_fixed_share`, the share of the total that is not training steps.

How it is counted, numbered:

    1. a trial's clock is active for its whole run on a stage process (`TrialClock.running`);
       code anywhere below it marks what it does with `timed(Phase.X)`, which is free when
       no clock is active (a retraining, a benchmark)
    2. phases nest, and each second goes to the innermost open phase: a checkpoint written
       between two training steps is a checkpoint's, not training's
    3. a phase that learns afterwards that part of its time was another's hands it over
       (`hand_over`): an evaluation's decoding, timed by the task itself
    4. `Phase.BEFORE` is charged from outside the run: the seconds since the worker's
       previous trial ended (its record and this ask), or, for its first trial, since the
       worker started its study (start-up)

Only rank 0's clock is recorded (its outcome is the trial's); the other ranks wait in the
same collectives, so their phases differ little.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

__all__ = [
    "FIXED_SHARE",
    "OTHER",
    "TIME_S",
    "TOTAL",
    "Phase",
    "TrialClock",
    "hand_over",
    "shares",
    "timed",
]

TIME_S = "time_s"  # the trial's attribute: {phase: seconds, "other": ..., "total": ...}
FIXED_SHARE = "time_fixed_share"  # the trial's attribute: the total's share not training
OTHER, TOTAL = "other", "total"


class Phase(enum.StrEnum):
    """What a trial's seconds were spent on (module doc)."""

    BEFORE = "before"  # since the previous trial ended (or the worker started): 4.
    BUILD = "build"  # compile, plan, reconfigure, weights placed or resumed
    TRAIN = "train"  # training steps (and the migrations between them)
    EVALUATE = "evaluate"  # loss and accuracy on the evaluation batches or split
    DECODE = "decode"  # generating and scoring text (chrF, BLEU)
    CHECKPOINT = "checkpoint"  # a run's checkpoint and history written
    WEIGHTS = "weights"  # a trial's weights saved for its children, or read by one
    DECIDE = "decide"  # rank 0's calls to the study (reports, pruning, promotion, controls)
    TRACK = "track"  # rank 0's step records to the tracker (W&B, JSON lines)


_ACTIVE: contextvars.ContextVar[TrialClock | None] = contextvars.ContextVar(
    "trial_clock", default=None
)


class TrialClock:
    """The seconds of one trial by `Phase` (module doc)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self._now = now  # seconds from any origin
        self._spent = dict.fromkeys(Phase, 0.0)
        self._open: list[Phase] = []
        self._mark = 0.0  # when the innermost open phase last began counting
        self._began = 0.0
        self._ended: float | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[TrialClock]:
        """Make this the active clock for the block (1.): the trial's run."""
        self._began = self._mark = self._now()
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)
            self._settle()
            self._ended = self._now()

    def enter(self, phase: Phase) -> None:
        self._settle()
        self._open.append(phase)

    def leave(self, phase: Phase) -> None:
        self._settle()
        if not self._open or self._open[-1] != phase:
            raise RuntimeError(f"phase {phase} left while {self._open} are open")
        self._open.pop()

    def hand_over(self, seconds: float, to: Phase) -> None:
        """Move `seconds` (at most what it holds) of the innermost open phase to `to` (3.)."""
        if not self._open:
            return
        self._settle()
        moved = min(max(seconds, 0.0), self._spent[self._open[-1]])
        self._spent[self._open[-1]] -= moved
        self._spent[to] += moved

    def charge(self, phase: Phase, seconds: float) -> None:
        """Add `seconds` spent outside the run to `phase` (4.)."""
        self._spent[phase] += max(seconds, 0.0)

    def spent(self) -> dict[Phase, float]:
        """Seconds by phase so far."""
        self._settle()
        return dict(self._spent)

    def seconds(self) -> dict[str, float]:
        """Seconds by phase, "other" (the rest) and "total", once its run ended."""
        if self._ended is None:
            raise RuntimeError("the trial's clock is still running")
        spent = self.spent()
        total = self._ended - self._began + spent[Phase.BEFORE]
        other = max(0.0, total - sum(spent.values()))
        return {str(phase): value for phase, value in spent.items()} | {OTHER: other, TOTAL: total}

    def attrs(self) -> dict[str, Any]:
        """What the trial records (module doc), once its run ended."""
        seconds = self.seconds()
        total = seconds[TOTAL]
        fixed = total - seconds[str(Phase.TRAIN)]
        return {TIME_S: seconds, FIXED_SHARE: fixed / total if total > 0 else 0.0}

    def _settle(self) -> None:
        """Charge the time since the last mark to the innermost open phase (2.)."""
        now = self._now()
        if self._open and self._ended is None:
            self._spent[self._open[-1]] += now - self._mark
        self._mark = now


@contextlib.contextmanager
def timed(phase: Phase) -> Iterator[None]:
    """Charge the block to `phase` on the active trial clock, if any (1., 2.)."""
    clock = _ACTIVE.get()
    if clock is None:
        yield
        return
    clock.enter(phase)
    try:
        yield
    finally:
        clock.leave(phase)


def hand_over(seconds: float, to: Phase) -> None:
    """`TrialClock.hand_over` on the active clock, if any (3.)."""
    clock = _ACTIVE.get()
    if clock is not None:
        clock.hand_over(seconds, to)


def shares(records: Iterable[Mapping[str, Any]]) -> tuple[float, dict[str, float]]:
    """Over the trials whose attributes `records` hold a breakdown (`TrialClock.attrs`):
    their total seconds, and each phase's share of it ("other" too), largest first."""
    kept = [r[TIME_S] for r in records if isinstance(r.get(TIME_S), Mapping)]
    total = sum(float(k.get(TOTAL, 0.0)) for k in kept)
    if total <= 0:
        return 0.0, {}
    names = [*(str(phase) for phase in Phase), OTHER]
    spent = {name: sum(float(k.get(name, 0.0)) for k in kept) for name in names}
    ordered = sorted(spent.items(), key=lambda item: -item[1])
    return total, {name: seconds / total for name, seconds in ordered}
