"""Start the stage processes and run the same function in each (SPMD, like torchrun).

`launch(fn, n_stages=S)` has two modes:

* Local (the embedded default): the caller starts S fresh processes on this machine.
  The caller hosts the rendezvous store on a free port; each child joins the process
  group (gloo on CPU, NCCL when every stage has its own GPU), runs `fn(ctx)`, and reports
  its result or its traceback through a queue::

        caller ──start──> stage 0 ... stage S-1
          │  TCPStore (rendezvous)   │ init_process_group(store, timeout)
          │ <──── ("ok", result) ────│ fn(ctx)
          │ <──── ("error", tb) ─────│ an exception
          └─ on the first error or death: terminate the rest, raise StageFailedError

* Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR set): the current process is one stage; it
  joins torchrun's process group (created by the first launch and kept until exit, so a
  program may launch again), runs `fn(ctx)` and returns every stage's result. The stages
  may be on several machines (`torchrun --nnodes=N`): each process chooses its backend
  and device from the node it runs on (NCCL when the node has a GPU for each of its
  LOCAL_WORLD_SIZE stages, GPU LOCAL_RANK), and the ranks check they chose alike.

How the processes start and end (the forkserver, no child outliving the caller) is
`pipeline.distributed.processes`'. Every collective and point-to-point message in the group
times out after `timeout_s`, so a dead peer raises instead of hanging.
"""

from __future__ import annotations

import atexit
import datetime
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose: `torch.distributed.nn.functional`
# binds `group.WORLD` as a default argument at import time, and it is imported lazily by
# torch.optim (through torch._dynamo). Imported after init_process_group, it would pin the
# default group forever: destroy_process_group could not join gloo's worker threads, and
# one of them, freeing the last Work after the interpreter began to finalize, aborts the
# process at exit (SIGABRT, "terminate called without an active exception").
import torch.distributed.nn

from pipeline.distributed import processes, server
from pipeline.distributed.comm import Comm, leave_group
from pipeline.distributed.processes import StageContext
from pipeline.errors import StageFailedError

