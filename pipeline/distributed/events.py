"""The pipeline's event log as typed records: what happened, at which step of which model.

Loose dicts would make every caller know the key names, and loggers would get tuples and
dataclasses that JSON does not take. A `PipelineEvent` names the
fields every event has (generation, step, kind) and keeps what is particular to its kind in
`details`; `to_dict()` turns it into plain JSON values for a logger (W&B, a JSON-lines file).

Kinds, and what `details` holds for each:

    schedule     schedule="auto" chose one (`choose_schedule`): chosen, candidates (each
                 schedule's stage count, predicted iteration, or why it was left out)
    tryout       the plans the cost model could not rank, tried on the first steps or at
                 the first correction (`pipeline.distributed.tryout`): kept (the schedule
                 kept, None when it begins), tried (each one's schedule, sizes, predicted,
                 corrected and measured iteration)
    switch       the model went on under another plan (`switch_plan`): plan
    build        a stage was built: sizes, plan (a `Plan.to_dict()`, or None)
    handoff      Bi-Partition's cut was put in force or taken back: handoff (per boundary,
                 the last layers of the stage before it whose backward runs after it)
    migration    layers moved live: the `MigrationRecord`'s fields (step, version, old_sizes,
                 new_sizes, moved, bytes_moved, pause_s)
    rollback     a migration was rolled back: sizes (kept), requested, error
    trigger      a re-plan was triggered automatically: reason
    replan       the planner was asked again: changed, reason, candidate (a plan dict)
    reconfigure  the next model was taken: layers (its keys)
    inherit      with `inherit_weights`, the old weights the next model took: layers, bytes,
                 moved (layers fetched from another stage), moved_bytes
    error        something failed; logged by the runtime's error handling

`EventLog` is the facade's part that keeps them: `record(kind, **details)` stamps an event
with the model's generation and step (read from the facade when it happens), and logs it on
the `pipeline.distributed.events` logger: plans, schedules and migrations at INFO, faults
(error, rollback) at WARNING, the rest at DEBUG (`logging.getLogger("pipeline")` turns them
up or down).

This module imports nothing from torch, so tests and loggers can use it on their own.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal, get_args

__all__ = ["EVENT_KINDS", "EventKind", "EventLog", "PipelineEvent", "plain"]

EventKind = Literal[
    "schedule",
    "tryout",
    "switch",
    "build",
    "handoff",
    "migration",
    "rollback",
    "trigger",
    "replan",
    "reconfigure",
    "inherit",
    "error",
]
EVENT_KINDS: tuple[EventKind, ...] = get_args(EventKind)

logger = logging.getLogger(__name__)
_LEVELS: dict[EventKind, int] = {
    "schedule": logging.INFO,
    "tryout": logging.INFO,
    "switch": logging.INFO,
    "build": logging.INFO,
    "migration": logging.INFO,
    "replan": logging.INFO,
    "reconfigure": logging.INFO,
    "rollback": logging.WARNING,
    "error": logging.WARNING,
}


def plain(value: Any) -> Any:
    """`value` in plain JSON values, for loggers and trackers (`nas.tracking` uses it too):
    tuples and sets become lists, mapping keys strings, NaN and infinities None,
    dataclasses dicts (their `to_dict` where they have one), numpy and torch scalars
    numbers, paths strings; anything else its `str`. Strict JSON (`allow_nan=False`)
    accepts the result."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):  # int subclasses (IntEnum) as plain ints
        return int(value)
    if isinstance(value, str):  # str subclasses (str enums) as their text
        return str.__str__(value)
    if isinstance(value, float):  # numpy.float64 is a float subclass
        return float(value) if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, set | frozenset):
        return [plain(v) for v in sorted(value, key=repr)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        to_dict = getattr(value, "to_dict", None)
        if callable(to_dict):
            return plain(to_dict())
        return plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    if isinstance(value, PurePath):
        return str(value)
    tolist = getattr(value, "tolist", None)  # numpy and torch scalars and arrays
    if callable(tolist):
        try:
            converted = tolist()
        except (TypeError, ValueError, RuntimeError):
            converted = value
        if converted is not value:
            return plain(converted)
    return str(value)


@dataclass(frozen=True)
class PipelineEvent:
    """One entry of `ElasticPipeline.events` (kinds and their details: module doc).

    Frozen; `details` is a dict (so an event pickles across processes): treat it as read-only.
    """

    generation: int  # which model: +1 per `reconfigure`
    step: int  # the model's step count when it happened
    kind: EventKind
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(
                f"an event's kind={self.kind!r} is not valid; valid: {', '.join(EVENT_KINDS)}"
            )

    def to_dict(self) -> dict[str, Any]:
        """{"generation", "step", "kind", "details"} in plain JSON values (see `plain`)."""
        return {
            "generation": self.generation,
            "step": self.step,
            "kind": self.kind,
            "details": plain(self.details),
        }


class EventLog:
    """The pipeline's events in the order they happened."""

    def __init__(self, now: Callable[[], tuple[int, int]]) -> None:
        self._now = now  # (generation, step) of the pipeline at this moment
        self._events: list[PipelineEvent] = []

    @property
    def events(self) -> list[PipelineEvent]:
        """Every event so far, oldest first (read-only by convention: `record` adds)."""
        return self._events

    def record(self, kind: EventKind, **details: Any) -> PipelineEvent:
        """Add an event of `kind`, stamped with the pipeline's generation and step."""
        generation, step = self._now()
        event = PipelineEvent(generation, step, kind, details)
        self._events.append(event)
        level = _LEVELS.get(kind, logging.DEBUG)
        if logger.isEnabledFor(level):
            logger.log(level, "model %d step %d: %s %s", generation, step, kind, plain(details))
        return event
