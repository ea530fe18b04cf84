"""The jobs of a `pipeline.distributed.pool.StagePool`: asked for, then running, then settled.

The pool's thread keeps one `Running` per job it lent processes to, and fills it from the
processes' reports ("ok" with a result and what it kept, "released" from a leaver, "error"
with a traceback, or a death the pool saw): the job succeeds when every member reported
"ok", and fails with the first cause (`Running.first_cause`) once it failed and its other
processes had their moment to report.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from pipeline.distributed.pool_member import Kept, PoolContext
from pipeline.distributed.processes import PEER_FAILURE
from pipeline.errors import StageFailedError
from pipeline.pure.checks import is_int
from pipeline.pure.pool import Lending, Residency

__all__ = ["Job", "Request", "Running"]

logger = logging.getLogger(__name__)
Job = Callable[[PoolContext], Any]


@dataclass
class Request:
    """A job as it was submitted: what runs, on how many stages (the counts it can run on,
    preferred first), what it takes and keeps."""

    fn: Job
    n_stages: tuple[int, ...]
    take: str | None
    keep: str | None
    future: Future[list[Any]] = field(default_factory=Future)

    @classmethod
    def checked(
        cls,
        fn: Job,
        n_stages: int | Sequence[int],
        take: str | None,
        keep: str | None,
        pool_size: int,
    ) -> Request:
        """`StagePool.submit`'s arguments as a request, or the error that names the bad one:
        each count 1..`pool_size` (distinct, at least one), names non-empty, `fn` pickles."""
        counts: tuple[Any, ...] = (n_stages,)
        if isinstance(n_stages, Sequence) and not isinstance(n_stages, str):
            counts = tuple(n_stages)
        valid = f"a job of this pool runs on 1 to {pool_size} processes"
        if not counts or len(set(counts)) < len(counts):
            raise ValueError(f"n_stages={n_stages!r}: give a count, or distinct counts; {valid}")
        for count in counts:
            if not is_int(count) or not 1 <= count <= pool_size:
                raise ValueError(f"n_stages={count!r}: {valid}")
        for name, value in (("take", take), ("keep", keep)):
            if value is not None and not (isinstance(value, str) and value):
                raise ValueError(f"{name}={value!r}: a resident model's name is a non-empty str")
        try:
            pickle.dumps(fn)
        except Exception as error:
            raise TypeError(
                f"fn must pickle to reach the pool's processes (a module-level function or a "
                f"functools.partial of one), got {fn!r}: {error}"
            ) from error
        return cls(fn, counts, take, keep)


@dataclass
class Running:
    """A job lent its processes: what they reported so far."""

    request: Request
    lending: Lending
    results: dict[int, Any] = field(default_factory=dict)  # rank -> result
    kept: dict[int, Kept | None] = field(default_factory=dict)  # member -> what it kept
    done: set[int] = field(default_factory=set)  # processes that ended their part cleanly
    errors: dict[int, str] = field(default_factory=dict)  # process -> traceback
    failed_at: float | None = None

    @property
    def processes(self) -> tuple[int, ...]:
        return self.lending.members + self.lending.leavers

    def failed(self, process: int, detail: str) -> None:
        self.errors.setdefault(process, detail)
        self.failed_at = self.failed_at or time.monotonic()

    def outstanding(self) -> list[int]:
        """Processes that have neither ended their part nor failed."""
        return [p for p in self.processes if p not in self.done and p not in self.errors]

    def first_cause(self) -> StageFailedError:
        """The error that failed the job: a death without a report first, then an error
        that is not a peer's broken connection or timeout, then any (by rank)."""
        ranked = sorted(self.errors.items(), key=lambda item: self._rank(item[0]))
        dead = [item for item in ranked if "without a report" in item[1]]
        primary = [item for item in ranked if not any(m in item[1] for m in PEER_FAILURE)]
        process, detail = (dead or primary or ranked)[0]
        return StageFailedError(self._rank(process), detail)

    def kept_model(self) -> Residency | None:
        """The model the job kept, if every member kept its part and together they hold it."""
        name, members = self.request.keep, self.lending.members
        parts = [self.kept.get(p) for p in members]
        if name is None or not parts or any(part is None for part in parts):
            return None
        holder: dict[str, int] = {}
        keys: tuple[str, ...] = ()
        for p, part in zip(members, parts, strict=True):
            assert part is not None
            keys = part.keys
            holder.update((key, p) for key in part.held)
        if set(holder) != set(keys):
            logger.warning(
                "job %d kept %r without every layer: not resident", self.lending.job, name
            )
            return None
        return Residency(name, keys, tuple(holder[k] for k in keys))

    def _rank(self, process: int) -> int:
        members = self.lending.members
        return members.index(process) if process in members else len(members)