__all__ = ["StageContext", "StageFailedError", "launch", "lead_process", "under_torchrun"]

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launch(
    fn: Callable[[StageContext], Any],
    n_stages: int,
    *,
    backend: str | None = None,
    threads_per_stage: int | None = None,
    timeout_s: float = 300.0,
    local: bool = False,
) -> list[Any]:
    """Run `fn(ctx)` in `n_stages` stage processes; return their results in rank order.

    backend: "gloo" or "nccl"; default NCCL when CUDA has a GPU per stage (under torchrun:
        per stage on this node), else gloo.
    threads_per_stage: torch intra-op threads per stage (default: cores / stages, >= 1).
    timeout_s: timeout of the rendezvous and of every collective and message.
    local: start `n_stages` processes on this machine even in a torchrun rank (which
        otherwise joins torchrun's group): a measurement of the machine itself.
    `fn` and its result must be picklable (a module-level function; the child imports it).
    """
    if not isinstance(n_stages, int) or n_stages < 1:
        raise ValueError(f"n_stages must be a positive int, got {n_stages!r}")
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo', 'nccl' or None (automatic), got {backend!r}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    joins = under_torchrun() and not local
    here = int(os.environ.get("LOCAL_WORLD_SIZE", n_stages)) if joins else n_stages
    if backend is None:  # from the stages on this machine, not from the whole world's count
        backend = (
            "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= here else "gloo"
        )
    if threads_per_stage is None:
        threads_per_stage = max(1, (os.cpu_count() or 1) // here)
    if joins:
        return _join_torchrun(fn, n_stages, backend, threads_per_stage, timeout_s)
    return _launch_local(fn, n_stages, backend, threads_per_stage, timeout_s)


# -- under torchrun ----------------------------------------------------------------------------
def under_torchrun() -> bool:
    """Was this process started by torchrun (so `launch` joins its group, one stage here)?"""
    return all(v in os.environ for v in _TORCHRUN_VARS)


def lead_process() -> bool:
    """Is this the one process that writes what every rank shares (records, tracker runs,
    reports)? Always outside torchrun, where `launch` returns in one process; rank 0 under
    it, where every process runs the program and `launch` returns in each."""
    return not under_torchrun() or os.environ["RANK"] == "0"


def _join_torchrun(
    fn: Callable[[StageContext], Any], n_stages: int, backend: str, threads: int, timeout_s: float
) -> list[Any]:
    world = int(os.environ["WORLD_SIZE"])
    if world != n_stages:
        raise ValueError(f"n_stages={n_stages} but torchrun started WORLD_SIZE={world} processes")
    if not dist.is_initialized():
        # Created once and kept until the process exits: a second group on torchrun's store
        # would meet the first one's keys (its ranks' old addresses) and hang, so a program
        # that launches twice (a study, then its retraining) reuses the first.
        dist.init_process_group(
            processes.group_backend(backend), timeout=datetime.timedelta(seconds=timeout_s)
        )
        atexit.register(leave_group)
    comm = Comm()
    chosen = comm.all_gather_object((socket.gethostname(), backend))
    if len({b for _, b in chosen}) > 1:
        raise ValueError(
            f"the nodes chose different backends (host, backend per rank): "
            f"{chosen}; pass backend= explicitly, or give every node a GPU "
            "per stage it runs"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    ctx = processes.stage_context(dist.get_rank(), world, backend, threads, timeout_s, local_rank)
    result = fn(ctx)
    results = comm.all_gather_object(result)
    comm.barrier()  # every peer has read the results before any launches again
    return results


# -- local processes ---------------------------------------------------------------------------
def _launch_local(
    fn: Callable[[StageContext], Any], n_stages: int, backend: str, threads: int, timeout_s: float
) -> list[Any]:
    context = server.start_context()
    store = dist.TCPStore(
        "127.0.0.1",
        0,
        n_stages + 1,
        is_master=True,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    reports: Any = context.Queue()
    caller = processes.Caller.here()
    procs = [
        context.Process(
            target=_stage_main,
            args=(fn, rank, n_stages, store.port, backend, threads, timeout_s, reports, caller),
            name=f"pipeline-stage-{rank}",
        )
        for rank in range(n_stages)
    ]
    try:
        for p in procs:
            p.start()
        return _collect(procs, reports, n_stages)
    finally:
        processes.terminate(procs)
        del store


def _collect(procs: list[Any], reports: Any, n_stages: int) -> list[Any]:
    results: dict[int, Any] = {}
    exited_at: dict[int, float] = {}  # a process that exited may still have a report in flight
    while len(results) < n_stages:
        try:
            rank, status, payload = reports.get(timeout=0.05)
        except queue.Empty:
            now = time.monotonic()
            for rank, p in enumerate(procs):
                if rank in results or p.exitcode is None:
                    continue
                if now - exited_at.setdefault(rank, now) > 1.0:
                    raise _first_cause(procs, reports, {}, set(results)) from None
            continue
        if status == "error":
            raise _first_cause(procs, reports, {rank: payload}, set(results))
        results[rank] = pickle.loads(payload)
    return [results[r] for r in range(n_stages)]


def _first_cause(
    procs: list[Any], reports: Any, errors: dict[int, str], finished: set[int]
) -> StageFailedError:
    """When one stage fails its peers fail soon after (their messages break); name the cause.

    Gather reports for a moment, then prefer a stage that died without a report, then an
    error that is not a broken connection or a timeout, then the first error.
    """
    deadline = time.monotonic() + 0.5
    while time.monotonic() < deadline:
        try:
            rank, status, payload = reports.get(timeout=0.05)
        except queue.Empty:
            continue
        if status == "error":
            errors.setdefault(rank, payload)
        else:
            finished.add(rank)
    for rank, p in enumerate(procs):
        if p.exitcode is not None and rank not in errors and rank not in finished:
            return StageFailedError(
                rank,
                f"the process exited with code {p.exitcode} without a report "
                "(killed by a signal or out of memory?)",
            )
    primary = [r for r, tb in errors.items() if not any(m in tb for m in processes.PEER_FAILURE)]
    rank = primary[0] if primary else next(iter(errors))
    return StageFailedError(rank, errors[rank])


def _stage_main(
    fn: Callable[[StageContext], Any],
    rank: int,
    world: int,
    port: int,
    backend: str,
    threads: int,
    timeout_s: float,
    reports: Any,
    caller: processes.Caller,
) -> None:
    """Entry point of a local stage process."""
    processes.watch_caller(caller.pid)
    caller.adopt()
    try:
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=timeout)
        dist.init_process_group(
            processes.group_backend(backend),
            store=store,
            rank=rank,
            world_size=world,
            timeout=timeout,
        )
    except BaseException:
        processes.report(reports, (rank, "error", traceback.format_exc()))
        return
    try:
        result = fn(processes.stage_context(rank, world, backend, threads, timeout_s))
    except BaseException:
        # Report first: the caller terminates every stage at once, so a peer blocked in a
        # message to this one never holds the report up behind the group's teardown.
        processes.report(reports, (rank, "error", traceback.format_exc()))
        processes.leave_now()
    try:
        Comm().barrier()  # nobody tears the group down while a peer still reads from it
        leave_group()
        processes.report(reports, (rank, "ok", pickle.dumps(result)))
    except BaseException:
        processes.report(reports, (rank, "error", traceback.format_exc()))
