"""What a stage trains with: the user's loss function and optimizer factory, checked.

Both come from the user (`ElasticPipeline(loss_fn=..., optimizer=...)`), so their results
are checked where they enter: a loss must be a scalar tensor, a factory must return a
`torch.optim.Optimizer`. The stage builds its optimizer here, and so does a migration when
a layer arrives on a stage that had no parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["LossFn", "OptimizerFactory", "build_optimizer", "on_device", "scalar_loss"]

OptimizerFactory = Callable[[list[dict[str, Any]]], torch.optim.Optimizer]
LossFn = Callable[[Any, Any], torch.Tensor]


def on_device(value: Any, device: torch.device) -> Any:
    """`value` with every tensor in it (in tuples, lists and dicts too) on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(on_device(v, device) for v in value))
    if isinstance(value, tuple | list):
        return type(value)(on_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: on_device(v, device) for k, v in value.items()}
    return value


def scalar_loss(loss_fn: LossFn, output: Any, target: Any) -> torch.Tensor:
    """loss_fn(output, target) as a 0-d tensor, or a ValueError saying what it returned.
    The target is moved to the output's device first (a user's targets stay on the host)."""
    first = output[0] if isinstance(output, tuple) else output
    if isinstance(first, torch.Tensor):
        target = on_device(target, first.device)
    loss = loss_fn(output, target)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar tensor (mean-reduced), got {shape}")
    return loss.reshape(())


def build_optimizer(
    factory: OptimizerFactory, layers: Sequence[tuple[str, nn.Module]]
) -> torch.optim.Optimizer | None:
    """One optimizer per stage with one parameter group per (key, layer): migration moves
    groups. None when no layer has a parameter that trains."""
    groups = [
        {"params": params, "layer": key}
        for key, module in layers
        if (params := [p for p in module.parameters() if p.requires_grad])
    ]
    if not groups:
        return None
    optimizer = factory(groups)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"the optimizer factory returned a {type(optimizer).__name__}; it must return a "
            "torch.optim.Optimizer built from the parameter groups it is given, e.g. "
            "functools.partial(torch.optim.AdamW, lr=1e-3)"
        )
    return optimizer
