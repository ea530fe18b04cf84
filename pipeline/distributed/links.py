"""Point-to-point messages between neighbouring stages: activations forward, gradients back.

A carry is a tuple of tensors whose shapes the receiver does not know in advance (a NAS
candidate may change them from one step to the next). The protocol per step and direction:

    1. The first activation message of a step is preceded by a header: a fixed-size int64
       tensor with, per carry tensor, its dtype, whether it carries a gradient, and shape.
    2. All micro-batches of a step have the same shapes (they are equal chunks of one
       batch), so later receives are posted straight away with the shapes of the header.
    3. Gradients flow back for the floating-point tensors of the carry (the header marks
       them); their shapes are those of the activations, so they need no header.

Every message has its own tag (kind, micro-batch, tensor index), so receives can be posted
early and out of order. Sends and receives are non-blocking; `wait` raises on the process
group's timeout, so a dead peer never hangs a stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from pipeline.local.carry import Carry

__all__ = ["PeerLink", "Receive", "TensorMeta", "carry_meta"]

_MAX_TENSORS = 32
_MAX_DIMS = 8
_FIELDS = 3 + _MAX_DIMS  # dtype code, requires_grad, ndim, dims...
_HEADER_LEN = 1 + _MAX_TENSORS * _FIELDS
_DTYPES = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
]  # fmt: skip

ACT, GRAD, HEADER = 0, 1, 2


@dataclass(frozen=True)
class TensorMeta:
    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool  # a gradient flows back for this tensor: it is floating point


def carry_meta(carry: Carry) -> tuple[TensorMeta, ...]:
    return tuple(
        TensorMeta(tuple(t.shape), t.dtype, t.is_floating_point())
        for t in carry
    )


def _encode(metas: Sequence[TensorMeta]) -> torch.Tensor:
    if len(metas) > _MAX_TENSORS:
        raise ValueError(f"a carry holds at most {_MAX_TENSORS} tensors, got {len(metas)}")
    header = torch.zeros(_HEADER_LEN, dtype=torch.int64)
    header[0] = len(metas)
    for i, meta in enumerate(metas):
        if len(meta.shape) > _MAX_DIMS:
            raise ValueError(f"carry tensors have at most {_MAX_DIMS} dims, got {meta.shape}")
        if meta.dtype not in _DTYPES:
            raise TypeError(f"cannot send a carry tensor of dtype {meta.dtype}")
        base = 1 + i * _FIELDS
        fields = [_DTYPES.index(meta.dtype), int(meta.requires_grad), len(meta.shape)]
        header[base : base + 3 + len(meta.shape)] = torch.tensor([*fields, *meta.shape])
    return header


def _decode(header: torch.Tensor) -> tuple[TensorMeta, ...]:
    values = header.tolist()
    metas = []
    for i in range(values[0]):
        base = 1 + i * _FIELDS
        code, grad, ndim = values[base : base + 3]
        shape = tuple(values[base + 3 : base + 3 + ndim])
        metas.append(TensorMeta(shape, _DTYPES[code], bool(grad)))
    return tuple(metas)


def _posted(work: dist.Work | None) -> dist.Work:
    assert work is not None, "point-to-point operations on the default group return a Work"
    return work


def _tag(kind: int, microbatch: int, index: int) -> int:
    return (microbatch * 3 + kind) * (_MAX_TENSORS + 1) + index


class Receive:
    """A posted receive of one carry (or of its gradients); `wait()` returns the tensors."""

    def __init__(self, link: PeerLink, kind: int, microbatch: int) -> None:
        self._link, self._kind, self._microbatch = link, kind, microbatch
        self._works: list[dist.Work] = []
        self._tensors: list[torch.Tensor] | None = None
        if self._metas() is not None:
            self._post()

    def _metas(self) -> Sequence[TensorMeta] | None:
        link = self._link
        return link.inbound_meta if self._kind == ACT else link.grad_meta

    def _post(self) -> None:
        metas = self._metas()
        assert metas is not None
        if self._kind == GRAD:
            metas = [m for m in metas if m.requires_grad]
        link = self._link
        self._tensors = [torch.empty(m.shape, dtype=m.dtype, device=link.device) for m in metas]
        for i, t in enumerate(self._tensors):
            tag = _tag(self._kind, self._microbatch, i)
            self._works.append(_posted(dist.irecv(t, link.peer, tag=tag)))

    def wait(self) -> Carry:
        if self._tensors is None:  # shapes were unknown when posted
            if self._kind == ACT:  # first activations of the step: the header comes first
                self._link.wait_header()
            self._post()
        for work in self._works:
            work.wait()
        assert self._tensors is not None
        return tuple(self._tensors)


class PeerLink:
    """Messages with one neighbouring stage (`peer`), in both directions."""

    def __init__(self, peer: int, device: torch.device) -> None:
        self.peer, self.device = peer, device
        self.inbound_meta: tuple[TensorMeta, ...] | None = None  # of activations we receive
        self.grad_meta: tuple[TensorMeta, ...] | None = None  # of activations we sent
        self._header: tuple[torch.Tensor, dist.Work] | None = None
        self._sends: list[tuple[dist.Work, torch.Tensor]] = []

    def begin_step(self) -> None:
        self.inbound_meta = self.grad_meta = None

    # -- activations -------------------------------------------------------------------------
    def send_activations(self, carry: Carry, microbatch: int) -> None:
        metas = carry_meta(carry)
        if self.grad_meta is None:
            self.grad_meta = metas
            self._isend(_encode(metas).to(self.device), _tag(HEADER, 0, 0))
        elif metas != self.grad_meta:
            raise RuntimeError(
                f"micro-batch {microbatch} produced a carry {metas} that differs from the "
                f"first micro-batch's {self.grad_meta}; all micro-batches of a step must "
                "have the same shapes"
            )
        for i, t in enumerate(carry):
            self._isend(t.detach(), _tag(ACT, microbatch, i))

    def recv_activations(self, microbatch: int) -> Receive:
        if self.inbound_meta is None and self._header is None:
            header = torch.empty(_HEADER_LEN, dtype=torch.int64, device=self.device)
            work = _posted(dist.irecv(header, self.peer, tag=_tag(HEADER, 0, 0)))
            self._header = (header, work)
        return Receive(self, ACT, microbatch)

    def wait_header(self) -> None:
        if self.inbound_meta is not None:
            return
        assert self._header is not None, "no header was posted"
        header, work = self._header
        work.wait()
        self.inbound_meta, self._header = _decode(header.cpu()), None

    # -- gradients ---------------------------------------------------------------------------
    def send_gradients(self, grads: Sequence[torch.Tensor], microbatch: int) -> None:
        for i, g in enumerate(grads):
            self._isend(g, _tag(GRAD, microbatch, i))

    def recv_gradients(self, microbatch: int) -> Receive:
        return Receive(self, GRAD, microbatch)

    # -- completion --------------------------------------------------------------------------
    def _isend(self, tensor: torch.Tensor, tag: int) -> None:
        tensor = tensor.contiguous()
        self._sends.append((_posted(dist.isend(tensor, self.peer, tag=tag)), tensor))

    def wait_sends(self) -> None:
        sends, self._sends = self._sends, []
        for work, _tensor in sends:
            work.wait()
