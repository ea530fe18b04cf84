"""`Comm`: the one owner of every collective and point-to-point message in `pipeline/`.

No other module of the runtime calls `torch.distributed` collectives or point-to-point
operations (`tests/test_import_rules.py` checks it). Keeping them here makes three things
right by construction:

* **Devices.** Two planes, each on the device its backend accepts::

      control plane   CPU tensors and pickled objects: plans, carry headers, status words,
                      migration buffers, trigger flags, losses, errors, inference outputs
      data plane      activations and gradients: CUDA tensors over NCCL when the stages
                      have GPUs, CPU tensors over gloo otherwise

  `launch` creates the default group as "cpu:gloo,cuda:nccl" on GPUs, so a CPU tensor goes
  through gloo and a CUDA tensor through NCCL in the same group. Under torchrun with an
  NCCL-only group, `Comm` creates one gloo group for the control plane.
* **Groups.** Point-to-point messages carry no tag and join this rank's open group
  (`send`, `recv`); `post` starts the group as one batch per plane (NCCL runs it as one:
  sends and receives in it never wait for each other), and waiting for any of its messages
  posts it first. `pipeline.distributed.links` states the ordering rules they follow.
* **Errors.** `together(fn)` runs a local piece of work and agrees on its outcome: if it
  raised on any rank, the same exception is raised on every rank (no rank is left waiting
  in the next collective). `agree(make)` runs a decision on rank 0 and hands its result, or
  its exception, to every rank.

Every operation times out after the process group's timeout, so a dead peer raises.
"""

from __future__ import annotations

import enum
import itertools
import math
import pickle
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from pipeline.errors import PipelineError, StageError

__all__ = ["Comm", "PendingReduce", "Posted", "leave_group", "raise_first"]

T = TypeVar("T")

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_ALIGN = 16  # bytes: `broadcast_tensors` starts each tensor at a multiple of it
_CONTROL_GROUPS: dict[int, Any] = {}  # id(default group) -> its gloo group (NCCL-only groups)
_DATA_PLANES: set[int] = set()  # id(default group) of groups whose NCCL communicator exists


