"""What every layer of the search space shares: its call (`SeqLayer`: a sequence in, a
sequence out, with a `Context`) and the two helpers that keep its rules.

The rules (`search_spaces.layers` states them): padding never leaks into a real position,
and the decoder's layers are causal. `zero_pad` zeroes padded positions before a layer
mixes positions; `time_pad` pads a 'valid' convolution in time, on the left only when
causal. The plain layers (`search_spaces.layers`) and the attention layers
(`search_spaces.attention`) build on them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["QKV", "Context", "SeqLayer", "time_pad", "zero_pad"]


class Context(NamedTuple):
    """What a layer may need besides its input; every field may be None."""

    pad: torch.Tensor | None = None  # (batch, seq) bool, True at padding
    memory: torch.Tensor | None = None  # (batch, src_seq, d_memory) encoder output
    memory_pad: torch.Tensor | None = None  # (batch, src_seq) bool, True at padding


class SeqLayer(nn.Module):
    """Base class: forward(x (batch, seq, d_in), ctx) -> (batch, seq, d_out)."""

    d_in: int
    d_out: int

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        raise NotImplementedError


QKV = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # an attention's queries, keys, values


def zero_pad(x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
    """Zero the padded positions of x (batch, seq, d) before a layer mixes positions."""
    return x if pad is None else x.masked_fill(pad.unsqueeze(-1), 0.0)


def time_pad(x: torch.Tensor, width: int, causal: bool) -> torch.Tensor:
    """Pad (batch, d, seq) in time for a 'valid' convolution of odd `width`: on the left
    only when causal (output t sees t-width+1..t), else on both sides (t-k..t+k)."""
    if causal:
        return F.pad(x, (width - 1, 0))
    return F.pad(x, ((width - 1) // 2, (width - 1) // 2))
