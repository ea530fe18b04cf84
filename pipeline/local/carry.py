"""The carry: what flows from one layer to the next, a tuple of tensors.

A layer may take and return one tensor or a tuple of several (hidden states, an encoder's
memory, token ids...). Inside the runtime everything is a tuple; these helpers convert at
the edges and say which tensors carry gradients (exactly the floating-point ones).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["Carry", "as_carry", "floating", "leaf", "nbytes", "through", "unwrap"]

Carry = tuple[torch.Tensor, ...]


def as_carry(value: object, what: str) -> Carry:
    """Normalise a layer output / batch input to a tuple of tensors, or say what is wrong."""
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not isinstance(item, torch.Tensor):
            raise TypeError(
                f"{what} must be a tensor or a tuple of tensors, got an element of type "
                f"{type(item).__name__}"
            )
    return tuple(items)


def unwrap(carry: Carry) -> Any:
    """What a layer or a loss function receives: the tensor itself when there is one."""
    return carry[0] if len(carry) == 1 else carry


def through(layers: Iterable[tuple[str, Callable[[Any], Any]]], x: Any) -> Any:
    """`x` through the (key, layer) pairs in order, as one process runs a whole model: each
    output checked as a carry named by its layer's key; the last one unwrapped."""
    carry = as_carry(x, "the batch input")
    for key, layer in layers:
        carry = as_carry(layer(unwrap(carry)), f"the output of layer {key!r}")
    return unwrap(carry)


def floating(carry: Carry) -> list[torch.Tensor]:
    """The tensors of a carry that carry a gradient."""
    return [t for t in carry if t.is_floating_point()]


def leaf(carry: Carry) -> Carry:
    """A detached copy of the carry whose floating tensors collect their own gradients."""
    return tuple(t.detach().requires_grad_(t.is_floating_point()) for t in carry)


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
