"""The layers a branch of the Evolved Transformer search space can hold, as torch modules.

Every layer maps (batch, seq, d_in) -> (batch, seq, d_out) and takes a `Context` with the
padding mask and, in the decoder, the encoder memory. Two rules make architectures safe to
train whatever the search picks:

* padding never leaks: a layer that mixes positions (convolutions, attention) zeroes or
  masks padded positions first, so a real position's output does not depend on them;
* causality in the decoder (`causal=True`): an output at position t never depends on an
  input at a position > t (convolutions are padded on the left, attention is masked).

Layers that work per position (identity, dense, GLU) need neither. `make_layer` builds a
layer from its name in the search space; `LAYER_NAMES` lists them. Parameter counts follow
tensor2tensor's NAS layers (`nas_layers.py`), except that attention projections have biases
so that the Transformer seed counts exactly like `torch.nn.Transformer`.

Two of Primer's primitives (So et al. 2021) are here too, for spaces that ask for them:
squared ReLU (`relu(x)^2`, an activation) and multi-DConv-head attention (`mdha`,
`encoder_mdha`): attention with a depthwise convolution of width 3 along the sequence after
each of the Q, K and V projections, one kernel per channel and no bias (3 * 3 * d weights
more than plain attention). The convolutions obey both rules: padded positions are zeroed
before them, and on the decoder side (self-attention's Q, K and V; cross-attention's Q) they
are causal; cross-attention's K and V mix source positions both ways, as the encoder does.
Each kernel starts as the identity (1 on the current position), so MDHA begins as plain
attention and learns its convolutions.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_LAYERS",
    "CROSS_LAYERS",
    "LAYER_NAMES",
    "Context",
    "DConvEncoderAttention",
    "DConvSelfAttention",
    "Dead",
    "Dense",
    "DepthwiseTimeConv",
    "EncoderAttention",
    "GatedLinearUnit",
    "Identity",
    "LightweightConv",
    "SelfAttention",
    "SeparableConv",
    "SeqLayer",
    "SquaredReLU",
    "StandardConv",
    "activation",
    "make_layer",
]


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


def _zero_pad(x: torch.Tensor, pad: torch.Tensor | None) -> torch.Tensor:
    """Zero the padded positions of x (batch, seq, d) before a layer mixes positions."""
    return x if pad is None else x.masked_fill(pad.unsqueeze(-1), 0.0)


def _time_pad(x: torch.Tensor, width: int, causal: bool) -> torch.Tensor:
    """Pad (batch, d, seq) in time for a 'valid' convolution of odd `width`: on the left
    only when causal (output t sees t-width+1..t), else on both sides (t-k..t+k)."""
    if causal:
        return F.pad(x, (width - 1, 0))
    return F.pad(x, ((width - 1) // 2, (width - 1) // 2))


class Identity(SeqLayer):
    def __init__(self, d_in: int) -> None:
        super().__init__()
        self.d_in = self.d_out = d_in

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        return x


class Dead(SeqLayer):
    """The dead branch: contributes nothing. Cells never build it (the block uses its other
    branch alone); it exists so that every layer name has a module."""

    def __init__(self, d_in: int) -> None:
        super().__init__()
        self.d_in = self.d_out = d_in

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        return torch.zeros_like(x)


class Dense(SeqLayer):
    """Standard conv 1x1: a per-position linear map, d_in*d_out + d_out parameters."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        self.linear = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        return self.linear(x)


class StandardConv(SeqLayer):
    """Standard conv width x 1 over time: width*d_in*d_out + d_out parameters."""

    def __init__(self, d_in: int, d_out: int, width: int, *, causal: bool) -> None:
        super().__init__()
        self.d_in, self.d_out, self.width, self.causal = d_in, d_out, width, causal
        self.conv = nn.Conv1d(d_in, d_out, width)

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        x = _zero_pad(x, ctx.pad).transpose(1, 2)  # (B, d_in, T)
        y = self.conv(_time_pad(x, self.width, self.causal))  # (B, d_out, T)
        return y.transpose(1, 2)


class SeparableConv(SeqLayer):
    """Depthwise conv width x 1 (no bias) then pointwise d_in -> d_out (with bias):
    width*d_in + d_in*d_out + d_out parameters."""

    def __init__(self, d_in: int, d_out: int, width: int, *, causal: bool) -> None:
        super().__init__()
        self.d_in, self.d_out, self.width, self.causal = d_in, d_out, width, causal
        self.depthwise = nn.Conv1d(d_in, d_in, width, groups=d_in, bias=False)
        self.pointwise = nn.Conv1d(d_in, d_out, 1)

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        x = _zero_pad(x, ctx.pad).transpose(1, 2)  # (B, d_in, T)
        y = self.pointwise(self.depthwise(_time_pad(x, self.width, self.causal)))
        return y.transpose(1, 2)  # (B, T, d_out)


