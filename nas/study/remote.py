"""Rank 0 of a trial trained on the stage pool asks its worker's `Leader` over a connection.

On the pool (`nas.study.pooled`) the processes training a trial are the pool's: the study,
and with it every decision (report, prune, promote, log), stays in the worker that asked
the trial. The job's rank 0 reaches it as rank 0 of launched stages reaches its own leader
(`nas.study.decisions.Decisions`), one call at a time:

    worker: LeaderService(leader)                 job rank 0: LeaderLink(address, authkey)
      a thread; one link at a time                  .call(Leader.evaluated, step, metrics)
      1. recv (method, args)            ◄────────   sends (method, args) and waits
      2. send ("ok", method(leader, *args))  ────►  returns the value
         or ("error", what it raised)               or raises it (its text, if it does
                                                    not pickle); Decisions hands either
                                                    to every rank of the job

The worker's own thread waits for the job meanwhile, so the leader is used by one thread at
a time. A worker that is gone makes the link raise `ConnectionError`: the job's decision
fails on every rank, its trial ends and its processes go back to the pool.
"""

from __future__ import annotations

import logging
import multiprocessing.connection
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nas.errors import describe
from nas.study.leader import Leader
from pipeline.distributed.serving import LocalServer

__all__ = ["LeaderLink", "LeaderService"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


class LeaderService:
    """Serve `leader`'s decisions to the rank 0 of each job the worker runs (module doc)."""

    def __init__(self, leader: Leader) -> None:
        self._leader = leader
        self._server = LocalServer(self._serve, name="leader-service")  # one link at a time

    def link(self) -> LeaderLink:
        """What a job's rank 0 connects with (it pickles)."""
        return LeaderLink(self._server.address, self._server.authkey)

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> LeaderService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self, connection: Any) -> None:
        while not self._server.closed:
            try:
                method, args = connection.recv()  # 1.
            except (EOFError, OSError):
                return  # the job ended (or its rank 0 died): the next job connects anew
            try:
                reply: tuple[str, Any] = ("ok", method(self._leader, *args))
            except Exception as error:
                reply = ("error", _portable(error))
            try:
                connection.send(reply)  # 2.
            except (OSError, ValueError) as error:
                logger.debug("leader service: a reply not delivered: %s", error)
                return


def _portable(error: Exception) -> Exception:
    """`error` if it pickles (and unpickles), else a RuntimeError with its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(describe(error))
    return error


@dataclass
class LeaderLink:
    """A job's rank 0's way to its worker's leader: `Decisions`' leader in the job."""

    address: Any
    authkey: bytes
    _connection: Any = field(default=None, init=False, repr=False)
    _held: Exception | None = field(default=None, init=False, repr=False)  # raised next call

    def call(self, method: Callable[..., T], *args: Any) -> T:
        """`method(leader, *args)` in the worker: its value, or what it raised (or what
        logging a step since the last call raised)."""
        if self._held is not None:
            held, self._held = self._held, None
            raise held
        if self._connection is None:
            try:
                self._connection = multiprocessing.connection.Client(
                    self.address, authkey=self.authkey
                )
            except OSError as error:
                raise ConnectionError(f"the study's worker is gone: {error}") from error
        try:
            self._connection.send((method, args))
            status, value = self._connection.recv()
        except (EOFError, OSError) as error:
            raise ConnectionError(f"the study's worker is gone: {error}") from error
        if status == "error":
            raise value
        return value

    def log_step(self, step: int, metrics: dict[str, Any]) -> None:
        """A step between decisions, logged in the worker; what fails waits for the next
        decision (`call`), which every rank of the job makes together."""
        if self._held is None:
            try:
                self.call(Leader.log_step, step, metrics)
            except Exception as error:
                self._held = error

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "authkey": self.authkey,
            "_connection": None,
            "_held": None,
        }
