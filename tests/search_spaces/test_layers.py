"""Every layer type: shapes, gradients, causality in the decoder, and no padding leak."""

from __future__ import annotations

import pytest
import torch

from search_spaces.layers import (
    LAYER_NAMES,
    LightweightConv,
    SeparableConv,
    StandardConv,
    make_layer,
)
from search_spaces.sequence import Context

D_IN, B, T, S = 16, 2, 9, 6


def layer(name: str, causal: bool, d_out: int = 32) -> torch.nn.Module:
    keeps = name in ("identity", "dead") or name.startswith("light_conv")
    torch.manual_seed(0)
    return make_layer(
        name, D_IN, D_IN if keeps else d_out, causal=causal, heads=4, reduction=4, d_memory=24
    )


def context(pad_tail: int = 3) -> Context:
    """Sequence 1 has its last pad_tail positions padded, sequence 0 none."""
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, T - pad_tail :] = True
    memory_pad = torch.zeros(B, S, dtype=torch.bool)
    memory_pad[0, S - 2 :] = True
    g = torch.Generator().manual_seed(1)
    return Context(pad, torch.randn(B, S, 24, generator=g), memory_pad)


def inputs(seed: int = 2) -> torch.Tensor:
    return torch.randn(B, T, D_IN, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("name", LAYER_NAMES)
def test_forward_backward(name: str, causal: bool) -> None:
    module = layer(name, causal)
    x = inputs().requires_grad_(True)
    y = module(x, context())
    assert y.shape == (B, T, module.d_out) and torch.isfinite(y).all()
    if name == "dead":
        assert not y.any()
        return
    y.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    for pname, p in module.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


@pytest.mark.parametrize("name", LAYER_NAMES)
def test_decoder_layers_are_causal(name: str) -> None:
    module, ctx = layer(name, causal=True), context(pad_tail=0)
    x = inputs()
    for t in (0, 4, T - 1):
        changed = x.clone()
        changed[:, t + 1 :] = torch.randn_like(changed[:, t + 1 :])
        torch.testing.assert_close(module(changed, ctx)[:, : t + 1], module(x, ctx)[:, : t + 1])


@pytest.mark.parametrize("causal", [False, True], ids=["encoder", "decoder"])
@pytest.mark.parametrize("name", LAYER_NAMES)
def test_padding_does_not_leak(name: str, causal: bool) -> None:
    module, ctx = layer(name, causal), context()
    assert ctx.pad is not None and ctx.memory is not None and ctx.memory_pad is not None
    x = inputs()
    noisy = x.masked_fill(ctx.pad.unsqueeze(-1), 1e3)  # garbage at padded positions
    memory = ctx.memory.masked_fill(ctx.memory_pad.unsqueeze(-1), -1e3)
    y, y_noisy = module(x, ctx), module(noisy, ctx._replace(memory=memory))
    real = ~ctx.pad
    torch.testing.assert_close(y_noisy[real], y[real])


@pytest.mark.parametrize("name", ["attention", "encoder_attention"])
def test_attention_without_any_real_key_is_finite(name: str) -> None:
    module = layer(name, causal=True)
    ctx = context()
    all_pad = torch.ones(B, T, dtype=torch.bool)
    all_memory_pad = torch.ones(B, S, dtype=torch.bool)
    y = module(inputs(), ctx._replace(pad=all_pad, memory_pad=all_memory_pad))
    assert torch.isfinite(y).all()


def test_lightweight_conv_kernels_are_normalised_and_shared() -> None:
    conv = LightweightConv(16, 5, reduction=4, causal=False)
    assert conv.weight.shape == (4, 5)  # 16 channels / 4 per shared kernel
    x = torch.full((1, 12, 16), 3.0)
    y = conv(x, Context())
    # softmax kernels sum to one: a constant signal stays constant away from the edges
    torch.testing.assert_close(y[:, 2:-2], x[:, 2:-2])


def test_parameter_counts_follow_tensor2tensor() -> None:
    def count(m: torch.nn.Module) -> int:
        return sum(p.numel() for p in m.parameters())

    assert count(StandardConv(16, 8, 3, causal=True)) == 3 * 16 * 8 + 8
    assert count(SeparableConv(16, 8, 9, causal=True)) == 9 * 16 + 16 * 8 + 8
    assert count(LightweightConv(16, 7, 4, causal=True)) == 7 * 16 // 4
    assert count(make_layer("glu", 16, 8, causal=False)) == 2 * (16 * 8 + 8)
    attention = make_layer("attention", 16, 16, causal=False, heads=4)
    assert count(attention) == count(torch.nn.MultiheadAttention(16, 4))


def test_bad_layer_arguments_are_clear() -> None:
    with pytest.raises(ValueError, match="8 heads do not divide the width 12"):
        make_layer("attention", 12, 12, causal=False, heads=8)
    with pytest.raises(ValueError, match="unknown layer 'conv_2x1'"):
        make_layer("conv_2x1", 16, 16, causal=False)
    with pytest.raises(ValueError, match="identity keeps the width"):
        make_layer("identity", 16, 32, causal=False)
    with pytest.raises(ValueError, match="needs a reduction"):
        make_layer("light_conv_3x1", 16, 16, causal=False)
    with pytest.raises(ValueError, match="needs the encoder memory"):
        make_layer("encoder_attention", 16, 16, causal=True, heads=4, d_memory=16)(
            inputs(), Context()
        )
