"""One `StagePool` shared by several processes of a machine: its owner serves it on a local
socket, and any other process (of the same user) runs jobs on it as if it held the pool.

A machine has one set of cores (or devices) but may run several training loops at once: a
search runs a worker process per candidate it trains side by side, each with its own loop.
Each of them starting a pool of its own would split the cores for good; one pool, lent to
all of them, gives each job the stage count it asks for from what is free now.

    owner process                               another process
    StagePool ── PoolService(pool) ◄─────────── PoolClient(address, authkey)
                   │ 1. accept a connection       .run(fn, n_stages, take=, keep=)
                   │ 2. recv RemoteJob
                   │ 3. pool.submit(...) and wait  (one thread per connection)
                   └ 4. send ("ok", results) or ("error", the job's StageFailedError)

One connection per job: a client that goes away while its job runs (killed, say) leaves
the job to end as it would (its functions find their own peers gone, if they talked to
that client, and fail) and the reply is dropped; the pool's processes go back to the pool
either way. The socket is the platform's local kind (a Unix socket where there is one),
and a connection must prove the service's `authkey` (`multiprocessing.connection`).
"""

from __future__ import annotations

import logging
import multiprocessing.connection
from dataclasses import dataclass
from typing import Any

from pipeline.distributed.pool import StagePool
from pipeline.distributed.pool_jobs import Job
from pipeline.distributed.serving import LocalServer
from pipeline.errors import StageFailedError

__all__ = ["PoolClient", "PoolService", "RemoteJob"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteJob:
    """What a client asks of the pool: `StagePool.submit`'s arguments."""

    fn: Job
    n_stages: int | tuple[int, ...]
    take: str | None = None
    keep: str | None = None


class PoolService:
    """Serve `pool` to other processes of this machine until `close` (module doc)."""

    def __init__(self, pool: StagePool) -> None:
        self._pool = pool
        self._server = LocalServer(self._serve, name="pool-service", concurrent=True)

    @property
    def address(self) -> Any:
        """Where clients connect (a path, or a (host, port) pair)."""
        return self._server.address

    def client(self) -> PoolClient:
        """A client of this service, to pickle and hand to another process."""
        return PoolClient(self.address, self._server.authkey, self._pool.size)

    def close(self) -> None:
        """Stop accepting jobs (the pool itself stays open: its owner closes it)."""
        self._server.close()

    def __enter__(self) -> PoolService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _serve(self, connection: Any) -> None:
        try:
            job: RemoteJob = connection.recv()  # 2.
        except (EOFError, OSError) as error:
            logger.debug("pool service: a client left before its job: %s", error)
            return
        reply: tuple[str, Any]
        try:
            results = self._pool.run(job.fn, job.n_stages, take=job.take, keep=job.keep)  # 3.
            reply = ("ok", results)
        except (StageFailedError, ValueError, TypeError, RuntimeError) as error:
            reply = ("error", error)
        try:
            connection.send(reply)  # 4.
        except (OSError, ValueError) as error:  # gone, or a result that does not pickle
            logger.debug("pool service: a reply not delivered: %s", error)


@dataclass(frozen=True)
class PoolClient:
    """Runs jobs on a `PoolService`'s pool from any process of the machine; pickles."""

    address: Any
    authkey: bytes
    size: int  # the pool's processes: a job runs on 1 to `size` of them

    def run(
        self,
        fn: Job,
        n_stages: int | tuple[int, ...],
        *,
        take: str | None = None,
        keep: str | None = None,
    ) -> list[Any]:
        """`StagePool.run` on the served pool: the results in rank order, or the job's
        `StageFailedError` (or the pool's refusal, as it raised it). A service that is
        gone raises `ConnectionError`."""
        try:
            connection = multiprocessing.connection.Client(self.address, authkey=self.authkey)
        except OSError as error:
            raise ConnectionError(f"the stage pool at {self.address!r} is gone: {error}") from error
        with connection:
            connection.send(RemoteJob(fn, n_stages, take, keep))
            try:
                status, payload = connection.recv()
            except (EOFError, OSError) as error:
                raise ConnectionError(
                    f"the stage pool at {self.address!r} closed during a job: {error}"
                ) from error
        if status == "error":
            raise payload
        return list(payload)
