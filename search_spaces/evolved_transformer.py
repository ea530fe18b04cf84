"""The Evolved Transformer search space: define-by-run sampling, validity, and the seeds.

`sample(suggest)` asks a `Suggest` (an Optuna trial, a `FixedSuggest`, a `RandomSuggest`)
for every choice under a stable name and returns an `Architecture`. Parameter names:

    d_model                          one choice, or a few if `d_model` is a sequence
    enc.cells, dec.cells             cells per side, in [cells[0], cells[1]]
    dec.cross_block                  encoder-decoder: the block whose left branch is
                                       attention to the encoder
    enc.block3.left.skip             every branch: True = an identity (skip) branch
    enc.block3.left.layer              when not a skip: any other layer (right: dead too)
    enc.block3.left.input              not for a dead branch
    enc.block3.left.norm               not for skip / dead
    enc.block3.left.dim                layers whose width is a choice (see architecture.py)
    enc.block3.left.activation         not for skip / dead
    enc.block3.left.heads              attention layers
    enc.block3.left.reduction          lightweight convolutions
    enc.block3.combiner              only when both branches are live

Every sample is a valid architecture (`validate` with no parameter window passes), so every
sampler's proposals are trials worth training. Choices for a name never change within a
study (Optuna requires it), so the rules hold by how the space is encoded, or by one
deterministic repair, numbered as `validate` checks them:

    1. at most one dead branch per block: only the right branch may be dead (a block whose
       left branch is dead computes what the mirrored block computes: no combiner applies);
    2. attention to the encoder only in an encoder-decoder's decoder: only its layer lists
       hold it;
    3. every decoder cell of an encoder-decoder attends to the encoder: `dec.cross_block`
       names the block whose left branch is that attention (its `skip` and `layer` are not
       asked; the other branches may attend too);
    4. a residual path from the cell input to a cell output: a cell without one (3 in 4
       uniform samples) is repaired: the first block whose combiner, made "add", gives it
       a path gets "add" (one answer overridden; half the repairs); else its last block's
       right branch becomes an identity of the last state on the residual chain, joined by
       "add" (the last state is read by no block, so it is always a cell output; the cross
       branch is a left branch, so rule 3 still holds). A pure function of the answers, the
       same on every process; valid cells are never changed; `repair=False` rejects instead;
    5. the parameter window (optional): the one rule a sample can still break; `sample`
       raises `InvalidArchitecture` for it.

The skip decision comes first so that a uniform sampler proposes identity branches half
the time, as often as the seeds use them, instead of 1 time in 15.

The seeds `transformer(...)` and `evolved_transformer(...)` are the paper's warm start;
`seed_params(arch)` is the flat dict that `FixedSuggest` or `study.enqueue_trial` replays
through `sample` to give the same architecture back (for any architecture that follows
rules 1 and 3 as encoded: dead branches on the right, a left cross branch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from search_spaces.architecture import (
    ACTIVATIONS,
    COMBINERS,
    DECODER_BLOCKS,
    DIMS,
    ENCODER_BLOCKS,
    HEADS,
    LAYER_NAMES,
    NORMS,
    REDUCTIONS,
    Architecture,
    Block,
    Branch,
    Cell,
    InvalidArchitecture,
    cell_outputs,
    has_dim,
    has_norm_and_activation,
)
from search_spaces.compile import parameter_count
from search_spaces.suggest import CategoricalChoice, Suggest, choose

__all__ = [
    "DEFAULT_WINDOW",
    "ParamWindow",
    "evolved_transformer",
    "sample",
    "seed_params",
    "transformer",
    "validate",
    "with_residual",
]

DECODER_LAYERS = LAYER_NAMES
ENCODER_LAYERS = tuple(n for n in LAYER_NAMES if n != "encoder_attention")  # also decoder-only


@dataclass(frozen=True)
class ParamWindow:
    """Valid parameter counts: [low, high] x the body (no embeddings, no vocabulary) of the
    seed Transformer with `layers` layers per side at the same d_model."""

    low: float = 0.5
    high: float = 2.0
    layers: int = 6

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"parameter window needs 0 <= low <= high, got {self}")
        if self.layers < 2 or self.layers % 2:
            raise ValueError(f"the reference Transformer needs an even number of layers: {self}")

    def reference(self, d_model: int, decoder_only: bool) -> int:
        seed = transformer(d_model, HEADS[0], 0 if decoder_only else self.layers, self.layers)
        return parameter_count(seed)


DEFAULT_WINDOW = ParamWindow()

# --- validity -------------------------------------------------------------------------------


def _reached(blocks: Sequence[Block]) -> set[int]:
    """States reached from the cell input by identity branches in add (or dead) blocks."""
    reached = {0}
    for i, block in enumerate(blocks):
        skips = [b for b in block.branches if b.layer == "identity" and b.input in reached]
        if skips and block.combiner == "add":  # dead-branch blocks are canonically "add"
            reached.add(i + 1)
    return reached


def _residual_path(cell: Cell) -> bool:
    """Whether the residual chain (`_reached`) reaches a cell output. The output's projection
    to d_model, if its width differs, counts as part of it (a shortcut, as in ResNet)."""
    return not _reached(cell.blocks).isdisjoint(cell_outputs(cell))


def _check_cell(side: str, cell: Cell, attends: bool) -> None:
    """Rules for one cell; attends: whether it may (and must) attend to the encoder."""
    for i, block in enumerate(cell.blocks):
        if block.left.dead and block.right.dead:
            raise InvalidArchitecture(
                f"{side}.block{i}: both branches are dead (at most one dead branch per block)"
            )
        for lr, branch in zip(("left", "right"), block.branches, strict=True):
            if branch.layer == "encoder_attention" and not attends:
                raise InvalidArchitecture(
                    f"{side}.block{i}.{lr}: attention to the encoder is only for the decoder "
                    "of an encoder-decoder model"
                )
    if attends and not any(b.layer == "encoder_attention" for k in cell.blocks for b in k.branches):
        raise InvalidArchitecture(f"{side}: the decoder cell never attends to the encoder")
    if not _residual_path(cell):
        raise InvalidArchitecture(
            f"{side}: no residual path from the cell input to its output (a chain of identity "
            "branches joined by add)"
        )


def validate(arch: Architecture, *, window: ParamWindow | None = DEFAULT_WINDOW) -> None:
    """Raise InvalidArchitecture if `arch` breaks a rule of the space: two dead branches in
    a block; attention to the encoder outside an encoder-decoder's decoder, or a decoder
    cell that never attends to it; no residual path through a cell; a parameter count
    outside `window` (None: no window)."""
    if not isinstance(arch, Architecture):
        raise TypeError(f"expected an Architecture, got {type(arch).__name__}")
    if arch.encoder is not None:
        _check_cell("enc", arch.encoder, attends=False)
    _check_cell("dec", arch.decoder, attends=not arch.decoder_only)
    if window is not None:
        count, reference = parameter_count(arch), window.reference(arch.d_model, arch.decoder_only)
        if not window.low * reference <= count <= window.high * reference:
            raise InvalidArchitecture(
                f"{count:,} parameters is outside [{window.low}x, {window.high}x] of the "
                f"{window.layers}-layer Transformer's {reference:,} at d_model {arch.d_model}"
            )


# --- define-by-run sampling -----------------------------------------------------------------


def _sample_branch(
    suggest: Suggest, name: str, block: int, layers: Sequence[str], *, layer: str | None = None
) -> Branch:
    """A branch of block `block` (it may read hidden states 0..block); `layer` fixes the
    layer instead of asking for it (the cross branch)."""
    if layer is None:
        if choose(suggest, f"{name}.skip", (True, False)):
            return Branch(suggest.suggest_int(f"{name}.input", 0, block), "identity")
        layer = choose(suggest, f"{name}.layer", [n for n in layers if n != "identity"])
    if layer == "dead":
        return Branch(0, "dead")
    index = suggest.suggest_int(f"{name}.input", 0, block)
    norm = choose(suggest, f"{name}.norm", NORMS)
    dim = choose(suggest, f"{name}.dim", DIMS) if has_dim(layer) else None
    act = choose(suggest, f"{name}.activation", ACTIVATIONS)
    attention = layer in ("attention", "encoder_attention")
    heads = choose(suggest, f"{name}.heads", HEADS) if attention else None
    light = layer.startswith("light_conv")
    reduction = choose(suggest, f"{name}.reduction", REDUCTIONS) if light else None
    return Branch(index, layer, norm, dim, act, heads, reduction)


def _sample_cell(suggest: Suggest, side: str, n_blocks: int, layers: Sequence[str],
                 cross: int | None, repair: bool) -> Cell:  # fmt: skip
    """A cell whose blocks follow rules 1-3 (module docstring); rule 4 by `with_residual`."""
    left_layers = [n for n in layers if n != "dead"]  # rule 1
    blocks = []
    for i in range(n_blocks):
        fixed = "encoder_attention" if i == cross else None  # rule 3
        left = _sample_branch(suggest, f"{side}.block{i}.left", i, left_layers, layer=fixed)
        right = _sample_branch(suggest, f"{side}.block{i}.right", i, layers)
        combiner = "add" if right.dead else choose(suggest, f"{side}.block{i}.combiner", COMBINERS)
        blocks.append(Block(left, right, combiner))
    cell = Cell(tuple(blocks))
    return with_residual(cell) if repair else cell


def with_residual(cell: Cell) -> Cell:
    """`cell` itself if it has a residual path, else repaired by rule 4 (module docstring):
    the first combiner that, made "add", gives it one; else the last block's right branch
    becomes an identity of the chain's last state, by "add"."""
    if _residual_path(cell):
        return cell
    blocks = cell.blocks
    for i, block in enumerate(blocks):
        if block.combiner != "add":  # dead-branch blocks are "add" already
            added = Cell((*blocks[:i], replace(block, combiner="add"), *blocks[i + 1 :]))
            if _residual_path(added):
                return added
    *before, last = blocks
    return Cell((*before, Block(last.left, Branch(max(_reached(before)), "identity"), "add")))


