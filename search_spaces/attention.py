"""The attention layers of the search space: self-attention (causal in the decoder),
attention to the encoder, and Primer's multi-DConv-head variants of both.

Both keep the space's rules (`search_spaces.layers`): padded keys are masked (and a row is
never empty, so never NaN), the decoder's self-attention is masked causally, and MDHA's
depthwise convolutions zero padded positions first and are causal on the decoder's side
(self-attention's Q, K and V; cross-attention's Q), while cross-attention's K and V mix
source positions both ways, as the encoder does. Each DConv kernel starts as the identity,
so MDHA begins as plain attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from search_spaces.sequence import QKV, Context, SeqLayer, time_pad, zero_pad

__all__ = [
    "DCONV_WIDTH",
    "DConvEncoderAttention",
    "DConvSelfAttention",
    "DepthwiseTimeConv",
    "EncoderAttention",
    "SelfAttention",
]


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, allowed: torch.Tensor | None
) -> torch.Tensor:
    """Multi-head attention core: q (B, T, d), k and v (B, S, d) -> (B, T, d).

    allowed: bool, broadcastable to (B, heads, T, S), True where a query may see a key.
    """
    B, T, d = q.shape
    S = k.shape[1]
    q = q.view(B, T, heads, d // heads).transpose(1, 2)  # (B, H, T, dh)
    k = k.view(B, S, heads, d // heads).transpose(1, 2)  # (B, H, S, dh)
    v = v.view(B, S, heads, d // heads).transpose(1, 2)  # (B, H, S, dh)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # (B, H, T, dh)
    return y.transpose(1, 2).reshape(B, T, d)


def _check_heads(d: int, heads: int) -> None:
    if heads < 1 or d % heads:
        raise ValueError(f"attention: {heads} heads do not divide the width {d}")


class SelfAttention(SeqLayer):
    """Multi-head self-attention, q/k/v in d_in, output projected to d_out; causal in the
    decoder. Padded keys are masked; every position may always see itself, so a row is
    never empty (no NaN) and a padded query sees only itself."""

    def __init__(self, d_in: int, d_out: int, heads: int, *, causal: bool) -> None:
        super().__init__()
        _check_heads(d_in, heads)
        self.d_in, self.d_out, self.heads, self.causal = d_in, d_out, heads, causal
        self.q, self.k, self.v = (nn.Linear(d_in, d_in) for _ in range(3))
        self.out = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        T = x.shape[1]
        allowed: torch.Tensor | None = None  # (T, T) or (B, 1, T, T)
        if self.causal:
            allowed = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        if ctx.pad is not None:
            keys = ~ctx.pad[:, None, None, :]  # (B, 1, 1, T)
            allowed = keys if allowed is None else allowed & keys
            allowed = allowed | torch.eye(T, dtype=torch.bool, device=x.device)
        y = _attend(*self.project(x, ctx), self.heads, allowed)
        return self.out(y)

    def project(self, x: torch.Tensor, ctx: Context) -> QKV:
        """The queries, keys and values of x."""
        return self.q(x), self.k(x), self.v(x)


class EncoderAttention(SeqLayer):
    """Attention from the decoder (queries, d_in) to the encoder memory (keys and values,
    d_memory); padded source positions are masked. A source made only of padding gives
    the plain average over it rather than NaN."""

    def __init__(self, d_in: int, d_out: int, heads: int, d_memory: int) -> None:
        super().__init__()
        _check_heads(d_in, heads)
        self.d_in, self.d_out, self.heads = d_in, d_out, heads
        self.q = nn.Linear(d_in, d_in)
        self.k, self.v = nn.Linear(d_memory, d_in), nn.Linear(d_memory, d_in)
        self.out = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        if ctx.memory is None:
            raise ValueError("attention to the encoder needs the encoder memory in the context")
        allowed = None
        if ctx.memory_pad is not None:
            allowed = ~ctx.memory_pad[:, None, None, :]  # (B, 1, 1, S)
            allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
        y = _attend(*self.project(x, ctx.memory, ctx), self.heads, allowed)
        return self.out(y)

    def project(self, x: torch.Tensor, memory: torch.Tensor, ctx: Context) -> QKV:
        """The queries of x, the keys and values of the encoder memory."""
        return self.q(x), self.k(memory), self.v(memory)


class DepthwiseTimeConv(nn.Module):
    """Primer's DConv: one kernel of `width` positions per channel along the sequence, no
    bias, starting as the identity; padded positions are zeroed first (causal: left-padded)."""

    def __init__(self, d: int, width: int, *, causal: bool) -> None:
        super().__init__()
        self.width, self.causal = width, causal
        self.conv = nn.Conv1d(d, d, width, groups=d, bias=False)
        with torch.no_grad():
            self.conv.weight.zero_()
            self.conv.weight[:, :, width - 1 if causal else width // 2] = 1.0

    def forward(self, x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
        x = zero_pad(x, pad).transpose(1, 2)  # (B, d, T)
        return self.conv(time_pad(x, self.width, self.causal)).transpose(1, 2)


DCONV_WIDTH = 3  # Primer: wider kernels did not help


class DConvSelfAttention(SelfAttention):
    """Multi-DConv-head self-attention (Primer): a depthwise conv of width 3 after each of
    the Q, K and V projections; causal in the decoder."""

    def __init__(self, d_in: int, d_out: int, heads: int, *, causal: bool) -> None:
        super().__init__(d_in, d_out, heads, causal=causal)
        self.dconv_q, self.dconv_k, self.dconv_v = (
            DepthwiseTimeConv(d_in, DCONV_WIDTH, causal=causal) for _ in range(3)
        )

    def project(self, x: torch.Tensor, ctx: Context) -> QKV:
        q, k, v = super().project(x, ctx)
        return self.dconv_q(q, ctx.pad), self.dconv_k(k, ctx.pad), self.dconv_v(v, ctx.pad)


class DConvEncoderAttention(EncoderAttention):
    """Multi-DConv-head attention to the encoder: the queries' conv is causal (they are the
    decoder's positions), the keys' and values' convs mix source positions both ways."""

    def __init__(self, d_in: int, d_out: int, heads: int, d_memory: int) -> None:
        super().__init__(d_in, d_out, heads, d_memory)
        self.dconv_q = DepthwiseTimeConv(d_in, DCONV_WIDTH, causal=True)
        self.dconv_k, self.dconv_v = (
            DepthwiseTimeConv(d_in, DCONV_WIDTH, causal=False) for _ in range(2)
        )

    def project(self, x: torch.Tensor, memory: torch.Tensor, ctx: Context) -> QKV:
        q, k, v = super().project(x, memory, ctx)
        source_pad = ctx.memory_pad
        return self.dconv_q(q, ctx.pad), self.dconv_k(k, source_pad), self.dconv_v(v, source_pad)
