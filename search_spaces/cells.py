"""The torch module for one cell of an architecture: branches, combiners, cell output.

`architecture.py` says what a cell is; this module runs it. A `CellModule` maps
(batch, seq, d_model) -> (batch, seq, d_model) given a `Context` (padding mask, encoder
memory), so encoder and decoder cells can be stacked and cut into pipeline stages anywhere.
The combiner and cell-output conventions are documented in `architecture.py`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from search_spaces.architecture import Block, Branch, Cell, block_widths, cell_outputs
from search_spaces.layers import activation, make_layer
from search_spaces.sequence import Context

__all__ = ["BlockModule", "BranchModule", "CellModule"]


class BranchModule(nn.Module):
    """norm -> layer -> activation -> dropout: (batch, seq, d_in) -> (batch, seq, d_out).

    Each branch has its own LayerNorm (tensor2tensor shares one per hidden state; the
    difference is 2 * width parameters per extra branch)."""

    def __init__(
        self, branch: Branch, d_in: int, d_model: int, *, causal: bool, dropout: float
    ) -> None:
        super().__init__()
        self.d_out = branch.width(d_in, d_model)
        self.norm = nn.LayerNorm(d_in) if branch.norm == "layer_norm" else nn.Identity()
        self.layer = make_layer(
            branch.layer,
            d_in,
            self.d_out,
            causal=causal,
            heads=branch.heads,
            reduction=branch.reduction,
            d_memory=d_model,
        )
        self.activation = activation(branch.activation)
        self.dropout = nn.Dropout(dropout) if branch.layer != "identity" else nn.Identity()

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        return self.dropout(self.activation(self.layer(self.norm(x), ctx)))


def _pad_to(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
    """Pad the last dimension of x with `value` up to `width`."""
    return F.pad(x, (0, width - x.shape[-1]), value=value)


class BlockModule(nn.Module):
    """Two branches and their combiner: reads hidden states, returns a new one."""

    def __init__(
        self, block: Block, widths: list[int], d_model: int, *, causal: bool, dropout: float
    ) -> None:
        super().__init__()
        self.inputs = (block.left.input, block.right.input)
        self.combiner = block.combiner

        def build(branch: Branch) -> BranchModule | None:
            if branch.dead:
                return None
            return BranchModule(
                branch, widths[branch.input], d_model, causal=causal, dropout=dropout
            )

        self.left, self.right = build(block.left), build(block.right)
        out = [b.d_out for b in (self.left, self.right) if b is not None]
        self.d_out = max(out)
        self.project: nn.Linear | None = None
        if len(out) == 2 and self.combiner == "concat":
            self.project = nn.Linear(sum(out), self.d_out)

    def forward(self, states: list[torch.Tensor], ctx: Context) -> torch.Tensor:
        if self.right is None:  # a dead branch: the block is the other branch alone
            assert self.left is not None
            return self.left(states[self.inputs[0]], ctx)
        if self.left is None:
            return self.right(states[self.inputs[1]], ctx)
        a = self.left(states[self.inputs[0]], ctx)  # (B, T, d_left)
        b = self.right(states[self.inputs[1]], ctx)  # (B, T, d_right)
        if self.combiner == "add":
            return _pad_to(a, self.d_out, 0.0) + _pad_to(b, self.d_out, 0.0)
        if self.combiner == "multiply":
            return _pad_to(a, self.d_out, 1.0) * _pad_to(b, self.d_out, 1.0)
        assert self.project is not None
        return self.project(torch.cat([a, b], dim=-1))  # (B, T, d_left + d_right) -> d_out


class CellModule(nn.Module):
    """A cell: (batch, seq, d_model) -> (batch, seq, d_model).

    causal: decoder cells (no position sees a later one). Encoder attention layers attend
    to ctx.memory, which has width d_model.
    """

    def __init__(self, cell: Cell, d_model: int, *, causal: bool, dropout: float) -> None:
        super().__init__()
        widths = block_widths(cell, d_model)
        self.blocks = nn.ModuleList(
            BlockModule(block, widths[: i + 1], d_model, causal=causal, dropout=dropout)
            for i, block in enumerate(cell.blocks)
        )
        self.outputs = cell_outputs(cell)
        self.project = nn.ModuleList(
            nn.Linear(widths[i], d_model) if widths[i] != d_model else nn.Identity()
            for i in self.outputs
        )

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        states = [x]  # hidden state 0 is the cell input
        for block in self.blocks:
            states.append(block(states, ctx))
        out = self.project[0](states[self.outputs[0]])
        for index, project in zip(self.outputs[1:], self.project[1:], strict=True):
            out = out + project(states[index])
        return out
