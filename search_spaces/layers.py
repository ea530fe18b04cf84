"""The layers a branch of the Evolved Transformer search space can hold, as torch modules.

Every layer maps (batch, seq, d_in) -> (batch, seq, d_out) and takes a `Context` with the
padding mask and, in the decoder, the encoder memory. Two rules make architectures safe to
train whatever the search picks:

* padding never leaks: a layer that mixes positions (convolutions, attention) zeroes or
  masks padded positions first, so a real position's output does not depend on them;
* causality in the decoder (`causal=True`): an output at position t never depends on an
  input at a position > t (convolutions are padded on the left, attention is masked).

Layers that work per position (identity, dense, GLU) need neither. `make_layer` builds a
layer from its name in the search space; `LAYER_NAMES` lists them. What every layer shares
(`SeqLayer`, `Context`, the padding helpers) is in `search_spaces.sequence`; the attention
layers are in `search_spaces.attention`. Parameter counts follow tensor2tensor's NAS layers
(`nas_layers.py`), except that attention projections have biases so that the Transformer
seed counts exactly like `torch.nn.Transformer`.

Two of Primer's primitives (So et al. 2021) are here too, for spaces that ask for them:
squared ReLU (`relu(x)^2`, an activation) and multi-DConv-head attention (`mdha`,
`encoder_mdha`, in `search_spaces.attention`): attention with a depthwise convolution of
width 3 along the sequence after each of the Q, K and V projections, one kernel per channel
and no bias (3 * 3 * d weights more than plain attention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from search_spaces.attention import (
    DConvEncoderAttention,
    DConvSelfAttention,
    EncoderAttention,
    SelfAttention,
)
from search_spaces.sequence import Context, SeqLayer, time_pad, zero_pad

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_LAYERS",
    "CROSS_LAYERS",
    "LAYER_NAMES",
    "Dead",
    "Dense",
    "GatedLinearUnit",
    "Identity",
    "LightweightConv",
    "SeparableConv",
    "SquaredReLU",
    "StandardConv",
    "activation",
    "make_layer",
]


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
        x = zero_pad(x, ctx.pad).transpose(1, 2)  # (B, d_in, T)
        y = self.conv(time_pad(x, self.width, self.causal))  # (B, d_out, T)
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
        x = zero_pad(x, ctx.pad).transpose(1, 2)  # (B, d_in, T)
        y = self.pointwise(self.depthwise(time_pad(x, self.width, self.causal)))
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
        x = zero_pad(x, ctx.pad).transpose(1, 2)  # (B, d_in, T)
        y = F.conv1d(time_pad(x, self.width, self.causal), kernel, groups=self.d_in)
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