class Comm:
    """Collectives and messages of this process, each on the device its backend accepts."""

    def __init__(self) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "the pipeline needs a process group: run inside pipeline.launch(fn, "
                "n_stages=...) or under torchrun"
            )
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        backend = str(dist.get_backend())
        self.control_device = torch.device("cpu")
        if "nccl" in backend:
            self.data_device = torch.device("cuda", torch.cuda.current_device())
        else:
            self.data_device = torch.device("cpu")
        self._control = None if "gloo" in backend else _control_group()
        self._open: list[tuple[dist.P2POp, Posted]] = []  # point-to-point, not yet posted
        if self.data_device.type == "cuda":
            _start_data_plane(self.data_device)

    # -- objects (control plane) ---------------------------------------------------------
    def all_gather_object(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self._control)
        return out

    def broadcast_object(self, obj: Any, src: int) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src, group=self._control)
        return box[0]

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        out: list[Any] | None = [None] * self.world_size if self.rank == dst else None
        dist.gather_object(obj, out, dst=dst, group=self._control)
        return out

    # -- tensors (control plane) ---------------------------------------------------------
    def all_reduce(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """Reduce a few numbers over all ranks (float64, on the control plane)."""
        t = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(t, op=_OPS[op], group=self._control)
        return [float(v) for v in t.tolist()]

    def all_reduce_async(self, values: Sequence[float], op: str = "sum") -> PendingReduce:
        """`all_reduce`, posted now and waited for later (`PendingReduce.wait`). Every rank
        must post its collectives in the same order, waited or not."""
        t = torch.tensor(list(values), dtype=torch.float64)
        work = dist.all_reduce(t, op=_OPS[op], group=self._control, async_op=True)
        assert work is not None, "an async all_reduce returns a Work"
        return PendingReduce(work, t)

    def broadcast_tensors(
        self,
        tensors: Sequence[torch.Tensor] | None,
        layout: Sequence[tuple[tuple[int, ...], torch.dtype]],
        src: int,
    ) -> tuple[torch.Tensor, ...]:
        """`src`'s CPU `tensors` on every rank, as one message of their bytes; the other
        ranks pass None and know their `layout` (shape, dtype) already. Any dtype travels:
        the bytes go as uint8, which every backend accepts, each tensor's padded to a
        multiple of `_ALIGN` so that every one starts where its dtype may be viewed."""
        sizes = [
            math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            for shape, dtype in layout
        ]
        padded = [size + (-size) % _ALIGN for size in sizes]
        starts = list(itertools.accumulate(padded, initial=0))[: len(padded)]
        if self.rank == src:
            assert tensors is not None, "the source rank sends its tensors"
            payload = torch.zeros(sum(padded), dtype=torch.uint8)
            for t, start, size in zip(tensors, starts, sizes, strict=True):
                payload[start : start + size] = _bytes_of(t)
        else:
            payload = torch.empty(sum(padded), dtype=torch.uint8)
        if payload.numel():
            dist.broadcast(payload, src=src, group=self._control)
        if self.rank == src:
            assert tensors is not None
            return tuple(tensors)
        return tuple(
            payload[start : start + size].view(dtype).reshape(shape)
            for start, size, (shape, dtype) in zip(starts, sizes, layout, strict=True)
        )

    def all_gather_tensor(self, t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self._control)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self._control)

    # -- point-to-point (either plane, chosen by the tensor's device) ---------------------
    # Operations join this rank's open group and go out together at `post` (one
    # `batch_isend_irecv` per plane): NCCL runs a group as one, so sends and receives that
    # cross between two ranks never wait for each other (`pipeline.pure.wire_order`). They
    # carry no tag (0): NCCL ignores tags and matches the messages between two ranks by
    # their order, so every caller posts them in the order its peer does
    # (`pipeline.distributed.links`, the ordering rule), and gloo is held to it too.
    def send(self, tensor: torch.Tensor, peer: int) -> Posted:
        """Join the open group with a send of `tensor` to rank `peer`."""
        return self._join(dist.isend, tensor, peer)

    def recv(self, tensor: torch.Tensor, peer: int) -> Posted:
        """Join the open group with a receive into `tensor` from rank `peer`."""
        return self._join(dist.irecv, tensor, peer)

    def post(self) -> None:
        """Post the open group: its operations start together; `Posted.wait` waits for one."""
        group, self._open = self._open, []
        for control in (True, False):  # a batch holds tensors of one device and one group
            ops = [
                (op, posted) for op, posted in group if (op.tensor.device.type == "cpu") == control
            ]
            if not ops:
                continue
            works: list[Any] = list(dist.batch_isend_irecv([op for op, _ in ops]))
            if len(works) != len(ops):  # coalesced (NCCL): one work stands for the group
                works = [_AllOf(works)] * len(ops)
            for (_, posted), work in zip(ops, works, strict=True):
                posted.attach(work)

    def _join(self, fn: Callable[..., Any], tensor: torch.Tensor, peer: int) -> Posted:
        plane = self._control if tensor.device.type == "cpu" else None
        posted = Posted(self)
        self._open.append((dist.P2POp(fn, tensor, peer, group=plane), posted))
        return posted

    # -- agreement -----------------------------------------------------------------------
    def agree(self, make: Callable[[], T]) -> T:
        """Run `make()` on rank 0 and return its (picklable) result on every rank.

        If `make()` raises, every rank raises the same exception.
        """
        outcome: Any = None
        if self.rank == 0:
            try:
                outcome = ("ok", make())
            except Exception as exc:
                outcome = ("error", _portable(exc, 0))
        status, value = self.broadcast_object(outcome, src=0)
        if status == "error":
            raise value
        return value

    def together(self, work: Callable[[], T]) -> T:
        """Run `work()` here; if it raised on any rank, raise that error on every rank.

        One all_reduce when every rank succeeds; an all_gather of the errors otherwise. The
        error of the lowest failing rank is raised (the original object on its own rank).
        """
        try:
            result = work()
        except Exception as exc:
            self.raise_together(exc)  # raises, on every rank
            raise
        self.raise_together(None)  # raises what failed on another rank, if any
        return result

    def raise_together(self, error: BaseException | None) -> None:
        """Collective: raise on every rank if any rank passes an error (else return)."""
        (failed,) = self.all_reduce([float(error is not None)])
        if not failed:
            return
        portable = None if error is None else _portable(error, self.rank)
        raise_first(self.all_gather_object(portable), self.rank, error)


class Posted:
    """One point-to-point operation of a group: waiting for it posts its group first.

    The `dist.Work` is dropped once waited for (see `_Held`)."""

    def __init__(self, comm: Comm) -> None:
        self._comm = comm
        self._work = _Held()

    @property
    def posted(self) -> bool:
        return self._work.posted

    def attach(self, work: Any) -> None:
        self._work.attach(work)

    def wait(self) -> None:
        if not self._work.posted:
            self._comm.post()
        self._work.wait()


