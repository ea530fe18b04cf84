"""One process of a stage pool: it waits for work, joins each job's group, and keeps weights.

A `pipeline.distributed.pool.StagePool` starts P of these once. Each serves commands from
its pipe until the pool closes, numbered as they happen::

    1. drop      free the resident models the ledger evicted (`Assignment.drop`)
    2. hand over (only when a job shrinks a model: `Handover`) join a group of the leaving
                 and the receiving processes, send or receive the model's layers in one
                 exchange (`pipeline.distributed.transfer`), leave it; a leaver reports
                 "released" and is done
    3. join      a process group of the job's members alone, on the pool's store under the
                 job's own prefix (torch keeps one default group per process: each job
                 gets a fresh one, so no process is started per job)
    4. run       fn(ctx) with a `PoolContext`: its rank in the job, the weights it took
                 (`resident`), and `keep()` to leave this rank's part of a model here
    5. leave     a barrier, then the group goes (`leave_group`); report ("ok", result,
                 what it kept)

A job that raises reports its traceback and ends the process at once (a peer may be blocked
in a message to it); the pool starts a fresh process in its place.
"""

from __future__ import annotations

import datetime
import pickle
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from pipeline.distributed import processes
from pipeline.distributed.comm import Comm, leave_group
from pipeline.distributed.inheritance import WeightSnapshot
from pipeline.distributed.processes import StageContext
from pipeline.distributed.transfer import exchange, pack_all

__all__ = ["Assignment", "Handover", "Kept", "MemberSetup", "PoolContext", "Taking", "serve"]

States = Mapping[str, Mapping[str, torch.Tensor]]  # {layer key: its state}


@dataclass(frozen=True)
class Kept:
    """What a member kept of a job's model: the model's keys and the ones it holds."""

    keys: tuple[str, ...]
    held: tuple[str, ...]


@dataclass(frozen=True)
class PoolContext(StageContext):
    """A `StageContext` for a job on a pool's processes (`StagePool.submit`).

    resident  the weights the job asked for with `take=`, regrouped onto its ranks (pass it
              as `ElasticPipeline(..., inherit_from=ctx.resident)`), or None: no such model
              is resident, or its holders were busy, so it starts from elsewhere
    """

    process: int  # which process of the pool this rank runs on
    job: int
    resident: WeightSnapshot | None
    keep_as: str | None  # the `keep=` name the job was submitted with

    def keep(self, snapshot: WeightSnapshot) -> None:
        """Leave this rank's part of a model (`ElasticPipeline.snapshot()`, on every rank)
        in this process, under the job's `keep=` name, for a later job's `take=`."""
        if self.keep_as is None:
            raise ValueError("keep(): submit the job with keep=<name> to keep its weights")
        if not isinstance(snapshot, WeightSnapshot):
            raise TypeError(f"keep() takes a WeightSnapshot, got {type(snapshot).__name__}")
        _KEPT[self.job] = snapshot


@dataclass(frozen=True)
class Taking:
    """A resident model a job starts from: its keys and the job rank holding each."""

    name: str
    keys: tuple[str, ...]
    holders: tuple[int, ...]


@dataclass(frozen=True)
class Handover:
    """Leavers hand their layers of model `name` to members before the job (`Lending`)."""

    name: str
    group: tuple[int, ...]  # the processes taking part, ascending: their ranks
    moves: Mapping[int, int]  # leaving process -> receiving process


@dataclass(frozen=True)
class Assignment:
    """One command to one process: its part in job `job` (`fn` None: a leaver's handover)."""

    job: int
    fn: Callable[[PoolContext], Any] | None
    rank: int
    world_size: int
    take: Taking | None = None
    keep_as: str | None = None
    handover: Handover | None = None
    drop: tuple[str, ...] = ()


_KEPT: dict[int, WeightSnapshot] = {}  # job -> what `PoolContext.keep` left (this process)


