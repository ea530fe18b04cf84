"""Two weight versions per stage, for PipeDream-2BW, in two copies of the parameters.

Under 2BW every micro-batch of step t runs its forward and its backward with W(t-1), while
the optimizer turns W(t) into W(t+1) (`pipeline.pure.two_bw`). A stage therefore holds two
versions, in two *slots* per parameter: slot v % 2 holds W(v). Slots are plain leaf
tensors; a layer runs with one through `torch.func.functional_call`, so autograd saves
the slot tensors and accumulates the micro-batches' gradients into the slot's `.grad`.

The optimizer keeps its own `nn.Parameter` objects (its state is keyed by them). After
u updates they hold W(u), and their storage *is* slot u % 2's (`p.data = slot.data`: the
same bytes, a separate autograd version counter): two copies, not three. Update t
(`apply_update`, once every micro-batch of step t has finished here):

    1. the gradients of step t sit in slot (t-1) % 2, which no micro-batch uses any more
       (step t was its last user): they become the parameters' `.grad`
    2. slot (t-1) % 2 gets W(t) (a copy of the parameters), and the parameters move onto
       its storage; slot t % 2 keeps W(t) for step t+1's micro-batches, some in flight
    3. the optimizer steps in place: slot (t-1) % 2 = slot (t+1) % 2 now holds W(t+1),
       which step t + 2 is the first to use

No tensor a live graph saved is ever written: slot t % 2 is not touched, and slot (t-1) % 2
is written only after its last graph is gone. So W(t+1) = W(t) - lr * grad f(W(t-1)).
Initially (u = 0) slot 0 is the parameters and slot 1 a copy: W(-1) = W(0).

A layer migrates with its parameters (W(u), in its state dict) and `previous(key)`, W(u-1)
(`pipeline.distributed.migration`); the receiver `attach`es it with that version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

__all__ = ["WeightVersions"]


class WeightVersions:
    """Slots of every layer of a stage, and how many updates they have seen (module doc)."""

    def __init__(self, updates: int) -> None:
        self.updates = updates  # u: the parameters hold W(u)
        self._slots: dict[str, tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]] = {}
        self._params: dict[str, dict[str, nn.Parameter]] = {}

    def attach(
        self, key: str, module: nn.Module, previous: dict[str, torch.Tensor] | None = None
    ) -> None:
        """Give a layer its two versions: its parameters (W(u)) and `previous` (W(u-1);
        default: a copy of the parameters, right at u = 0)."""
        params = dict(module.named_parameters())
        current = {n: _leaf(p.data, p.requires_grad) for n, p in params.items()}
        if previous is not None and previous.keys() != params.keys():
            raise ValueError(
                f"layer {key!r}: the previous weight version names "
                f"{sorted(previous)}, the layer {sorted(params)}"
            )
        older = {
            n: _leaf(
                (previous[n] if previous is not None else p.data).to(p.device).clone(),
                p.requires_grad,
            )
            for n, p in params.items()
        }
        for n, p in params.items():
            p.data = current[n].data  # the parameters live in slot u % 2
        self._slots[key] = (current, older) if self.updates % 2 == 0 else (older, current)
        self._params[key] = params

    def index(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """What `restore` puts back (a migration's rollback): which layers have versions."""
        return dict(self._slots), dict(self._params)

    def restore(self, index: tuple[dict[str, Any], ...]) -> None:
        self._slots, self._params = dict(index[0]), dict(index[1])

    def drop(self, key: str) -> None:
        self._slots.pop(key, None)
        self._params.pop(key, None)

    def layer_keys(self) -> list[str]:
        return list(self._slots)

    def weights(self, key: str, version: int) -> dict[str, torch.Tensor]:
        """Layer `key`'s tensors of W(version), for `functional_call`; version u or u - 1."""
        if version not in (self.updates, self.updates - 1):
            raise RuntimeError(
                f"weight version {version} is gone: this stage holds {self.updates - 1} and "
                f"{self.updates} (2BW keeps two)"
            )
        return self._slots[key][version % 2]

    def previous(self, key: str) -> dict[str, torch.Tensor]:
        """W(u-1) of layer `key`, detached (what migrates beside the state dict)."""
        return {n: t.detach() for n, t in self._slots[key][(self.updates - 1) % 2].items()}

    def apply_update(self, step: Callable[[], None]) -> None:
        """Update u (steps 1-3 of the module doc); `step` runs the optimizer (in place)."""
        dead = (self.updates - 1) % 2
        for key, params in self._params.items():
            slot = self._slots[key][dead]
            for n, p in params.items():
                target = slot[n]
                p.grad, target.grad = target.grad, None
                with torch.no_grad():
                    target.copy_(p)
                p.data = target.data
        try:
            step()
        finally:  # a failed step is skipped here, not repeated: the slots stay consistent
            self.updates += 1

    def zero_grads(self) -> None:
        """Forget the gradients of micro-batches that will not be applied (a failed stream)."""
        for slots in self._slots.values():
            for slot in slots:
                for t in slot.values():
                    t.grad = None

    def tensors(self) -> list[torch.Tensor]:
        """Every weight tensor of both versions (what saved activations exclude)."""
        return [t for slots in self._slots.values() for slot in slots for t in slot.values()]

    def nbytes(self) -> int:
        """Bytes of the copy beyond the parameters (one slot is the parameters' storage)."""
        return sum(
            t.numel() * t.element_size()
            for key in self._slots
            for t in self._slots[key][(self.updates - 1) % 2].values()
        )


def _leaf(data: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return data.detach().requires_grad_(requires_grad)