class _Held:
    """A `dist.Work`, held until it is waited for and then dropped.

    A finished gloo send or receive still owns its buffer, the buffer its context, and the
    context gloo's TCP device, whose event-loop thread ("gloo_tcp_loop") runs until the last
    of them is freed: while anything still holds a waited Work (a pipeline a program keeps,
    or one in a reference cycle the collector has not reached), that thread outlives
    `destroy_process_group`, which joins only the group's own worker threads
    ("pt_gloo_runloop"): the thread a torchrun job was once found with at its exit
    (`tests/pipeline/distributed/test_launch.py`). Dropping the Work at its wait ties the
    thread's life to the group's.
    """

    def __init__(self) -> None:
        self._work: Any = None
        self._state = _WorkState.UNPOSTED

    @property
    def posted(self) -> bool:
        return self._state is not _WorkState.UNPOSTED

    def attach(self, work: Any) -> None:
        assert self._state is _WorkState.UNPOSTED, "an operation is posted once"
        self._work, self._state = work, _WorkState.POSTED

    def wait(self) -> None:
        assert self._state is not _WorkState.UNPOSTED, "waited for before it was posted"
        if self._state is _WorkState.POSTED:
            self._work.wait()
            self._work, self._state = None, _WorkState.DONE


class _WorkState(enum.Enum):
    UNPOSTED = enum.auto()
    POSTED = enum.auto()
    DONE = enum.auto()


class _AllOf:
    """The works of a coalesced group, waited for as one (and then dropped)."""

    def __init__(self, works: Sequence[Any]) -> None:
        self._works = list(works)

    def wait(self) -> None:
        works, self._works = self._works, []
        for work in works:
            work.wait()


class PendingReduce:
    """An all_reduce in flight: `wait()` gives its values (once it has been posted by all)."""

    def __init__(self, work: dist.Work, values: torch.Tensor) -> None:
        self._work = _Held()
        self._work.attach(work)
        self._values = values

    def wait(self) -> list[float]:
        self._work.wait()
        return [float(v) for v in self._values.tolist()]


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """A CPU tensor's bytes as one flat uint8 tensor (a view when it is contiguous)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def raise_first(
    errors: Sequence[BaseException | None], rank: int, mine: BaseException | None
) -> None:
    """Raise the error of the lowest rank that has one (this rank's own object if it is it)."""
    first = next((r for r, e in enumerate(errors) if e is not None), None)
    if first is None:
        raise PipelineError("a stage reported a failure but no stage holds its error")
    if first == rank and mine is not None:
        raise mine
    error = errors[first]
    assert error is not None
    raise error


def _portable(error: BaseException, rank: int) -> BaseException:
    """`error` as it can travel to other ranks: itself if it pickles, with where it happened."""
    if isinstance(error, StageError):
        return error
    text = "".join(traceback.format_exception(error))
    try:
        copy = pickle.loads(pickle.dumps(error))
    except Exception:
        return PipelineError(f"stage {rank} raised an error that cannot be pickled:\n{text}")
    copy.add_note(f"(raised on stage {rank}; its traceback there:)\n{text}")
    return copy


def leave_group() -> None:
    """Destroy this process's default group and every group made from it, leaving nothing
    of them behind (no gloo thread, no NCCL communicator) once it returns.

    `destroy_process_group` shuts every group down, but a group's transport lives on while
    any Python object still holds the group or one of its works: this module's own caches
    go first, and no object of the runtime holds a work once it is waited for (`_Held`).
    No garbage collection here: it would run any finalizer of the program's while the group
    is still whole, and one that talks to the group on one rank would wait for the others.
    """
    _CONTROL_GROUPS.clear()
    _DATA_PLANES.clear()
    dist.destroy_process_group()


def _start_data_plane(device: torch.device) -> None:
    """Create NCCL's communicator of the whole group now, with every rank (collective):
    batched point-to-point operations use it, and a batch that is its first use must
    involve every rank (torch.distributed.batch_isend_irecv)."""
    key = id(dist.group.WORLD)
    if key not in _DATA_PLANES:
        dist.all_reduce(torch.zeros(1, device=device))
        _DATA_PLANES.add(key)


def _control_group() -> Any:
    """A gloo group over all ranks for an NCCL-only default group (created once; collective)."""
    key = id(dist.group.WORLD)
    if key not in _CONTROL_GROUPS:
        _CONTROL_GROUPS[key] = dist.new_group(backend="gloo")
    return _CONTROL_GROUPS[key]
