"""`Comm`: the one owner of every collective and point-to-point message in `pipeline/`.

No other module of the runtime calls `torch.distributed` collectives or point-to-point
operations (`tests/test_import_rules.py` checks it). Keeping them here makes two things
right by construction:

* **Devices.** Two planes, each on the device its backend accepts::

      control plane   CPU tensors and pickled objects: plans, carry headers, status words,
                      migration buffers, trigger flags, losses, errors
      data plane      activations and gradients: CUDA tensors over NCCL when the stages
                      have GPUs, CPU tensors over gloo otherwise

  `launch` creates the default group as "cpu:gloo,cuda:nccl" on GPUs, so a CPU tensor goes
  through gloo and a CUDA tensor through NCCL in the same group. Under torchrun with an
  NCCL-only group, `Comm` creates one gloo group for the control plane.
* **Errors.** `together(fn)` runs a local piece of work and agrees on its outcome: if it
  raised on any rank, the same exception is raised on every rank (no rank is left waiting
  in the next collective). `agree(make)` runs a decision on rank 0 and hands its result, or
  its exception, to every rank.

Every operation times out after the process group's timeout, so a dead peer raises.
"""

from __future__ import annotations

import pickle
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from pipeline.errors import PipelineError, StageError

__all__ = ["Comm", "PendingReduce", "raise_first"]

T = TypeVar("T")

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
_CONTROL_GROUPS: dict[int, Any] = {}  # id(default group) -> its gloo group (NCCL-only groups)


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

    def all_gather_tensor(self, t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(self.world_size)]
        dist.all_gather(out, t, group=self._control)
        return out

    def barrier(self) -> None:
        dist.barrier(group=self._control)

    # -- point-to-point (either plane, chosen by the tensor's device) ---------------------
    # Point-to-point messages carry no tag (0): NCCL ignores tags and matches the messages
    # between two ranks by their order, so every caller posts them in the order its peer
    # does (`pipeline.distributed.links`, the ordering rule), and gloo is held to it too.
    def isend(self, tensor: torch.Tensor, peer: int) -> dist.Work:
        return _posted(dist.isend(tensor, peer, group=self._group_for(tensor)))

    def irecv(self, tensor: torch.Tensor, peer: int) -> dist.Work:
        return _posted(dist.irecv(tensor, peer, group=self._group_for(tensor)))

    def _group_for(self, tensor: torch.Tensor) -> Any:
        return self._control if tensor.device.type == "cpu" else None

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
            result, error = work(), None
        except Exception as exc:
            result, error = None, exc
        self.raise_together(error)
        return result  # type: ignore[return-value]

    def raise_together(self, error: BaseException | None) -> None:
        """Collective: raise on every rank if any rank passes an error (else return)."""
        (failed,) = self.all_reduce([float(error is not None)])
        if not failed:
            return
        portable = None if error is None else _portable(error, self.rank)
        raise_first(self.all_gather_object(portable), self.rank, error)


class PendingReduce:
    """An all_reduce in flight: `wait()` gives its values (once it has been posted by all)."""

    def __init__(self, work: dist.Work, values: torch.Tensor) -> None:
        self._work, self._values = work, values

    def wait(self) -> list[float]:
        self._work.wait()
        return [float(v) for v in self._values.tolist()]


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


def _posted(work: dist.Work | None) -> dist.Work:
    assert work is not None, "point-to-point operations return a Work"
    return work


def _control_group() -> Any:
    """A gloo group over all ranks for an NCCL-only default group (created once; collective)."""
    key = id(dist.group.WORLD)
    if key not in _CONTROL_GROUPS:
        _CONTROL_GROUPS[key] = dist.new_group(backend="gloo")
    return _CONTROL_GROUPS[key]
