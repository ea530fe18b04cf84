"""The search's two seeds, the paper's warm start: the Transformer and the Evolved Transformer.

Both are written in the Evolved Transformer space's encoding (`search_spaces.architecture`):
two Transformer layers per cell, as So et al. (2019) pack them, so each seed is the smallest
model of its kind the space holds at a cell count, and the parameter window is measured
against the Transformer. `search_spaces.evolved_transformer.seed_params` turns either into
the answers that replay it through `sample`. The Transformers `transformer(...)` builds, over
its hyper-parameters, are the second space (`search_spaces.transformer_space`).
"""

from __future__ import annotations

from search_spaces.architecture import (
    DECODER_BLOCKS,
    HEADS,
    Architecture,
    Block,
    Branch,
    Cell,
)

__all__ = ["evolved_transformer", "transformer"]


def _id(i: int) -> Branch:
    return Branch(i, "identity")


def _dead() -> Branch:
    return Branch(0, "dead")


def _ln(i: int, layer: str, dim: float, act: str = "none", heads: int | None = None) -> Branch:
    return Branch(i, layer, "layer_norm", dim, act, heads)


def _copy(i: int) -> Block:
    """A block that passes hidden state i on unchanged: fills cells to their block count."""
    return Block(_id(i), _dead())


def _check_seed(d_model: int, n_heads: int, n_enc: int, n_dec: int) -> None:
    if n_heads not in HEADS:
        raise ValueError(f"n_heads {n_heads} must be one of {HEADS}")
    if n_enc < 0 or n_dec < 1:
        raise ValueError(f"need n_enc >= 0 (0: decoder-only) and n_dec >= 1, got {n_enc}, {n_dec}")


def transformer(
    d_model: int = 512,
    n_heads: int = 8,
    n_enc: int = 6,
    n_dec: int = 6,
    *,
    ff: float = 4.0,
    activation: str = "relu",
) -> Architecture:
    """The pre-norm Transformer (Vaswani et al. 2017, tensor2tensor's layout) with n_enc
    encoder and n_dec decoder layers, two layers per cell as in So et al. (encoder: 3
    blocks per layer, decoder: 4), so n_enc and n_dec must be even; n_enc=0 gives a
    decoder-only Transformer (its 6 blocks per cell are followed by 2 copy blocks).

    Per layer: x + attn(ln x); [decoder: x + enc_attn(ln x)]; x + W2 act(W1 ln x), W1 of
    width ff * d_model, act the `activation` (the paper's ReLU by default). Equal in
    parameters to `nn.Transformer(norm_first=True)` of the same size once compiled (its
    final LayerNorms are compile's memory norm and head norm).
    """
    _check_seed(d_model, n_heads, n_enc, n_dec)
    if n_enc % 2 or n_dec % 2:
        raise ValueError(f"n_enc ({n_enc}) and n_dec ({n_dec}) must be even: 2 layers per cell")

    def attention(i: int, layer: str = "attention") -> Block:  # h_{i+1} = h_i + attn(ln h_i)
        return Block(_ln(i, layer, 1.0, heads=n_heads), _id(i))

    def feed_forward(i: int) -> list[Block]:  # h_{i+1} = act(W1 ln h_i); h_{i+2} = h_i + ..
        hidden = Block(_ln(i, "conv_1x1", ff, activation), _dead())
        return [hidden, Block(Branch(i + 1, "conv_1x1", dim=1.0), _id(i))]

    def decoder_layer(i: int) -> list[Block]:
        if n_enc == 0:
            return [attention(i), *feed_forward(i + 1)]
        return [attention(i), attention(i + 1, "encoder_attention"), *feed_forward(i + 2)]

    encoder = [attention(0), *feed_forward(1), attention(3), *feed_forward(4)]
    decoder = decoder_layer(0)
    decoder += decoder_layer(len(decoder))
    decoder += [_copy(i) for i in range(len(decoder), DECODER_BLOCKS)]
    enc_cell = Cell(tuple(encoder)) if n_enc else None
    return Architecture(d_model, n_enc // 2, enc_cell, n_dec // 2, Cell(tuple(decoder)))


def evolved_transformer(
    d_model: int = 512, n_heads: int = 8, n_enc: int = 3, n_dec: int = 4
) -> Architecture:
    """The Evolved Transformer's final cells (So et al. 2019, Figure 4; tensor2tensor's
    `evolved_transformer.py`); 3 + 4 cells match the 6 + 6-layer Transformer's size.

    Encoder: x + GLU(ln x); then ln: dense 4d relu + conv 3x1 d/2 relu, added; then
    x + sep conv 9x1 d/2 (ln of that); x + attn(ln x); x + dense d (dense 4d relu (ln x)).
    Decoder: x + attn with min(2 n_heads, 16) heads + enc_attn, both on ln x; then ln: sep
    conv 11x1 2d relu + sep conv 7x1 d/2, added; x + sep conv 7x1 d (ln of that);
    x + attn(ln x); x + enc_attn(ln x); x + dense d (ln swish dense 4d (ln x)).
    n_enc=0 drops the two encoder attentions (blocks that copy their input instead).
    """
    _check_seed(d_model, n_heads, n_enc, n_dec)
    encoder = (
        Block(_ln(0, "glu", 1.0), _id(0)),
        Block(_ln(1, "conv_1x1", 4.0, "relu"), _ln(1, "conv_3x1", 0.5, "relu")),
        Block(_ln(2, "sep_conv_9x1", 0.5), _id(1)),
        Block(_ln(3, "attention", 1.0, heads=n_heads), _id(3)),
        Block(_ln(4, "conv_1x1", 4.0, "relu"), _dead()),
        Block(Branch(5, "conv_1x1", dim=1.0), _id(4)),
    )
    wide_heads = min(2 * n_heads, max(HEADS))

    def attend_encoder(i: int, reads: int) -> Block:
        if n_enc == 0:
            return _copy(i)
        return Block(_ln(reads, "encoder_attention", 1.0, heads=n_heads), _id(i))

    decoder = (
        Block(_ln(0, "attention", 1.0, heads=wide_heads), _id(0)),
        attend_encoder(1, reads=0),  # in parallel with block 0: both read ln(h0)
        Block(_ln(2, "sep_conv_11x1", 2.0, "relu"), _ln(2, "sep_conv_7x1", 0.5)),
        Block(_ln(3, "sep_conv_7x1", 1.0), _id(2)),
        Block(_ln(4, "attention", 1.0, heads=n_heads), _id(4)),
        attend_encoder(5, reads=5),
        Block(_ln(6, "conv_1x1", 4.0, "swish"), _dead()),
        Block(_ln(7, "conv_1x1", 1.0), _id(6)),
    )
    enc_cell = Cell(encoder) if n_enc else None
    return Architecture(d_model, n_enc, enc_cell, n_dec, Cell(decoder))
