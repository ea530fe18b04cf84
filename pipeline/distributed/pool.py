"""`StagePool`: stage processes started once and lent to pipelines of any size, side by side.

`launch(fn, n_stages)` starts S processes for one run of `fn`. A search trains many models of
different sizes, one after another and several at a time; starting processes for each costs
seconds, and one fixed stage count per study either pipelines the small models for nothing or
trains the large ones past their memory. A pool keeps P processes (one per core, or per GPU)
and lends each job the number of stages it asks for::

    pool = StagePool(4)
    a = pool.submit(train, 1, keep="parent")      # 1 process, its weights left resident
    b = pool.submit(train, 2)                     # 2 others, at the same time
    a.result(); b.result()
    pool.run(train_child, 3, take="parent", keep="child")   # grows live: 1 -> 3 stages
    pool.run(train_child, 1, take="child")                  # shrinks live: 3 -> 1
    pool.submit(train_any, (2, 1))  # 2 stages when 2 are free; else 1, as soon as 1 is

A job runs `fn(ctx)` on each of its processes with a `PoolContext` (a `StageContext` plus the
weights it took, `ctx.resident`, and `ctx.keep(snapshot)`); `run` returns the results in rank
order, `submit` a `concurrent.futures.Future` of them. Which processes a job gets, and how a
resident model is regrouped onto them, is `pipeline.pure.pool.PoolLedger`'s arithmetic; what
a process does with a command is `pipeline.distributed.pool_member`'s. The pool's own
thread (`_serve`) is the only one that touches the ledger and the processes::

    submit ──> waiting (first come, first lent) ──lend──> Assignment to each process
                                                         │ (pipe per process)
    Future <── results by rank <── the same pipes <──────┘ "ok" / "released" / "error"

Faults: a job that raises (or a process that dies) fails its future with `StageFailedError`
naming the first cause; every process of that job that did not finish cleanly is killed and
a fresh one takes its place, so the pool keeps its size and no process is left behind; the
weights they held are forgotten. The processes die with the caller (`processes`).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import logging
import multiprocessing.connection
import os
import pickle
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch
import torch.distributed as dist

from pipeline.distributed import pool_member, processes, server
from pipeline.distributed.pool_jobs import Job, Request, Running
from pipeline.distributed.pool_member import Assignment, Handover, PoolContext, Taking
from pipeline.pure.checks import is_int
from pipeline.pure.pool import PoolLedger

__all__ = ["PoolContext", "StagePool"]

logger = logging.getLogger(__name__)
_POLL_S = 0.05  # how often the pool's thread looks for dead processes when nothing happens
_GRACE_S = 0.5  # after a job's first error, how long its other processes may still report
_FAILED_STARTS = 3  # processes dead before their first job, in a row: the pool is broken


class StagePool:
    """P stage processes on this machine, lent to jobs of any stage count (module doc).

    Args:
        size: processes (default: one per GPU under NCCL, else one per core).
        threads_per_process: torch intra-op threads of each (default 1).
        backend: "gloo" or "nccl" (default: NCCL when CUDA has a GPU per process).
        timeout_s: timeout of every collective and message of a job.
        keep_resident: models whose weights stay resident at most (least recently used
            dropped first).
    """

    def __init__(
        self,
        size: int | None = None,
        *,
        threads_per_process: int = 1,
        backend: str | None = None,
        timeout_s: float = 300.0,
        keep_resident: int = 4,
    ) -> None:
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if size is None:
            size = gpus if backend == "nccl" or (backend is None and gpus) else os.cpu_count() or 1
        if not is_int(size) or size < 1:
            raise ValueError(f"size={size!r}: a pool needs a positive int of processes")
        if backend not in (None, "gloo", "nccl"):
            raise ValueError(f"backend must be 'gloo', 'nccl' or None (automatic), got {backend!r}")
        if not is_int(threads_per_process) or threads_per_process < 1:
            raise ValueError(f"threads_per_process={threads_per_process!r}: a positive int")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        backend = backend or ("nccl" if gpus >= size else "gloo")
        self._ledger = PoolLedger(size, keep_resident)
        self._context = server.start_context()
        self._store = dist.TCPStore(
            "127.0.0.1",
            0,
            is_master=True,
            timeout=datetime.timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        self._setup = pool_member.MemberSetup(
            self._store.port, backend, threads_per_process, timeout_s
        )
        self._procs: list[Any] = [None] * size
        self._pipes: list[Any] = [None] * size
        self._ready = [False] * size  # whether each process has started and said so
        for p in range(size):
            self._start(p)
        self._waiting: collections.deque[Request] = collections.deque()
        # a submit wakes the pool's thread from its wait on the processes' pipes at once
        self._wake_reader, self._wake_writer = self._context.Pipe(duplex=False)
        self._running: dict[int, Running] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._restarts = 0
        self._failed_starts = 0
        self._broken: RuntimeError | None = None  # why the pool cannot start processes
        self._thread = threading.Thread(target=self._serve, daemon=True, name="stage-pool")
        self._thread.start()

    # -- the public surface ----------------------------------------------------------------
    @property
    def size(self) -> int:
        return self._ledger.size

    @property
    def restarts(self) -> int:
        """Processes started again in place of one that failed or died."""
        return self._restarts

    @property
    def pids(self) -> tuple[int, ...]:
        """The pool's processes' pids, by process number."""
        return tuple(p.pid for p in self._procs)

    def resident(self) -> Mapping[str, tuple[int, ...]]:
        """{name: the processes holding its layers} of the models kept resident now."""
        with self._lock:
            return {n: m.processes for n, m in self._ledger.resident.items()}

    def submit(
        self,
        fn: Job,
        n_stages: int | Sequence[int],
        *,
        take: str | None = None,
        keep: str | None = None,
    ) -> Future[list[Any]]:
        """Run `fn(ctx)` on `n_stages` of the pool's processes once they are free (first
        come, first served): a future of the results in rank order.

        n_stages: a count, or the counts the job can run on, preferred first: it starts on
            the first one free, so a job that prefers 2 stages but can run on 1 takes the
            one process that is free rather than leave it idle while it waits (the job reads
            its count from `ctx.world_size`).

        take: the name a finished job kept its weights under: they reach `ctx.resident`
            regrouped onto this job's ranks, live where their holders are free (else None).
        keep: the name under which `ctx.keep(snapshot)` leaves this job's weights resident.
        `fn` and its results must pickle (a module-level function, or a partial of one)."""
        if self._closed.is_set():
            raise RuntimeError("this StagePool is closed")
        if self._broken is not None:
            raise self._broken
        request = Request.checked(fn, n_stages, take, keep, self.size)
        with self._lock:
            self._waiting.append(request)
            self._wake_writer.send_bytes(b"")
        return request.future

    def run(
        self,
        fn: Job,
        n_stages: int | Sequence[int],
        *,
        take: str | None = None,
        keep: str | None = None,
    ) -> list[Any]:
        """`submit(...)` and wait: the results in rank order, or its `StageFailedError`."""
        return self.submit(fn, n_stages, take=take, keep=keep).result()

    def close(self) -> None:
        """Stop the processes; jobs not finished fail with a RuntimeError."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            self._wake_writer.send_bytes(b"")
        self._thread.join()
        for pipe in self._pipes:
            with contextlib.suppress(OSError):
                pipe.send(None)
        processes.terminate(self._procs)
        error = RuntimeError("the StagePool closed before this job ended")
        for request in [*self._waiting, *(r.request for r in self._running.values())]:
            if not request.future.done():
                request.future.set_exception(error)
        del self._store

    def __enter__(self) -> StagePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the pool's thread -----------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._closed.is_set() and self._broken is None:
                self._lend()
                for message in self._messages():
                    self._on_report(message)
                self._watch()
        except Exception as error:  # a bug here must not leave a caller waiting forever
            logger.exception("stage pool: its thread failed")
            self._break(RuntimeError(f"the StagePool's thread failed: {error!r}"))

    def _messages(self) -> list[tuple[Any, ...]]:
        """What the processes reported, waiting up to `_POLL_S` for the first report or a
        submit. A pipe that breaks (its process died, perhaps in mid-message) is read no
        more: `_watch` sees the death."""
        live = [pipe for pipe in self._pipes if not pipe.closed]
        got: list[tuple[Any, ...]] = []
        ready: list[Any] = multiprocessing.connection.wait(
            [*live, self._wake_reader], timeout=_POLL_S
        )
        while self._wake_reader.poll():
            self._wake_reader.recv_bytes()
        for pipe in (pipe for pipe in ready if pipe is not self._wake_reader):
            try:
                got.append(pipe.recv())
            except (EOFError, OSError, pickle.UnpicklingError):
                pipe.close()
        return got

    def _lend(self) -> None:
        """Lend to the waiting jobs in order while the first one fits (once every process
        has started: one that dies as it starts is not a job's failure)."""
        while all(self._ready):
            with self._lock:
                if not self._waiting:
                    return
                request = self._waiting[0]
                lending = next(
                    (
                        lent
                        for n in request.n_stages
                        if (lent := self._ledger.lend(n, request.take)) is not None
                    ),
                    None,
                )
                if lending is None:
                    return
                self._waiting.popleft()
            job = Running(request, lending)
            self._running[lending.job] = job
            self._send(job)

    def _send(self, job: Running) -> None:
        lending, request = job.lending, job.request
        taking = None
        if lending.taken is not None:
            holders = tuple(lending.rank_of(p) for p in lending.taken.holder)
            taking = Taking(lending.taken.name, lending.taken.keys, holders)
        handover = None
        if lending.handover:
            assert lending.taken is not None, "a handover moves a taken model"
            handover = Handover(lending.taken.name, lending.handover_group, lending.handover)
        n = len(lending.members)
        orders = {
            p: Assignment(lending.job, None, -1, 0, handover=handover, drop=lending.drop.get(p, ()))
            for p in lending.leavers
        }
        for rank, p in enumerate(lending.members):
            orders[p] = Assignment(
                lending.job,
                request.fn,
                rank,
                n,
                taking,
                request.keep,
                handover,
                lending.drop.get(p, ()),
            )
        for p, order in orders.items():
            try:
                self._pipes[p].send(order)
            except OSError as error:  # it died: `_watch` starts another
                job.failed(p, f"the job could not reach process {p}: {error!r}")

    def _on_report(self, message: tuple[Any, ...]) -> None:
        number, process, status, *payload = message
        if status == "ready":
            self._ready[process] = True
            self._failed_starts = 0
            return
        job = self._running.get(number)
        if job is None:  # a job already failed and given back
            return
        if status == "released":
            job.done.add(process)
            with self._lock:
                self._ledger.release(number, process)
        elif status == "ok":
            try:
                job.results[job.lending.rank_of(process)] = pickle.loads(payload[0])
            except Exception as error:  # a result this process cannot import
                job.failed(process, f"its result could not be read here: {error!r}")
                job.done.add(process)  # the process itself ended its part cleanly
            else:
                job.kept[process] = payload[1]
                job.done.add(process)
        else:
            job.failed(process, payload[0])
        self._settle(job)

    def _watch(self) -> None:
        """Processes that died: the job waiting for one fails; any other is started again
        (and a finished member's part of a kept model is gone with it)."""
        for p, proc in enumerate(self._procs):
            if proc.exitcode is None:
                continue
            waiting = next((j for j in self._running.values() if p in j.outstanding()), None)
            if waiting is not None:
                waiting.failed(
                    p,
                    f"the process exited with code {proc.exitcode} without a report "
                    "(killed by a signal or out of memory?)",
                )
            elif not any(p in j.errors for j in self._running.values()):  # else: `_settle`
                for job in self._running.values():
                    if p in job.kept:
                        job.kept[p] = None
                if self._failed_start(p, proc.exitcode):
                    return
                self._replace([p])
        for job in list(self._running.values()):
            self._settle(job)

    def _failed_start(self, process: int, exitcode: int) -> bool:
        """Count a process that died before any job; the third in a row breaks the pool
        (its waiting jobs fail, and so does every later `submit`), rather than start
        processes forever."""
        if self._ready[process]:
            return False
        self._failed_starts += 1
        if self._failed_starts < _FAILED_STARTS:
            return False
        self._break(
            RuntimeError(
                f"the pool's processes exit as they start (exit code {exitcode}, "
                f"{self._failed_starts} in a row); a program that makes a StagePool must "
                "guard its entry point with `if __name__ == '__main__':` (the processes "
                "import it)"
            )
        )
        return True

    def _break(self, error: RuntimeError) -> None:
        """The pool can lend nothing more: every job waiting or running fails with `error`,
        and so does every later `submit`."""
        self._broken = error
        with self._lock:
            waiting, self._waiting = list(self._waiting), collections.deque()
        for request in [*waiting, *(job.request for job in self._running.values())]:
            if not request.future.done():
                request.future.set_exception(error)

    def _settle(self, job: Running) -> None:
        """End `job` once every member finished, or once it failed and its grace is over."""
        number = job.lending.job
        if job.failed_at is None:
            if len(job.results) < len(job.lending.members):
                return
            del self._running[number]
            with self._lock:
                self._ledger.give_back(number, job.kept_model())
            job.request.future.set_result([job.results[r] for r in range(len(job.results))])
            return
        if job.outstanding() and time.monotonic() - job.failed_at < _GRACE_S:
            return
        del self._running[number]
        self._replace([p for p in job.processes if p not in job.done])
        with self._lock:
            self._ledger.give_back(number)
        job.request.future.set_exception(job.first_cause())

    def _replace(self, broken: list[int]) -> None:
        """Kill these processes and start fresh ones in their places."""
        processes.terminate([self._procs[p] for p in broken])
        with self._lock:
            self._ledger.lose(broken)
        for p in broken:
            self._start(p)
            self._restarts += 1
        if broken:
            logger.warning("stage pool: processes %s started again", broken)

    def _start(self, process: int) -> None:
        """Start process number `process` (again), with a new pipe of its own."""
        if self._pipes[process] is not None:
            self._pipes[process].close()
        parent, child = self._context.Pipe()
        proc = self._context.Process(
            target=pool_member.serve,
            args=(process, child, self._setup, processes.Caller.here()),
            name=f"pipeline-pool-{process}",
        )
        proc.start()
        child.close()
        self._procs[process], self._pipes[process] = proc, parent
        self._ready[process] = False
