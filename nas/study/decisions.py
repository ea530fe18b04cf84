"""Rank 0's decisions, agreed on every stage process of a study.

Only rank 0 holds the study (`nas.study.leader.Leader`); every rank waits in the same
broadcast for each of its decisions (`nas.study.run`'s numbered steps) and receives the
decision, or, if rank 0 raised while making it, the same `LeaderError`: no rank is left
waiting, and every rank stops the same way. The time a decision takes is the trial's
`Phase.DECIDE` (`nas.study.phases`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from nas.errors import LeaderError
from nas.study.phases import Phase, timed
from pipeline.distributed.comm import Comm

__all__ = ["Decider", "Decisions"]

T = TypeVar("T")


class Decider(Protocol):
    """Who makes rank 0's decisions: its own `Leader`, or its worker's over a link
    (`nas.study.remote.LeaderLink`, a trial on the stage pool)."""

    def call(self, method: Callable[..., T], *args: Any) -> T:
        """`method(leader, *args)`: a `Leader` method's decision."""
        ...

    def log_step(self, step: int, metrics: dict[str, Any]) -> None: ...


class Decisions:
    """Rank 0's decisions, agreed on every rank.

    `decide(what, Leader.method, *args)` runs `leader.method(*args)` on rank 0 and returns
    its result on every rank; if it raises, every rank raises `LeaderError(what, cause)`.
    `log_step` is the one call that decides nothing: rank 0 logs, the others go on.
    """

    def __init__(self, comm: Comm, leader: Decider | None) -> None:
        self.comm, self.leader = comm, leader

    def __call__(self, what: str, method: Callable[..., T], *args: Any) -> T:
        def make() -> T:
            assert self.leader is not None, "only rank 0 decides"
            try:
                return self.leader.call(method, *args)
            except Exception as error:
                raise LeaderError.of(what, error) from error

        with timed(Phase.DECIDE):
            return self.comm.agree(make)

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        if self.leader is not None:
            with timed(Phase.TRACK):
                self.leader.log_step(step, metrics)
