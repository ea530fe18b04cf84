"""What each training step measured, kept for `ElasticPipeline.stats()` in bounded memory.

A study trains for thousands of steps, and a stream (`train(batches)`) has no end the
pipeline knows of, so nothing here may grow with the number of steps: the last `keep`
steps are held in full (the medians of `stats(last_steps)` read them), and what `stats`
reports over the whole run (the memory peaks) is folded into running maxima as each step
is recorded.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from pipeline.local.inflight import StepTimes
from pipeline.pure.checks import is_int

__all__ = ["KEEP_STEPS", "StepHistory", "StepRecord"]

KEEP_STEPS = 1000  # steps held in full: `stats(last_steps)` reads at most this many


@dataclass(frozen=True)
class StepRecord:
    """One step on this stage: its batch's size and where the stage's time went."""

    samples: int
    tokens: int | None  # None: the batch is not a token batch
    times: StepTimes


class StepHistory:
    """The last `keep` steps' records, and running peaks over every step recorded."""

    def __init__(self, keep: int = KEEP_STEPS) -> None:
        if not is_int(keep) or keep < 1:
            raise ValueError(f"keep must be a positive int, got {keep!r}")
        self._recent: collections.deque[StepRecord] = collections.deque(maxlen=keep)
        self._steps = 0
        self._latest_activation_bytes = 0
        self._latest_allocator_bytes = 0
        self._peak_allocator_bytes = 0

    def record(self, samples: int, tokens: int | None, times: StepTimes) -> None:
        """Add one step (O(1) memory: the oldest full record drops out past `keep`)."""
        self._recent.append(StepRecord(samples, tokens, times))
        self._steps += 1
        if times.peak_activation_bytes:
            self._latest_activation_bytes = times.peak_activation_bytes
        if times.allocator_peak_bytes:
            self._latest_allocator_bytes = times.allocator_peak_bytes
            self._peak_allocator_bytes = max(self._peak_allocator_bytes, times.allocator_peak_bytes)

    def recent(self, n: int) -> list[StepRecord]:
        """The last `n` steps' records (fewer if fewer were recorded or kept)."""
        return list(self._recent)[-n:] if n > 0 else []

    @property
    def steps(self) -> int:
        """How many steps were recorded in all."""
        return self._steps

    @property
    def held(self) -> int:
        """How many full records are held (at most `keep`): for monitoring."""
        return len(self._recent)

    @property
    def latest_activation_bytes(self) -> int:
        """The in-flight activation peak of the latest step that measured it (0: none).

        Steps measure it while the pipeline's layout is new (a flushed schedule's first
        steps after a build or migration, a stream segment's first steps, which reach its
        in-flight peak): the figure belongs to the layout in force."""
        return self._latest_activation_bytes

    @property
    def latest_allocator_bytes(self) -> int | None:
        """GPU: the allocator's peak in the latest measured step; None on CPU."""
        return self._latest_allocator_bytes or None

    @property
    def peak_allocator_bytes(self) -> int | None:
        """GPU: the allocator's largest peak over every measured step; None on CPU."""
        return self._peak_allocator_bytes or None