def sample(
    suggest: Suggest,
    *,
    d_model: int | Sequence[int] = 512,
    decoder_only: bool = False,
    cells: tuple[int, int] = (1, 6),
    window: ParamWindow | None = DEFAULT_WINDOW,
    repair: bool = True,
) -> Architecture:
    """Ask `suggest` for an architecture: always valid but for `window`, which raises
    InvalidArchitecture when the parameter count falls outside it. `repair=False` skips the
    residual repair (rule 4), so a cell without a residual path is rejected instead: the
    same answers then say whether `sample` repaired them (a valid result is the same)."""
    d_models = [d_model] if isinstance(d_model, int) else list(d_model)
    if not 1 <= cells[0] <= cells[1]:
        raise ValueError(f"cells range {cells} must satisfy 1 <= low <= high")
    d = choose(suggest, "d_model", d_models)
    n_enc, encoder, cross = 0, None, None
    if not decoder_only:
        n_enc = suggest.suggest_int("enc.cells", *cells)
        encoder = _sample_cell(suggest, "enc", ENCODER_BLOCKS, ENCODER_LAYERS, None, repair)
        cross = suggest.suggest_int("dec.cross_block", 0, DECODER_BLOCKS - 1)
    n_dec = suggest.suggest_int("dec.cells", *cells)
    decoder_layers = ENCODER_LAYERS if decoder_only else DECODER_LAYERS
    decoder = _sample_cell(suggest, "dec", DECODER_BLOCKS, decoder_layers, cross, repair)
    arch = Architecture(d, n_enc, encoder, n_dec, decoder)
    validate(arch, window=window)
    return arch


