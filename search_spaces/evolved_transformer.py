"""The Evolved Transformer search space: define-by-run sampling, validity, and the seeds.

`sample(suggest)` asks a `Suggest` (an Optuna trial, a `FixedSuggest`, a `RandomSuggest`)
for every choice under a stable name and returns an `Architecture`. Parameter names:

    d_model                          one choice, or a few if `d_model` is a sequence
    enc.cells, dec.cells             cells per side, in [cells[0], cells[1]]
    dec.cross_block                  encoder-decoder: the block whose left branch is
                                       attention to the encoder
    dec.cross_layer                    which attention, with the "mdha" primitive
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
       asked; with "mdha" the space offers two kinds of it, asked as `dec.cross_layer`;
       the other branches may attend too);
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

The seeds `transformer(...)` and `evolved_transformer(...)` (`search_spaces.seeds`, also
importable from here) are the paper's warm start;
`seed_params(arch)` is the flat dict that `FixedSuggest` or `study.enqueue_trial` replays
through `sample` to give the same architecture back (for any architecture that follows
rules 1 and 3 as encoded: dead branches on the right, a left cross branch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from search_spaces.architecture import (
    ACTIVATIONS,
    ATTENTION_LAYERS,
    COMBINERS,
    CROSS_LAYERS,
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
from search_spaces.seeds import evolved_transformer, transformer
from search_spaces.suggest import CategoricalChoice, Suggest, choose

__all__ = [
    "DEFAULT_WINDOW",
    "PRIMITIVES",
    "ParamWindow",
    "Primitive",
    "evolved_transformer",
    "sample",
    "seed_params",
    "transformer",
    "validate",
    "with_residual",
]

Primitive = Literal["squared_relu", "mdha"]
PRIMITIVES: tuple[Primitive, ...] = ("squared_relu", "mdha")
# what each optional primitive adds to the space's choices (`sample(primitives=...)`)
_ADDED_ACTIVATIONS = {"squared_relu": ("squared_relu",)}
_ADDED_LAYERS = {"mdha": ("mdha", "encoder_mdha")}
_OPTIONAL_ACTIVATIONS = {a for added in _ADDED_ACTIVATIONS.values() for a in added}
_OPTIONAL_LAYERS = {n for added in _ADDED_LAYERS.values() for n in added}
CROSS_LAYER = "dec.cross_layer"  # the cross branch's layer, when the space offers several


@dataclass(frozen=True)
class _Choices:
    """The lists a space asks from: the paper's, plus what the optional primitives add."""

    activations: tuple[str, ...]
    layers: tuple[str, ...]  # for an encoder-decoder's decoder (the widest list)

    @classmethod
    def of(cls, primitives: Sequence[str]) -> _Choices:
        unknown = [p for p in primitives if p not in PRIMITIVES]
        if unknown or isinstance(primitives, str):
            raise ValueError(f"primitives {primitives!r}: each must be one of {PRIMITIVES}")
        activations = {a for p in primitives for a in _ADDED_ACTIVATIONS.get(p, ())}
        layers = {n for p in primitives for n in _ADDED_LAYERS.get(p, ())}
        return cls(
            tuple(a for a in ACTIVATIONS if a not in _OPTIONAL_ACTIVATIONS or a in activations),
            tuple(n for n in LAYER_NAMES if n not in _OPTIONAL_LAYERS or n in layers),
        )

    def side_layers(self, attends: bool) -> tuple[str, ...]:
        """A side's layers: attention to the encoder only where the cell attends to it."""
        return self.layers if attends else tuple(n for n in self.layers if n not in CROSS_LAYERS)

    @property
    def cross_layers(self) -> tuple[str, ...]:
        return tuple(n for n in self.layers if n in CROSS_LAYERS)


WindowSeed = Literal["transformer", "evolved_transformer"]
WINDOW_SEEDS: tuple[WindowSeed, ...] = ("transformer", "evolved_transformer")


