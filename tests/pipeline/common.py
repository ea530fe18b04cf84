"""What the local and the distributed tests of a user's `nn.Sequential` share: the model.

`tests/pipeline/local/test_sequential.py` checks that its specs compute exactly the module,
`tests/pipeline/distributed/test_sequential_pipeline.py` that it pipelines exactly; both train
the same `user_model` on the same `user_batches` and compare with the user's own loop
(`train_module`) through the module's state dict (`as_module_state`).
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

USER_STEPS, USER_BATCH, USER_MICROBATCHES = 4, 8, 4
USER_ADAM = functools.partial(torch.optim.Adam, lr=1e-2)


def user_model() -> nn.Sequential:
    """What a user writes: named parts, a nested Sequential, torch.nn modules only."""
    torch.manual_seed(11)
    block = functools.partial(
        nn.TransformerEncoderLayer, 16, 2, 32, dropout=0.0, batch_first=True, norm_first=True
    )
    return nn.Sequential(
        OrderedDict(
            proj=nn.Linear(6, 16),
            blocks=nn.Sequential(block(), block()),
            act=nn.GELU(),
            norm=nn.LayerNorm(16),
            head=nn.Linear(16, 3),
        )
    )


def user_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [
        (torch.randn(USER_BATCH, 5, 6, generator=g), torch.randn(USER_BATCH, 5, 3, generator=g))
        for _ in range(USER_STEPS)
    ]


def train_module(module: nn.Module, microbatches: int) -> list[float]:
    """The user's own loop: mean loss over micro-batches, gradients accumulated."""
    optimizer = USER_ADAM(module.parameters())
    losses = []
    for x, y in user_batches():
        total = 0.0
        for xi, yi in zip(x.chunk(microbatches), y.chunk(microbatches), strict=True):
            loss = F.mse_loss(module(xi), yi)
            (loss / microbatches).backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(total / microbatches)
    return losses


def as_module_state(state: dict[str, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The documented one-liner: a pipeline's full state as the module's state dict."""
    return {f"{key}.{name}": value for key, layer in state.items() for name, value in layer.items()}