class LightweightConv(SeqLayer):
    """Lightweight convolution (Wu et al. 2019): a depthwise conv whose kernels are
    softmax-normalised over their width and shared: `reduction` consecutive channels use
    the same kernel (d_in / reduction distinct kernels, the 'heads'). No bias; d_out = d_in.
    """

    def __init__(self, d_in: int, width: int, reduction: int, *, causal: bool) -> None:
        super().__init__()
        if d_in % reduction:
            raise ValueError(f"lightweight conv: reduction {reduction} does not divide {d_in}")
        self.d_in = self.d_out = d_in
        self.width, self.reduction, self.causal = width, reduction, causal
        self.weight = nn.Parameter(torch.randn(d_in // reduction, width) * 0.1)

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        kernel = F.softmax(self.weight, dim=-1)  # (d_in/r, width), each row sums to 1
        kernel = kernel.repeat_interleave(self.reduction, dim=0).unsqueeze(1)  # (d_in, 1, w)
        x = _zero_pad(x, ctx.pad).transpose(1, 2)  # (B, d_in, T)
        y = F.conv1d(_time_pad(x, self.width, self.causal), kernel, groups=self.d_in)
        return y.transpose(1, 2)


class GatedLinearUnit(SeqLayer):
    """values * sigmoid(gates), both linear maps d_in -> d_out."""

    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        self.values = nn.Linear(d_in, d_out)
        self.gates = nn.Linear(d_in, d_out)

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        return self.values(x) * torch.sigmoid(self.gates(x))


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
        x = _zero_pad(x, pad).transpose(1, 2)  # (B, d, T)
        return self.conv(_time_pad(x, self.width, self.causal)).transpose(1, 2)


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


class SquaredReLU(nn.Module):
    """relu(x)^2, Primer's feed-forward activation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.square(F.relu(x))


ACTIVATIONS = ("swish", "relu", "leaky_relu", "none", "squared_relu")


def activation(name: str) -> nn.Module:
    """The activation module for a name in ACTIVATIONS (leaky ReLU slope 0.2, as TF)."""
    if name == "squared_relu":
        return SquaredReLU()
    if name == "swish":
        return nn.SiLU()
    if name == "relu":
        return nn.ReLU()
    if name == "leaky_relu":
        return nn.LeakyReLU(0.2)
    if name == "none":
        return nn.Identity()
    raise ValueError(f"unknown activation {name!r}; expected one of {ACTIVATIONS}")


SEPARABLE_WIDTHS = (3, 5, 7, 9, 11)
LIGHTWEIGHT_WIDTHS = (3, 5, 7, 15)
LAYER_NAMES = (
    "identity",
    "dead",
    "conv_1x1",
    "conv_3x1",
    *(f"sep_conv_{w}x1" for w in SEPARABLE_WIDTHS),
    *(f"light_conv_{w}x1" for w in LIGHTWEIGHT_WIDTHS),
    "glu",
    "attention",
    "encoder_attention",
    "mdha",
    "encoder_mdha",
)
ATTENTION_LAYERS = ("attention", "encoder_attention", "mdha", "encoder_mdha")
CROSS_LAYERS = ("encoder_attention", "encoder_mdha")  # attend to the encoder


def _width(name: str) -> int:
    return int(name.rsplit("_", 1)[1].split("x")[0])  # "sep_conv_9x1" -> 9


def make_layer(
    name: str,
    d_in: int,
    d_out: int,
    *,
    causal: bool,
    heads: int | None = None,
    reduction: int | None = None,
    d_memory: int | None = None,
) -> SeqLayer:
    """Build the layer called `name` (one of LAYER_NAMES).

    identity, dead and light_conv_* keep the width (d_out must equal d_in); attention layers
    need `heads`, light_conv_* a `reduction`, encoder_attention `d_memory`.
    """
    keeps_width = name in ("identity", "dead") or name.startswith("light_conv_")
    if keeps_width and d_out != d_in:
        raise ValueError(f"{name} keeps the width: d_out {d_out} != d_in {d_in}")
    if name == "identity":
        return Identity(d_in)
    if name == "dead":
        return Dead(d_in)
    if name == "conv_1x1":
        return Dense(d_in, d_out)
    if name == "conv_3x1":
        return StandardConv(d_in, d_out, 3, causal=causal)
    if name.startswith("sep_conv_") and _width(name) in SEPARABLE_WIDTHS:
        return SeparableConv(d_in, d_out, _width(name), causal=causal)
    if name.startswith("light_conv_") and _width(name) in LIGHTWEIGHT_WIDTHS:
        if reduction is None:
            raise ValueError(f"{name} needs a reduction")
        return LightweightConv(d_in, _width(name), reduction, causal=causal)
    if name == "glu":
        return GatedLinearUnit(d_in, d_out)
    if name in ATTENTION_LAYERS:
        return _attention(name, d_in, d_out, heads, causal=causal, d_memory=d_memory)
    raise ValueError(f"unknown layer {name!r}; expected one of {LAYER_NAMES}")


def _attention(
    name: str, d_in: int, d_out: int, heads: int | None, *, causal: bool, d_memory: int | None
) -> SeqLayer:
    """One of ATTENTION_LAYERS: self-attention or attention to the encoder, plain or MDHA."""
    if heads is None:
        raise ValueError(f"{name} needs a number of heads")
    if name in CROSS_LAYERS:
        if d_memory is None:
            raise ValueError(f"{name} needs the encoder width d_memory")
        cross = DConvEncoderAttention if name == "encoder_mdha" else EncoderAttention
        return cross(d_in, d_out, heads, d_memory)
    own = DConvSelfAttention if name == "mdha" else SelfAttention
    return own(d_in, d_out, heads, causal=causal)