def _branch_params(
    name: str, b: Branch, *, fixed_layer: bool = False
) -> dict[str, CategoricalChoice]:
    """The answers `_sample_branch` needs to return b (`fixed_layer`: its layer is not
    asked, as for the cross branch)."""
    skip = b.layer == "identity"
    params: dict[str, CategoricalChoice] = {}
    if not fixed_layer:
        params[f"{name}.skip"] = skip
        if not skip:
            params[f"{name}.layer"] = b.layer
    if b.dead:
        return params
    params[f"{name}.input"] = b.input
    if has_norm_and_activation(b.layer):  # the fields that apply are the ones not None
        fields = {"norm": b.norm, "dim": b.dim, "activation": b.activation, "heads": b.heads,
                  "reduction": b.reduction}  # fmt: skip
        params |= {f"{name}.{k}": v for k, v in fields.items() if v is not None}
    return params


def _cell_params(side: str, cell: Cell, cross: int | None = None) -> dict[str, CategoricalChoice]:
    params: dict[str, CategoricalChoice] = {}
    for i, block in enumerate(cell.blocks):
        if block.left.dead:
            raise ValueError(f"{side}.block{i}: the left branch is dead; this space keeps "
                             "dead branches on the right (mirror the block)")  # fmt: skip
        params |= _branch_params(f"{side}.block{i}.left", block.left, fixed_layer=i == cross)
        params |= _branch_params(f"{side}.block{i}.right", block.right)
        if not block.right.dead:
            params[f"{side}.block{i}.combiner"] = block.combiner
    return params


