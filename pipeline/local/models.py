"""Small ready-made layer stacks: a Transformer, an MLP and a character language model.

They exist so that the demo, the benchmarks and the tests train the same real models, and
as examples of writing layers for the runtime: every factory is a module-level class or a
`functools.partial` of one (picklable), and every layer maps carry -> carry.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import torch
from torch import nn

from pipeline.local.spec import LayerSpec

__all__ = ["CausalBlock", "Embedding", "LMHead", "char_lm", "mlp_stack", "transformer_stack"]


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
        LayerSpec(f"block{i}", functools.partial(
            nn.TransformerEncoderLayer, d_model, n_heads, dim_feedforward=width,
            dropout=dropout, batch_first=True, norm_first=True,
        ))
        for i, width in enumerate(widths)
    ]  # fmt: skip


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


class Embedding(nn.Module):
    """Token + learned position embedding: (batch, seq) int64 -> (batch, seq, d_model)."""

    def __init__(self, vocab: int, d_model: int, max_len: int) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(max_len, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tokens(ids) + self.positions(positions)


class CausalBlock(nn.Module):
    """A pre-norm Transformer layer with a causal mask: (batch, seq, d) -> (batch, seq, d)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model, n_heads, 4 * d_model, dropout, batch_first=True, norm_first=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.layer(x, src_mask=mask, is_causal=True)


class LMHead(nn.Module):
    """Final norm and projection to the vocabulary: (batch, seq, d) -> (batch, vocab, seq)."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x)).transpose(1, 2)  # the layout cross_entropy expects


def char_lm(
    vocab: int, *, n_layers: int, d_model: int, n_heads: int, max_len: int, dropout: float = 0.1
) -> list[LayerSpec]:
    """Embedding, `n_layers` causal blocks, head; train with `F.cross_entropy(out, y)`."""
    return [
        LayerSpec("embed", functools.partial(Embedding, vocab, d_model, max_len)),
        *[
            LayerSpec(f"block{i}", functools.partial(CausalBlock, d_model, n_heads, dropout))
            for i in range(n_layers)
        ],
        LayerSpec("head", functools.partial(LMHead, d_model, vocab)),
    ]
