"""Ship nested objects full of tensors between ranks as raw bytes: the migration wire format.

A migrating layer is a nest of dicts and lists holding its parameters, gradients and
optimizer state. `torch.save` into a buffer and `torch.load` out of it copy every byte three
or four times and serialise each tensor through a zip record, which made moving 160 MB take
seconds on one CPU core. Here each object is split into

    skeleton  the nest with every tensor replaced by a `_Slot` (pickled: a few KB)
    data      every tensor's bytes, one after another in one uint8 buffer, each at an
              offset aligned to `_ALIGN` bytes (one copy on the sender)

and the receiver rebuilds the tensors as views into the received buffer (no copy). Packing
(`pack_all`) is local work that can fail (an object that does not pickle), so callers do it
first and agree on its outcome; the exchange between all ranks then only moves bytes:

    1. all_gather of a (world, 2) table: the skeleton and data sizes each rank sends to each
    2. every rank posts receives for what is coming and sends for what it sends as one
       group (`Comm.post`), so two ranks may swap objects without deadlock; between two
       ranks the skeleton goes before the data and both ends post them in that order, so
       every message has no tag and matches by order alone, as NCCL matches
       (`pipeline.distributed.links`)
    3. wait for all; unpickle the skeletons and put the tensors back in
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.distributed.comm import Comm

__all__ = ["Packed", "exchange", "pack", "pack_all", "unpack"]

_ALIGN = 64  # bytes; any dtype's element size divides it, so views of the buffer are legal


@dataclass(frozen=True)
class _Slot:
    """Where a tensor's bytes lie in the data buffer."""

    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    requires_grad: bool


def _replace_tensors(obj: Any, tensors: list[tuple[int, torch.Tensor]], end: list[int]) -> Any:
    """`obj` with each tensor replaced by its slot; (offset, tensor) pairs go to `tensors`."""
    if torch.is_tensor(obj):
        t = obj.detach().cpu().contiguous()
        tensors.append((end[0], t))
        end[0] += -(-t.numel() * t.element_size() // _ALIGN) * _ALIGN
        return _Slot(tensors[-1][0], t.dtype, tuple(t.shape), obj.requires_grad)
    if isinstance(obj, dict):
        return {k: _replace_tensors(v, tensors, end) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        items = [_replace_tensors(v, tensors, end) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def pack(obj: Any) -> tuple[bytes, torch.Tensor]:
    """(pickled skeleton, uint8 data buffer) of a nest of dicts, lists, tuples and tensors."""
    tensors: list[tuple[int, torch.Tensor]] = []
    end = [0]
    skeleton = _replace_tensors(obj, tensors, end)
    data = torch.empty(end[0], dtype=torch.uint8)
    for offset, t in tensors:
        n = t.numel() * t.element_size()
        if n:
            data[offset : offset + n] = t.reshape(-1).view(torch.uint8)
    return pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL), data


def _restore(obj: Any, data: torch.Tensor) -> Any:
    if isinstance(obj, _Slot):
        size = torch.Size(obj.shape).numel() * torch.empty((), dtype=obj.dtype).element_size()
        view = data[obj.offset : obj.offset + size].view(obj.dtype).reshape(obj.shape)
        return view.requires_grad_(obj.requires_grad)
    if isinstance(obj, dict):
        return {k: _restore(v, data) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        items = [_restore(v, data) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    return obj


def unpack(skeleton: bytes, data: torch.Tensor) -> Any:
    """The object `pack` was given; its tensors are views into `data` (CPU)."""
    return _restore(pickle.loads(skeleton), data)


Packed = tuple[bytes, torch.Tensor]  # (pickled skeleton, data buffer)


def pack_all(outgoing: dict[int, Any], rank: int) -> dict[int, Packed | Any]:
    """`pack` every object bound for another rank (what stays here is kept as it is).

    Local work: call it where a failure can still be agreed on before `exchange`.
    """
    return {dst: obj if dst == rank else pack(obj) for dst, obj in outgoing.items()}


def exchange(comm: Comm, packed: dict[int, Packed | Any]) -> dict[int, Any]:
    """Send `packed[dst]` (from `pack_all`) to each rank dst; return what each rank sent here.

    A collective: every rank calls it, with an empty dict if it sends nothing.
    """
    rank, world = comm.rank, comm.world_size
    received: dict[int, Any] = {}
    if rank in packed:  # what stays on this rank needs no message
        received[rank] = packed[rank]
    remote: dict[int, Packed] = {dst: v for dst, v in packed.items() if dst != rank}
    row = torch.zeros(world, 2, dtype=torch.int64)  # (skeleton bytes, data bytes) per dst
    for dst, (skeleton, data) in remote.items():
        row[dst, 0], row[dst, 1] = len(skeleton), data.numel()
    table = comm.all_gather_tensor(row)
    works, buffers = [], {}
    for src in range(world):
        n_skeleton, n_data = (int(v) for v in table[src][rank])
        if n_skeleton:
            buffers[src] = (
                torch.empty(n_skeleton, dtype=torch.uint8),
                torch.empty(n_data, dtype=torch.uint8),
            )
            works.append(comm.recv(buffers[src][0], src))
            if n_data:
                works.append(comm.recv(buffers[src][1], src))
    for dst, (skeleton, data) in remote.items():
        works.append(comm.send(torch.frombuffer(bytearray(skeleton), dtype=torch.uint8), dst))
        if data.numel():
            works.append(comm.send(data, dst))
    for work in works:
        work.wait()
    for src, (skeleton_buf, data) in buffers.items():
        received[src] = unpack(skeleton_buf.numpy().tobytes(), data)
    return received