@dataclass(frozen=True)
class ParamWindow:
    """Valid parameter counts: [low, high] x the body (no embeddings, no vocabulary) of a
    seed at the same d_model: the Transformer with `layers` layers per side, or (`seed`)
    the Evolved Transformer with `layers / 2` cells per side, its size (a window of
    [0.3, 1.02] around the ET: up to 2% larger than it)."""

    low: float = 0.5
    high: float = 2.0
    layers: int = 6
    seed: WindowSeed = "transformer"

    def __post_init__(self) -> None:
        if not 0 <= self.low <= self.high:
            raise ValueError(f"parameter window needs 0 <= low <= high, got {self}")
        if self.layers < 2 or self.layers % 2:
            raise ValueError(f"the reference Transformer needs an even number of layers: {self}")
        if self.seed not in WINDOW_SEEDS:
            raise ValueError(f"window seed {self.seed!r} is not valid; valid: {WINDOW_SEEDS}")

    def describe(self) -> str:
        """The seed, in words: "6-layer Transformer", "1-cell Evolved Transformer"."""
        if self.seed == "evolved_transformer":
            return f"{self.layers // 2}-cell Evolved Transformer"
        return f"{self.layers}-layer Transformer"

    def reference(self, d_model: int, decoder_only: bool) -> int:
        """The body parameters of the window's seed at `d_model`."""
        if self.seed == "evolved_transformer":
            cells = self.layers // 2
            seed = evolved_transformer(d_model, HEADS[0], 0 if decoder_only else cells, cells)
        else:
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
            if branch.layer in CROSS_LAYERS and not attends:
                raise InvalidArchitecture(
                    f"{side}.block{i}.{lr}: attention to the encoder is only for the decoder "
                    "of an encoder-decoder model"
                )
    if attends and not any(b.layer in CROSS_LAYERS for k in cell.blocks for b in k.branches):
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
                f"{window.describe()}'s {reference:,} at d_model {arch.d_model}"
            )


# --- define-by-run sampling -----------------------------------------------------------------


def _sample_branch(
    suggest: Suggest,
    name: str,
    block: int,
    layers: Sequence[str],
    activations: Sequence[str],
    *,
    cross: str | None = None,
) -> Branch:
    """A branch of block `block` (it may read hidden states 0..block); `cross`: for the
    branch that attends to the encoder, the name its layer is asked under when there is a
    choice of it (not `<name>.layer`, whose choices differ: the cross block moves)."""
    if cross is not None:
        layer = layers[0] if len(layers) == 1 else choose(suggest, cross, layers)
    else:
        if choose(suggest, f"{name}.skip", (True, False)):
            return Branch(suggest.suggest_int(f"{name}.input", 0, block), "identity")
        layer = choose(suggest, f"{name}.layer", [n for n in layers if n != "identity"])
    if layer == "dead":
        return Branch(0, "dead")
    index = suggest.suggest_int(f"{name}.input", 0, block)
    norm = choose(suggest, f"{name}.norm", NORMS)
    dim = choose(suggest, f"{name}.dim", DIMS) if has_dim(layer) else None
    act = choose(suggest, f"{name}.activation", activations)
    attention = layer in ATTENTION_LAYERS
    heads = choose(suggest, f"{name}.heads", HEADS) if attention else None
    light = layer.startswith("light_conv")
    reduction = choose(suggest, f"{name}.reduction", REDUCTIONS) if light else None
    return Branch(index, layer, norm, dim, act, heads, reduction)