@dataclass(frozen=True)
class MemberSetup:
    """How every process of the pool reaches the others and runs its jobs."""

    port: int  # the pool's store, on this machine
    backend: str
    threads: int
    timeout_s: float

    def join(self, store: Any, prefix: str, rank: int, world_size: int) -> None:
        """Make the default group of this job (3.), on the pool's store under `prefix`."""
        dist.init_process_group(
            processes.group_backend(self.backend),
            store=dist.PrefixStore(prefix, store),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )


def serve(process: int, pipe: Any, setup: MemberSetup, caller: processes.Caller) -> None:
    """Entry point of pool process `process`: serve the commands of `pipe` until a None
    arrives, reporting on the same pipe. A pipe of its own, not a queue shared by the pool:
    a process killed while it writes can break only its own pipe, which goes with it."""
    processes.watch_caller(caller.pid)
    caller.adopt()
    timeout = datetime.timedelta(seconds=setup.timeout_s)
    store = dist.TCPStore("127.0.0.1", setup.port, is_master=False, timeout=timeout)
    resident: dict[str, dict[str, Mapping[str, torch.Tensor]]] = {}  # name -> this part
    pipe.send((-1, process, "ready"))
    while (order := pipe.recv()) is not None:
        for name in order.drop:  # 1.
            resident.pop(name, None)
        try:
            message = _carry_out(process, order, setup, store, resident)
        except BaseException:
            pipe.send((order.job, process, "error", traceback.format_exc()))
            processes.leave_now()
        pipe.send(message)


def _carry_out(
    process: int,
    order: Assignment,
    setup: MemberSetup,
    store: Any,
    resident: dict[str, dict[str, Mapping[str, torch.Tensor]]],
) -> tuple[Any, ...]:
    if order.handover is not None and process in order.handover.group:  # 2.
        _hand_over(process, order.job, order.handover, setup, store, resident)
    if order.fn is None:
        return (order.job, process, "released", None)
    setup.join(store, f"job{order.job}/", order.rank, order.world_size)
    here = processes.stage_context(
        order.rank, order.world_size, setup.backend, setup.threads, setup.timeout_s, process
    )
    ctx = PoolContext(
        **vars(here),
        process=process,
        job=order.job,
        resident=_taken(order, resident),
        keep_as=order.keep_as,
    )
    result = order.fn(ctx)  # 4.
    Comm().barrier()  # 5. nobody tears the group down while a peer still reads from it
    leave_group()
    kept = _KEPT.pop(order.job, None)
    if kept is None or order.keep_as is None:
        return (order.job, process, "ok", pickle.dumps(result), None)
    resident[order.keep_as] = dict(kept.states)
    return (order.job, process, "ok", pickle.dumps(result), Kept(kept.keys, tuple(kept.states)))


def _taken(
    order: Assignment, resident: Mapping[str, Mapping[str, Mapping[str, torch.Tensor]]]
) -> WeightSnapshot | None:
    """This rank's part of the model the job takes, as a snapshot of the job's ranks."""
    if order.take is None:
        return None
    take = order.take
    states = resident.get(take.name, {})
    return WeightSnapshot(take.keys, (len(take.keys),), dict(states), take.holders)


def _hand_over(
    process: int,
    job: int,
    handover: Handover,
    setup: MemberSetup,
    store: Any,
    resident: dict[str, dict[str, Mapping[str, torch.Tensor]]],
) -> None:
    """2.: in a group of `handover.group`, each leaver sends its part of the model to its
    receiver, which adds it to its own; the leaver keeps nothing of it."""
    rank = handover.group.index(process)
    setup.join(store, f"job{job}/handover/", rank, len(handover.group))
    comm = Comm()
    mine = resident.get(handover.name, {})
    outgoing: dict[int, Any] = {}
    if process in handover.moves:
        outgoing[handover.group.index(handover.moves[process])] = dict(mine)
    received = exchange(comm, comm.together(lambda: pack_all(outgoing, rank)))
    if process in handover.moves:
        resident.pop(handover.name, None)
    else:
        merged = dict(mine)
        for states in received.values():
            merged.update(states)
        resident[handover.name] = merged
    comm.barrier()
    leave_group()
