"""Messages between neighbouring stages: activations forward, gradients back, or a failure.

A carry is a tuple of tensors whose shapes the receiver does not know in advance (a NAS
candidate may change them from one step to the next), and a stage may fail half-way through
a step while its neighbours wait for it. The wire protocol, per step and direction:

    header   once per step, before the first status (activations only, control plane):
             [ok?, n tensors, per tensor: dtype code, carries a gradient?, ndim, dims...]
    status   one per micro-batch message: [ok?] (control plane)
    data     the tensors: activations all of them, gradients the floating ones; one tag
             each (data plane: CUDA under NCCL)

    healthy sender                           receiver (posts early, waits when it needs)
    header(ok)  ── first message only ──>    wait once: shapes of every data message
    status_i(ok) ──────────────────────>     wait status_i: ok
    data_i ────────────────────────────>     wait data_i -> the carry

    failed sender, for every message it still owes this step (see `pipeline.distributed.executor`)
    header(failed) ── if none sent yet ─>
    status_i(failed) ──────────────────>     wait status_i: failed -> drain, raise PeerFailed
    dummies_i ── iff header(ok) was sent ─>  drain data_i iff the header said ok

Every receive a stage posts is matched by a send, failed or not, so nothing stays in flight
into the next step and the failing stage's neighbours are unblocked at once: they learn of
the failure from the message they were waiting for, go on draining and sending failures
themselves, and the step ends with every rank knowing. Dummies follow a failed status
exactly when the step's header was ok, and both ends can tell which case they are in: the
activation receiver from the header, the gradient receiver from the header it sent, the
gradient sender from the header it received (a stage always waits for micro-batch i's
activations, or their failure, before it owes i's gradient).

Messages carry their own tags (kind, micro-batch, index), so receives can be posted early
and out of order. `wait` raises on the process group's timeout: a dead peer never hangs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.distributed.comm import Comm
from pipeline.local.carry import Carry

__all__ = ["ACT", "GRAD", "PeerFailed", "PeerLink", "Receive", "TensorMeta", "carry_meta"]

_MAX_TENSORS = 32
_MAX_DIMS = 8
_FIELDS = 3 + _MAX_DIMS  # dtype code, requires_grad, ndim, dims...
_HEADER_LEN = 2 + _MAX_TENSORS * _FIELDS
_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
]  # fmt: skip

ACT, GRAD = 0, 1  # message kinds; their tags are apart from the header's and the statuses'
_HEADER, _STATUS = 2, 3
_OK, _FAILED = 1, 0


class PeerFailed(Exception):
    """The neighbour sent a failure in place of the message; it has been drained."""


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool  # a gradient flows back for this tensor: it is floating point


def carry_meta(carry: Carry, grads: Sequence[bool] | None = None) -> tuple[TensorMeta, ...]:
    """The metas of a carry; `grads` says which tensors get a gradient back (default: the
    floating ones; Bi-Partition sends tensors that only ride along)."""
    flags = [t.is_floating_point() for t in carry] if grads is None else list(grads)
    if len(flags) != len(carry):
        raise ValueError(f"{len(flags)} gradient flags for a carry of {len(carry)} tensors")
    return tuple(TensorMeta(tuple(t.shape), t.dtype, bool(g) and t.is_floating_point())
                 for t, g in zip(carry, flags, strict=True))  # fmt: skip


def _encode(metas: Sequence[TensorMeta], ok: bool = True) -> torch.Tensor:
    if len(metas) > _MAX_TENSORS:
        raise ValueError(f"a carry holds at most {_MAX_TENSORS} tensors, got {len(metas)}")
    header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
    header[0], header[1] = (_OK if ok else _FAILED), len(metas)
    for i, meta in enumerate(metas):
        if len(meta.shape) > _MAX_DIMS:
            raise ValueError(f"carry tensors have at most {_MAX_DIMS} dims, got {meta.shape}")
        if meta.dtype not in _DTYPES:
            raise TypeError(
                f"cannot send a carry tensor of dtype {meta.dtype}; valid dtypes: {_DTYPES}"
            )
        base = 2 + i * _FIELDS
        fields = [_DTYPES.index(meta.dtype), int(meta.requires_grad), len(meta.shape)]
        header[base : base + 3 + len(meta.shape)] = torch.tensor([*fields, *meta.shape])
    return header


def _decode(header: torch.Tensor) -> tuple[TensorMeta, ...] | None:
    """The metas of an ok header; None for a failed one."""
    values = header.tolist()
    if values[0] != _OK:
        return None
    metas = []
    for i in range(values[1]):
        base = 2 + i * _FIELDS
        code, grad, ndim = values[base : base + 3]
        shape = tuple(values[base + 3 : base + 3 + ndim])
        metas.append(TensorMeta(shape, _DTYPES[code], bool(grad)))
    return tuple(metas)


def _tag(kind: int, microbatch: int, index: int) -> int:
    return (microbatch * 4 + kind) * (_MAX_TENSORS + 1) + index


def _state_tag(channel: int, j: int) -> int:
    """Tags past the header's (micro-batch 0 of the header kind): micro-batches >= 1."""
    return _tag(_HEADER, 1 + 2 * (j // _MAX_TENSORS) + channel, j % _MAX_TENSORS)


class Receive:
    """A posted receive of one micro-batch's carry (or its gradients) and its status."""

    def __init__(self, link: PeerLink, kind: int, microbatch: int) -> None:
        self._link, self._kind, self._microbatch = link, kind, microbatch
        self._status = torch.zeros(1, dtype=torch.int64)
        status_tag = _tag(_STATUS, microbatch, kind)
        self._status_work = link.comm.irecv(self._status, link.peer, status_tag)
        self._works: list[dist.Work] = []
        self._tensors: list[torch.Tensor] | None = None
        if self._metas() is not None:
            self._post()

    def _metas(self) -> Sequence[TensorMeta] | None:
        link = self._link
        if self._kind == ACT:
            return link.inbound_meta
        if link.grad_meta is None:
            return None
        return [m for m in link.grad_meta if m.requires_grad]

    def _post(self) -> None:
        metas, link = self._metas(), self._link
        assert metas is not None
        device = link.comm.data_device
        self._tensors = [torch.empty(m.shape, dtype=m.dtype, device=device) for m in metas]
        for i, t in enumerate(self._tensors):
            self._works.append(link.comm.irecv(t, link.peer, _tag(self._kind, self._microbatch, i)))

    def _finish(self) -> bool:
        """Wait for the status and whatever data follows it; True if the sender was ok."""
        self._status_work.wait()
        ok = int(self._status.item()) == _OK
        if self._tensors is None:
            if self._kind == ACT:
                self._link.wait_header()
            if self._metas() is not None:  # ok header (or gradients of an ok send): data
                self._post()
        for work in self._works:
            work.wait()
        return ok

    def wait(self) -> Carry:
        """The received tensors; raises `PeerFailed` (after draining) if the peer failed."""
        if not self._finish():
            raise PeerFailed(f"stage {self._link.peer} failed")
        assert self._tensors is not None
        return tuple(self._tensors)

    def drain(self) -> None:
        """Wait for the message and drop it, failed or not."""
        self._finish()


class PeerLink:
    """Messages with one neighbouring stage (`peer`), in both directions."""

    def __init__(self, comm: Comm, peer: int) -> None:
        self.comm, self.peer = comm, peer
        # sends not yet waited for, each with its tensor (kept alive until the send is done)
        # and its micro-batch: `wait_sends` ends a step; a stream releases the micro-batches
        # its agreements prove received (`release_sends`), so it holds only those in flight
        self._sends: list[tuple[dist.Work, torch.Tensor, float]] = []
        self.begin_step()

    def begin_step(self) -> None:
        self.inbound_meta: tuple[TensorMeta, ...] | None = None  # of activations we receive
        self.grad_meta: tuple[TensorMeta, ...] | None = None  # of activations we sent (ok)
        self.inbound_header: bool | None = None  # None: not yet received; then ok?
        self.header_sent: bool | None = None  # None: not yet sent; then ok?
        self._header_recv: tuple[torch.Tensor, dist.Work] | None = None
        self._last_sent: dict[int, int] = {}  # kind -> the micro-batch of its last message

    # -- activations ---------------------------------------------------------------------
    def send_activations(
        self, carry: Carry, microbatch: int, grads: Sequence[bool] | None = None
    ) -> None:
        """Send one micro-batch's carry; checks it before anything goes on the wire.
        `grads`: which tensors get a gradient back (`carry_meta`)."""
        metas = carry_meta(carry, grads)
        if self.header_sent is None:
            header = _encode(metas)  # raises on an unsupported carry: nothing sent yet
            self.grad_meta, self.header_sent = metas, True
            self._isend(header, _tag(_HEADER, 0, 0), microbatch)
        elif metas != self.grad_meta:
            raise RuntimeError(
                f"micro-batch {microbatch} produced a carry {metas} that differs from the "
                f"first micro-batch's {self.grad_meta}; all micro-batches of a step must "
                "have the same shapes"
            )
        self._send(ACT, microbatch, [t.detach() for t in carry])

    def recv_activations(self, microbatch: int) -> Receive:
        if self.inbound_header is None and self._header_recv is None:
            header = torch.empty(_HEADER_LEN, dtype=torch.int64)
            self._header_recv = (header, self.comm.irecv(header, self.peer, _tag(_HEADER, 0, 0)))
        return Receive(self, ACT, microbatch)

    def wait_header(self) -> None:
        if self.inbound_header is not None:
            return
        assert self._header_recv is not None, "no header was posted"
        header, work = self._header_recv
        work.wait()
        self.inbound_meta, self._header_recv = _decode(header), None
        self.inbound_header = self.inbound_meta is not None

    # -- gradients -----------------------------------------------------------------------
    def send_gradients(self, grads: Sequence[torch.Tensor], microbatch: int) -> None:
        self._send(GRAD, microbatch, list(grads))

    def recv_gradients(self, microbatch: int) -> Receive:
        return Receive(self, GRAD, microbatch)

    # -- failure -------------------------------------------------------------------------
    def send_failure(self, kind: int, microbatch: int) -> None:
        """Send a failure in place of a message this stage owes (module docstring); none
        if that very message was sent whole (its send action failed after sending)."""
        if self._last_sent.get(kind) == microbatch:
            return
        dummies: Sequence[TensorMeta] = ()
        if kind == ACT:
            if self.header_sent is None:
                self.header_sent = False
                self._isend(_encode((), ok=False), _tag(_HEADER, 0, 0), microbatch)
            if self.header_sent:
                assert self.grad_meta is not None
                dummies = self.grad_meta
        elif self.inbound_header:
            assert self.inbound_meta is not None
            dummies = [m for m in self.inbound_meta if m.requires_grad]
        device = self.comm.data_device
        tensors = [torch.empty(m.shape, dtype=m.dtype, device=device) for m in dummies]
        self._send(kind, microbatch, tensors, ok=False)

    # -- state between steps (Bi-Partition's handed layers) ---------------------------------
    def send_state(self, tensors: Sequence[torch.Tensor], channel: int) -> None:
        """Send tensors whose shapes both ends know (handed layers' gradients, channel 0, or
        weights, channel 1) outside the step's messages; `wait_sends` completes them."""
        for j, t in enumerate(tensors):
            self._isend(t.detach(), _state_tag(channel, j), math.inf)

    def recv_state(self, buffers: Sequence[torch.Tensor], channel: int) -> None:
        """Receive into `buffers` what the peer's `send_state` sent on `channel`; waits."""
        works = [self.comm.irecv(b, self.peer, _state_tag(channel, j))
                 for j, b in enumerate(buffers)]  # fmt: skip
        for work in works:
            work.wait()

    # -- completion ----------------------------------------------------------------------
    def _send(
        self, kind: int, microbatch: int, tensors: list[torch.Tensor], ok: bool = True
    ) -> None:
        status = torch.tensor([_OK if ok else _FAILED], dtype=torch.int64)
        self._isend(status, _tag(_STATUS, microbatch, kind), microbatch)
        for i, t in enumerate(tensors):
            self._isend(t, _tag(kind, microbatch, i), microbatch)
        self._last_sent[kind] = microbatch

    def _isend(self, tensor: torch.Tensor, tag: int, microbatch: float) -> None:
        tensor = tensor.contiguous()
        self._sends.append((self.comm.isend(tensor, self.peer, tag), tensor, microbatch))

    @property
    def sends_in_flight(self) -> int:
        """Sends posted and not yet waited for (read-only; for monitoring)."""
        return len(self._sends)

    def wait_sends(self) -> None:
        sends, self._sends = self._sends, []
        for work, _tensor, _microbatch in sends:
            work.wait()

    def release_sends(self, below: int) -> None:
        """Wait for (and drop) the sends of micro-batches numbered below `below`. Only for
        messages the caller knows were received (the wait then returns at once): a stream
        knows it of every message of step t once the agreement A(t) completes."""
        done = [s for s in self._sends if s[2] < below]
        self._sends = [s for s in self._sends if s[2] >= below]
        for work, _tensor, _microbatch in done:
            work.wait()