def _sample_cell(
    suggest: Suggest, side: str, n_blocks: int, choices: _Choices, cross: int | None, repair: bool
) -> Cell:
    """A cell whose blocks follow rules 1-3 (module docstring); rule 4 by `with_residual`."""
    layers, acts = choices.side_layers(attends=cross is not None), choices.activations
    left_layers = [n for n in layers if n != "dead"]  # rule 1
    blocks = []
    for i in range(n_blocks):
        name = f"{side}.block{i}"
        if i == cross:  # rule 3
            left = _sample_branch(
                suggest, f"{name}.left", i, choices.cross_layers, acts, cross=CROSS_LAYER
            )
        else:
            left = _sample_branch(suggest, f"{name}.left", i, left_layers, acts)
        right = _sample_branch(suggest, f"{name}.right", i, layers, acts)
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
    primitives: Sequence[Primitive] = (),
) -> Architecture:
    """Ask `suggest` for an architecture: always valid but for `window`, which raises
    InvalidArchitecture when the parameter count falls outside it. `repair=False` skips the
    residual repair (rule 4), so a cell without a residual path is rejected instead: the
    same answers then say whether `sample` repaired them (a valid result is the same).

    `primitives` (of PRIMITIVES) adds Primer's to the choices: "squared_relu" to every
    branch's activations, "mdha" to the attention layers (self-attention, and attention to
    the encoder, asked as `dec.cross_layer` for the cross branch). Without them the space
    asks exactly the paper's questions, so older studies resume."""
    choices = _Choices.of(primitives)
    d_models = [d_model] if isinstance(d_model, int) else list(d_model)
    if not 1 <= cells[0] <= cells[1]:
        raise ValueError(f"cells range {cells} must satisfy 1 <= low <= high")
    d = choose(suggest, "d_model", d_models)
    n_enc, encoder, cross = 0, None, None
    if not decoder_only:
        n_enc = suggest.suggest_int("enc.cells", *cells)
        encoder = _sample_cell(suggest, "enc", ENCODER_BLOCKS, choices, None, repair)
        cross = suggest.suggest_int("dec.cross_block", 0, DECODER_BLOCKS - 1)
    n_dec = suggest.suggest_int("dec.cells", *cells)
    decoder = _sample_cell(suggest, "dec", DECODER_BLOCKS, choices, cross, repair)
    arch = Architecture(d, n_enc, encoder, n_dec, decoder)
    validate(arch, window=window)
    return arch


def _branch_params(
    name: str, b: Branch, *, cross: _Choices | None = None
) -> dict[str, CategoricalChoice]:
    """The answers `_sample_branch` needs to return b (`cross`: the cross branch of a space
    with these choices, whose layer is asked only when there is a choice of it)."""
    skip = b.layer == "identity"
    params: dict[str, CategoricalChoice] = {}
    if cross is not None:
        if len(cross.cross_layers) > 1:
            params[CROSS_LAYER] = b.layer
    else:
        params[f"{name}.skip"] = skip
        if not skip:
            params[f"{name}.layer"] = b.layer
    if b.dead:
        return params
    params[f"{name}.input"] = b.input
    if has_norm_and_activation(b.layer):  # the fields that apply are the ones not None
        fields = {
            "norm": b.norm,
            "dim": b.dim,
            "activation": b.activation,
            "heads": b.heads,
            "reduction": b.reduction,
        }
        params |= {f"{name}.{k}": v for k, v in fields.items() if v is not None}
    return params


def _cell_params(
    side: str, cell: Cell, choices: _Choices, cross: int | None = None
) -> dict[str, CategoricalChoice]:
    params: dict[str, CategoricalChoice] = {}
    for i, block in enumerate(cell.blocks):
        if block.left.dead:
            raise ValueError(
                f"{side}.block{i}: the left branch is dead; this space keeps "
                "dead branches on the right (mirror the block)"
            )
        crossing = choices if i == cross else None
        params |= _branch_params(f"{side}.block{i}.left", block.left, cross=crossing)
        params |= _branch_params(f"{side}.block{i}.right", block.right)
        if not block.right.dead:
            params[f"{side}.block{i}.combiner"] = block.combiner
    return params


def _cross_block(cell: Cell) -> int:
    """The first block whose left branch attends to the encoder (`dec.cross_block`)."""
    for i, block in enumerate(cell.blocks):
        if block.left.layer in CROSS_LAYERS:
            return i
    raise ValueError(
        "the decoder cell has no left branch attending to the encoder; this "
        "space asks for one (dec.cross_block)"
    )


def seed_params(
    arch: Architecture, *, primitives: Sequence[Primitive] = ()
) -> dict[str, CategoricalChoice]:
    """The flat parameters that make `sample` return `arch` (for `FixedSuggest` or
    `study.enqueue_trial`); pass `sample` the same d_model, decoder_only and primitives."""
    choices = _Choices.of(primitives)
    params: dict[str, CategoricalChoice] = {"d_model": arch.d_model}
    cross = None
    if arch.encoder is not None:
        params["enc.cells"] = arch.encoder_cells
        params |= _cell_params("enc", arch.encoder, choices)
        cross = _cross_block(arch.decoder)
        params["dec.cross_block"] = cross
    params["dec.cells"] = arch.decoder_cells
    return params | _cell_params("dec", arch.decoder, choices, cross)
