"""Small ready-made layer stacks: a Transformer and an MLP, on float tensors.

They exist so that the runtime's own tests and benchmarks train the same real models
without depending on the search space, and as examples of writing layers for the runtime:
every factory is a module-level class or a `functools.partial` of one (picklable), and every
layer maps carry -> carry. Language models (embeddings, causal cells, a vocabulary head)
come from `search_spaces.compile`, e.g. the seed `transformer(n_enc=0)` compiled for a
vocabulary, as `nas.tasks` does.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import torch
from torch import nn

from pipeline.local.spec import LayerSpec

__all__ = ["MLPBlock", "mlp_stack", "transformer_stack"]


def transformer_stack(
    n_layers: int,
    d_model: int,
    n_heads: int,
    *,
    d_ff: int | Sequence[int] | None = None,
    dropout: float = 0.1,
) -> list[LayerSpec]:
    """`n_layers` pre-norm Transformer encoder layers; the carry is (batch, seq, d_model).

    d_ff: the feed-forward width, one for all layers or one per layer (default 4 d_model).
    """
    widths = [d_ff or 4 * d_model] * n_layers if not isinstance(d_ff, Sequence) else list(d_ff)
    if len(widths) != n_layers:
        raise ValueError(f"{len(widths)} feed-forward widths for {n_layers} layers")
    return [
        LayerSpec(
            f"block{i}",
            functools.partial(
                nn.TransformerEncoderLayer,
                d_model,
                n_heads,
                dim_feedforward=width,
                dropout=dropout,
                batch_first=True,
                norm_first=True,
            ),
        )
        for i, width in enumerate(widths)
    ]


class MLPBlock(nn.Module):
    """Linear -> optional BatchNorm -> GELU -> Dropout; (batch, d_in) -> (batch, d_out)."""

    def __init__(self, d_in: int, d_out: int, dropout: float, batch_norm: bool) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)
        self.norm = nn.BatchNorm1d(d_out) if batch_norm else nn.Identity()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(nn.functional.gelu(self.norm(self.linear(x))))


def mlp_stack(
    widths: list[int], *, dropout: float = 0.1, batch_norm: bool = False
) -> list[LayerSpec]:
    """One `MLPBlock` per consecutive pair of `widths`, a plain Linear as the last layer."""
    specs = [
        LayerSpec(f"mlp{i}", functools.partial(MLPBlock, d_in, d_out, dropout, batch_norm))
        for i, (d_in, d_out) in enumerate(itertools.pairwise(widths[:-1]))
    ]
    specs.append(LayerSpec("out", functools.partial(nn.Linear, widths[-2], widths[-1])))
    return specs
