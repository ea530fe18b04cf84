"""Messages between neighbouring stages: activations forward, gradients back, or a failure.

A carry is a tuple of tensors whose shapes the receiver does not know in advance (a NAS
candidate may change them from one step to the next), and a stage may fail half-way through
a step while its neighbours wait for it. What travels, per step and direction:

    header   once per step, before the first activation frame (control plane):
             [ok?, n tensors, per tensor: dtype code, carries a gradient?, ndim, dims...]
    frame    one per micro-batch: a status [ok?] (control plane), then its tensors (data
             plane: CUDA under NCCL): activations all of them, gradients the floating ones

    healthy sender                           receiver
    header(ok)  ── first frame only ───>     waited once: the size of every frame
    status_i(ok), data_i ──────────────>     frame i waited: ok -> the carry

    failed sender, for every frame it still owes this step (see `pipeline.distributed.executor`)
    header(failed) ── if none sent yet ─>
    status_i(failed), dummies_i ───────>     frame i waited: failed -> PeerFailed
                      (dummies iff the header said ok: the frame keeps its size)

Every receive a stage posts is matched by a send, failed or not, so nothing stays in flight
into the next step and the failing stage's neighbours are unblocked at once: they learn of
the failure from the frame they were waiting for, go on draining and sending failures
themselves, and the step ends with every rank knowing.

The ordering rules. NCCL ignores tags: between two ranks, in each direction, the n-th
message received is the n-th sent. It buffers nothing, and runs a rank's batched messages on
one stream, group after group. So no message has a tag, and the order and the grouping
alone must be right, by construction (`pipeline.pure.wire_order` checks both for every list
`validate` accepts, healthy and failing, under these rules):

    1. Frames follow the action lists: a sender sends one frame per SEND action, in list
       order; a receiver posts one per RECV action, in list order; the schedule gives both
       ends the same micro-batch order. A failed stage still walks its whole list, sending
       a failed frame in place of each one it owes, so a failure changes no order.
    2. A frame's size is known to both ends before it is posted: activation frames from
       the header, gradient frames from the header the gradient's receiver sent itself; a
       failed header means frames of a status alone.
    3. Messages join the rank's open group (`Comm.send`, `Comm.recv`); the executor posts
       the group before every compute action, and anything that waits posts it first
       (`Posted.wait`). `lower` places each receive just before the action that consumes
       it, after the sends of the compute before: the sends of one compute and the receive
       of the next go out as one group, which NCCL runs as one.
    4. The header is the first message of a step in its direction. The receiver's first
       RECV_ACT posts the open group, then receives the header and waits for it (on the
       host), then posts the frame: it never waits on what its own open group holds.
    5. Outside the frames, Bi-Partition's handed layers (`pipeline.distributed.handoff`)
       send weights before a step's first frame and gradients after its sends completed,
       each exchange in one group; both ends know the tensors and post them in one order.

`wait` raises on the process group's timeout: a dead peer never hangs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from pipeline.distributed.comm import Comm, Posted
from pipeline.local.carry import Carry

__all__ = ["ACT", "GRAD", "PeerFailed", "PeerLink", "Receive", "TensorMeta", "carry_meta"]

_MAX_TENSORS = 32
_MAX_DIMS = 8
_FIELDS = 3 + _MAX_DIMS  # dtype code, requires_grad, ndim, dims...
_HEADER_LEN = 2 + _MAX_TENSORS * _FIELDS
_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]

ACT, GRAD = 0, 1  # frame kinds: activations travel down the pipeline, gradients up
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
    return tuple(
        TensorMeta(tuple(t.shape), t.dtype, bool(g) and t.is_floating_point())
        for t, g in zip(carry, flags, strict=True)
    )


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


class Receive:
    """A receive of one micro-batch's frame from `peer`: its status and its tensors, laid
    out as `metas` (rule 2), joining the open group at once, in RECV order (rule 3)."""

    def __init__(self, comm: Comm, peer: int, metas: Sequence[TensorMeta]) -> None:
        self._peer, self._status = peer, torch.zeros(1, dtype=torch.int64)
        self._tensors = [
            torch.empty(m.shape, dtype=m.dtype, device=comm.data_device) for m in metas
        ]
        self._works = [comm.recv(t, peer) for t in (self._status, *self._tensors)]

    def _finish(self) -> bool:
        """Wait for the status and the tensors that follow it; True if the sender was ok."""
        for work in self._works:
            work.wait()
        return int(self._status.item()) == _OK

    def wait(self) -> Carry:
        """The received tensors; raises `PeerFailed` (after draining) if the peer failed."""
        if not self._finish():
            raise PeerFailed(f"stage {self._peer} failed")
        return tuple(self._tensors)

    def drain(self) -> None:
        """Wait for the message and drop it, failed or not."""
        self._finish()


class PeerLink:
    """Messages with one neighbouring stage (`peer`), in both directions (module doc)."""

    def __init__(self, comm: Comm, peer: int) -> None:
        self.comm, self.peer = comm, peer
        # sends not yet waited for, each with its tensor (kept alive until the send is done)
        # and its micro-batch: `wait_sends` ends a step; a stream releases the micro-batches
        # its agreements prove received (`release_sends`), so it holds only those in flight
        self._sends: list[tuple[Posted, torch.Tensor, float]] = []
        self.begin_step()

    def begin_step(self) -> None:
        self.inbound_meta: tuple[TensorMeta, ...] | None = None  # of activations we receive
        self.grad_meta: tuple[TensorMeta, ...] | None = None  # of activations we sent (ok)
        self.inbound_header: bool | None = None  # None: not yet received; then ok?
        self.header_sent: bool | None = None  # None: not yet sent; then ok?
        self._last_sent: dict[int, int] = {}  # kind -> the micro-batch of its last frame

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
            self._send_tensor(header, microbatch)
        elif metas != self.grad_meta:
            raise RuntimeError(
                f"micro-batch {microbatch} produced a carry {metas} that differs from the "
                f"first micro-batch's {self.grad_meta}; all micro-batches of a step must "
                "have the same shapes"
            )
        self._send(ACT, microbatch, [t.detach() for t in carry])

    def recv_activations(self, microbatch: int) -> Receive:
        if self.inbound_header is None:  # rule 4: post the open group, then the header
            self.comm.post()
            header = torch.empty(_HEADER_LEN, dtype=torch.int64)
            self.comm.recv(header, self.peer).wait()
            self.inbound_meta = _decode(header)
            self.inbound_header = self.inbound_meta is not None
        return self._receive(ACT, microbatch)

    # -- gradients -----------------------------------------------------------------------
    def send_gradients(self, grads: Sequence[torch.Tensor], microbatch: int) -> None:
        self._send(GRAD, microbatch, list(grads))

    def recv_gradients(self, microbatch: int) -> Receive:
        return self._receive(GRAD, microbatch)

    # -- failure -------------------------------------------------------------------------
    def send_failure(self, kind: int, microbatch: int) -> None:
        """Send a failure in place of a frame this stage owes (module docstring); none if
        that very frame was sent whole (its send action failed after sending)."""
        if self._last_sent.get(kind) == microbatch:
            return
        if kind == ACT and self.header_sent is None:
            self.header_sent = False
            self._send_tensor(_encode((), ok=False), microbatch)
        dummies = self._layout(kind, sending=True)
        assert dummies is not None, "a frame's failure is sent after its header is settled"
        device = self.comm.data_device
        tensors = [torch.empty(m.shape, dtype=m.dtype, device=device) for m in dummies]
        self._send(kind, microbatch, tensors, ok=False)

    # -- state between steps (Bi-Partition's handed layers) ---------------------------------
    def send_state(self, tensors: Sequence[torch.Tensor]) -> None:
        """Send tensors whose shapes both ends know (handed layers' weights or gradients)
        outside the step's frames (rule 4); `wait_sends` completes them."""
        for t in tensors:
            self._send_tensor(t.detach(), math.inf)

    def recv_state(self, buffers: Sequence[torch.Tensor]) -> None:
        """Receive into `buffers`, in order, what the peer's `send_state` sent; waits (the
        open group, with any `send_state` before it, goes out as one)."""
        works = [self.comm.recv(b, self.peer) for b in buffers]
        for work in works:
            work.wait()

    # -- frames in order (rules 1-3) --------------------------------------------------------
    def _layout(self, kind: int, sending: bool = False) -> Sequence[TensorMeta] | None:
        """The tensors of a `kind` frame as both ends know them; None: not known yet.

        Activations: the header's metas (none after a failed header). Gradients: the
        floating tensors of the activations this stage sent (none after a failed header).
        `sending`: the sender's side of a failure's dummies (activations: what it sent;
        gradients: what it received), the same sizes the receiver posts."""
        if (kind == ACT) != sending:
            ok, metas = self.inbound_header, self.inbound_meta
        else:
            ok, metas = self.header_sent, self.grad_meta
        if ok is None:
            return None
        if not ok:
            return ()
        assert metas is not None
        return metas if kind == ACT else [m for m in metas if m.requires_grad]

    def _receive(self, kind: int, microbatch: int) -> Receive:
        metas = self._layout(kind)
        # known: `validate` refuses a list that receives a gradient before it sent anything
        assert metas is not None, f"frame {kind}/{microbatch}: size unknown"
        return Receive(self.comm, self.peer, metas)

    def _send(
        self, kind: int, microbatch: int, tensors: list[torch.Tensor], ok: bool = True
    ) -> None:
        self._send_tensor(torch.tensor([_OK if ok else _FAILED], dtype=torch.int64), microbatch)
        for t in tensors:
            self._send_tensor(t, microbatch)
        self._last_sent[kind] = microbatch

    def _send_tensor(self, tensor: torch.Tensor, microbatch: float) -> None:
        tensor = tensor.contiguous()
        self._sends.append((self.comm.send(tensor, self.peer), tensor, microbatch))

    @property
    def sends_in_flight(self) -> int:
        """Sends posted and not yet waited for (read-only; for monitoring)."""
        return len(self._sends)

    def wait_sends(self) -> None:
        sends, self._sends = self._sends, []
        for work, _tensor, _microbatch in sends:
            work.wait()

    def release_sends(self, below: int) -> None:
        """Wait for (and drop) the posted sends of micro-batches numbered below `below`.
        Only for messages the caller knows were received (the wait then returns at once): a
        stream knows it of every message of step t once the agreement A(t) completes."""
        done = [s for s in self._sends if s[2] < below and s[0].posted]
        self._sends = [s for s in self._sends if not (s[2] < below and s[0].posted)]
        for work, _tensor, _microbatch in done:
            work.wait()
