"""The harness's own errors, and how any error is described in a trial's record.

    LeaderError      a decision of rank 0 failed (nas.study.run); raised on every rank
    HeartbeatError   a trial's heartbeat thread could not record a beat (nas.storage.opening)

`describe(error)` is the one line a failed trial keeps as its `fail_reason`: the error's
type and message, and the root of its cause chain when a library wraps it (Optuna turns
SQLite's "database is locked" into a `StorageInternalError` that does not mention it).
"""

from __future__ import annotations

import traceback
from typing import Any

__all__ = ["HeartbeatError", "LeaderError", "describe"]


def describe(error: BaseException) -> str:
    """ "Type: message", plus "(caused by Type: message)" for the root of its chain."""
    text = _one(error)
    root = error
    while root.__cause__ is not None or (
        root.__context__ is not None and not root.__suppress_context__
    ):
        root = root.__cause__ or root.__context__  # type: ignore[assignment]
    return text if root is error else f"{text} (caused by {_one(root)})"


def _one(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


class LeaderError(RuntimeError):
    """A decision of rank 0 failed; raised on every rank with what it was and its cause."""

    def __init__(self, decision: str, cause: str, detail: str = "") -> None:
        self.decision, self.cause, self.detail = decision, cause, detail
        super().__init__(f"rank 0 could not {decision}: {cause}")

    @classmethod
    def of(cls, decision: str, error: BaseException) -> LeaderError:
        """`error`, raised while rank 0 tried to `decision`, as a LeaderError."""
        if isinstance(error, LeaderError):
            return error
        detail = "".join(traceback.format_exception(error))[-4000:]
        return cls(decision, describe(error), detail)

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.decision, self.cause, self.detail)


class HeartbeatError(RuntimeError):
    """The heartbeat thread of a trial could not record a beat."""