def _cross_block(cell: Cell) -> int:
    """The first block whose left branch attends to the encoder (`dec.cross_block`)."""
    for i, block in enumerate(cell.blocks):
        if block.left.layer == "encoder_attention":
            return i
    raise ValueError("the decoder cell has no left branch attending to the encoder; this "
                     "space asks for one (dec.cross_block)")  # fmt: skip


def seed_params(arch: Architecture) -> dict[str, CategoricalChoice]:
    """The flat parameters that make `sample` return `arch` (for `FixedSuggest` or
    `study.enqueue_trial`); pass `sample` the same d_model and decoder_only."""
    params: dict[str, CategoricalChoice] = {"d_model": arch.d_model}
    cross = None
    if arch.encoder is not None:
        params["enc.cells"] = arch.encoder_cells
        params |= _cell_params("enc", arch.encoder)
        cross = _cross_block(arch.decoder)
        params["dec.cross_block"] = cross
    params["dec.cells"] = arch.decoder_cells
    return params | _cell_params("dec", arch.decoder, cross)


# --- seeds ----------------------------------------------------------------------------------


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
    d_model: int = 512, n_heads: int = 8, n_enc: int = 6, n_dec: int = 6, *, ff: float = 4.0
) -> Architecture:
    """The pre-norm Transformer (Vaswani et al. 2017, tensor2tensor's layout) with n_enc
    encoder and n_dec decoder layers, two layers per cell as in So et al. (encoder: 3
    blocks per layer, decoder: 4), so n_enc and n_dec must be even; n_enc=0 gives a
    decoder-only Transformer (its 6 blocks per cell are followed by 2 copy blocks).

    Per layer: x + attn(ln x); [decoder: x + enc_attn(ln x)]; x + W2 relu(W1 ln x), W1 of
    width ff * d_model. Equal in parameters to `nn.Transformer(norm_first=True)` of the
    same size once compiled (its final LayerNorms are compile's memory norm and head norm).
    """
    _check_seed(d_model, n_heads, n_enc, n_dec)
    if n_enc % 2 or n_dec % 2:
        raise ValueError(f"n_enc ({n_enc}) and n_dec ({n_dec}) must be even: 2 layers per cell")

    def attention(i: int, layer: str = "attention") -> Block:  # h_{i+1} = h_i + attn(ln h_i)
        return Block(_ln(i, layer, 1.0, heads=n_heads), _id(i))

    def feed_forward(i: int) -> list[Block]:  # h_{i+1} = relu(W1 ln h_i); h_{i+2} = h_i + ..
        hidden = Block(_ln(i, "conv_1x1", ff, "relu"), _dead())
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
