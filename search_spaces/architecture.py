"""Evolved Transformer architectures as plain, frozen, JSON-able data.

An architecture is what a NAS trial proposes and what gets logged, compared, replayed and
compiled; keeping it as data (not modules) lets every rank rebuild it and lets tests reason
about it without torch. The encoding follows So, Liang & Le (2019) and tensor2tensor's
`nas_model.py`:

    Architecture = d_model + (n encoder cells, encoder Cell) + (n decoder cells, decoder Cell)
    Cell         = blocks (6 in the encoder, 8 in the decoder), repeated n times
    Block        = left Branch + right Branch + combiner
    Branch       = input (hidden state index) -> norm -> layer -> activation

Inside a cell, hidden state 0 is the cell input and block i produces hidden state i+1; a
branch may read any earlier state. Widths are relative to d_model (`dim`, one of DIMS);
identity and lightweight convolutions keep their input's width. Block outputs:

* add: the narrower branch is zero-padded to the wider one's width (as tensor2tensor);
* multiply: the narrower branch is padded with ones;
* concatenate: the two are concatenated, then projected by a linear layer to the wider
  width, so hidden widths stay within DIMS * d_model instead of growing with depth;
* when one branch is dead, the block's output is the other branch (no combiner).

The cell's output is the sum of every hidden state that no live branch reads, each
projected to d_model by a linear layer when its width differs; so every cell maps
(batch, seq, d_model) -> (batch, seq, d_model) and cells stack and pipeline uniformly.

Attention layers project q/k/v within their input width and the output to `dim`; every
width is a multiple of d_model / 2, so with d_model a multiple of 32 any head count in HEADS
and any reduction in REDUCTIONS divides it. The seeds (`evolved_transformer.py`) pack two
Transformer layers per cell, as the paper does (3 blocks per encoder layer, 4 per decoder).

Fields that do not apply to a layer hold a canonical value (None, "none", 0), so two equal
architectures compare equal; `__post_init__` rejects anything else with InvalidArchitecture.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from pipeline.pure.checks import is_int
from search_spaces.layers import ACTIVATIONS, ATTENTION_LAYERS, CROSS_LAYERS, LAYER_NAMES

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_LAYERS",
    "COMBINERS",
    "CROSS_LAYERS",
    "DECODER_BLOCKS",
    "DIMS",
    "ENCODER_BLOCKS",
    "FORMAT_VERSION",
    "HEADS",
    "LAYER_NAMES",
    "NORMS",
    "REDUCTIONS",
    "Architecture",
    "Block",
    "Branch",
    "Cell",
    "InvalidArchitecture",
    "block_widths",
    "branch_text",
    "cell_outputs",
    "from_json",
    "functional_key",
    "has_dim",
    "has_norm_and_activation",
    "short_name",
    "summary",
    "to_json",
]


class InvalidArchitecture(ValueError):
    """An architecture breaks a rule of the search space; the message says which and where."""


ENCODER_BLOCKS, DECODER_BLOCKS = 6, 8
NORMS = ("layer_norm", "none")
DIMS = (0.5, 1.0, 2.0, 4.0)  # branch output width / d_model
HEADS = (4, 8, 16)
REDUCTIONS = (1, 4, 16)  # lightweight conv: channels per shared kernel
COMBINERS = ("add", "concat", "multiply")
D_MODEL_MULTIPLE = 32  # d_model / 2 must split into 16 heads and 16 shared kernels
FORMAT_VERSION = 1

WIDTH_KEEPING = ("identity", "dead", *(n for n in LAYER_NAMES if n.startswith("light_conv")))


def has_dim(layer: str) -> bool:
    """Whether the layer's output width is a choice (else it is its input's width)."""
    return layer not in WIDTH_KEEPING


def has_norm_and_activation(layer: str) -> bool:
    """Identity is a pure skip connection and the dead branch is nothing: neither has a
    norm or an activation; every other layer has both."""
    return layer not in ("identity", "dead")


@dataclass(frozen=True)
class Branch:
    """input: hidden state index; norm in NORMS; layer in LAYER_NAMES; dim in DIMS (None
    for width-keeping layers); activation in ACTIVATIONS; heads (attention layers) in HEADS;
    reduction (light_conv_*) in REDUCTIONS."""

    input: int
    layer: str
    norm: str = "none"
    dim: float | None = None
    activation: str = "none"
    heads: int | None = None
    reduction: int | None = None

    def __post_init__(self) -> None:
        def bad(why: str) -> InvalidArchitecture:
            return InvalidArchitecture(f"branch {self}: {why}")

        if self.layer not in LAYER_NAMES:
            raise bad(f"unknown layer; expected one of {LAYER_NAMES}")
        if not is_int(self.input) or self.input < 0:
            raise bad("input must be a hidden state index >= 0")
        if self.layer == "dead" and self.input != 0:
            raise bad("a dead branch reads nothing; its input must be 0")
        if has_norm_and_activation(self.layer):
            if self.norm not in NORMS:
                raise bad(f"norm must be one of {NORMS}")
            if self.activation not in ACTIVATIONS:
                raise bad(f"activation must be one of {ACTIVATIONS}")
        elif (self.norm, self.activation) != ("none", "none"):
            raise bad(f"{self.layer} has no norm and no activation; both must be 'none'")
        if has_dim(self.layer):
            if self.dim not in DIMS:
                raise bad(f"dim must be one of {DIMS}")
            object.__setattr__(self, "dim", float(self.dim))  # 1 -> 1.0, as JSON may write it
        elif self.dim is not None:
            raise bad(f"{self.layer} keeps its input's width; dim must be None")
        if (self.layer in ATTENTION_LAYERS) != (self.heads is not None):
            raise bad("heads is set for attention layers only")
        if self.heads is not None and self.heads not in HEADS:
            raise bad(f"heads must be one of {HEADS}")
        if self.layer.startswith("light_conv") != (self.reduction is not None):
            raise bad("reduction is set for lightweight convolutions only")
        if self.reduction is not None and self.reduction not in REDUCTIONS:
            raise bad(f"reduction must be one of {REDUCTIONS}")

    @property
    def dead(self) -> bool:
        return self.layer == "dead"

    def width(self, d_in: int, d_model: int) -> int:
        """Output width given the input width (0 for a dead branch)."""
        if self.dead:
            return 0
        return d_in if self.dim is None else int(self.dim * d_model)


DEAD = Branch(0, "dead")


@dataclass(frozen=True)
class Block:
    left: Branch
    right: Branch
    combiner: str = "add"  # canonical "add" when a branch is dead (no combiner is applied)

    def __post_init__(self) -> None:
        if self.combiner not in COMBINERS:
            raise InvalidArchitecture(f"combiner {self.combiner!r} not in {COMBINERS}")
        if (self.left.dead or self.right.dead) and self.combiner != "add":
            raise InvalidArchitecture(
                "a block with a dead branch applies no combiner; combiner must be 'add'"
            )

    @property
    def branches(self) -> tuple[Branch, Branch]:
        return self.left, self.right


@dataclass(frozen=True)
class Cell:
    blocks: tuple[Block, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(self.blocks))
        for i, block in enumerate(self.blocks):
            for side, branch in zip(("left", "right"), block.branches, strict=True):
                if branch.input > i:
                    raise InvalidArchitecture(
                        f"block {i} {side} branch reads hidden state {branch.input}, which "
                        f"does not exist yet (block {i} may read states 0..{i})"
                    )


@dataclass(frozen=True)
class Architecture:
    """d_model; `encoder` is None (and encoder_cells 0) for a decoder-only model."""

    d_model: int
    encoder_cells: int
    encoder: Cell | None
    decoder_cells: int
    decoder: Cell

    def __post_init__(self) -> None:
        if self.d_model < D_MODEL_MULTIPLE or self.d_model % D_MODEL_MULTIPLE:
            raise InvalidArchitecture(
                f"d_model {self.d_model} must be a positive multiple of {D_MODEL_MULTIPLE}"
            )
        if (self.encoder is None) != (self.encoder_cells == 0):
            raise InvalidArchitecture("a decoder-only model has encoder=None and 0 encoder cells")
        if self.encoder_cells < 0 or self.decoder_cells < 1:
            raise InvalidArchitecture("cell counts: encoder >= 0, decoder >= 1")
        sides = (
            ("encoder", self.encoder, ENCODER_BLOCKS),
            ("decoder", self.decoder, DECODER_BLOCKS),
        )
        for name, cell, n in sides:
            if cell is not None and len(cell.blocks) != n:
                raise InvalidArchitecture(f"the {name} cell has {len(cell.blocks)} blocks, not {n}")

    @property
    def decoder_only(self) -> bool:
        return self.encoder is None


def block_widths(cell: Cell, d_model: int) -> list[int]:
    """Widths of the cell's hidden states: [d_model, block 0's output, ...]."""
    widths = [d_model]
    for block in cell.blocks:
        left = block.left.width(widths[block.left.input], d_model)
        right = block.right.width(widths[block.right.input], d_model)
        widths.append(max(left, right))  # add/multiply pad, concat projects back, dead = 0
    return widths


def cell_outputs(cell: Cell) -> list[int]:
    """Indexes of the hidden states no live branch reads: they sum to the cell's output."""
    read = {b.input for block in cell.blocks for b in block.branches if not b.dead}
    return [i for i in range(len(cell.blocks) + 1) if i not in read]


# --- JSON ---------------------------------------------------------------------------------


def _cell_json(cell: Cell | None, n: int) -> dict[str, Any] | None:
    return None if cell is None else {"cells": n, "blocks": [asdict(b) for b in cell.blocks]}


def to_json(arch: Architecture) -> str:
    """A versioned JSON document; `from_json` reads it back to an equal Architecture."""
    document = {
        "format": "evolved_transformer",
        "version": FORMAT_VERSION,
        "d_model": arch.d_model,
        "encoder": _cell_json(arch.encoder, arch.encoder_cells),
        "decoder": _cell_json(arch.decoder, arch.decoder_cells),
    }
    return json.dumps(document, sort_keys=True)


def _cell_from(data: dict[str, Any]) -> tuple[int, Cell]:
    blocks = []
    for block in data["blocks"]:
        left, right = Branch(**block["left"]), Branch(**block["right"])
        blocks.append(Block(left, right, block["combiner"]))
    return int(data["cells"]), Cell(tuple(blocks))


def from_json(text: str) -> Architecture:
    """Parse `to_json` output; ValueError (or InvalidArchitecture) says what is wrong."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"not a JSON architecture: {error}") from error
    if not isinstance(data, dict) or data.get("format") != "evolved_transformer":
        raise ValueError("not an evolved_transformer architecture document (no 'format' key)")
    if data.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"architecture format version {data.get('version')!r} is not supported "
            f"(this code reads version {FORMAT_VERSION})"
        )
    try:
        n_enc, encoder = _cell_from(data["encoder"]) if data["encoder"] else (0, None)
        n_dec, decoder = _cell_from(data["decoder"])
        return Architecture(int(data["d_model"]), n_enc, encoder, n_dec, decoder)
    except (KeyError, TypeError) as error:
        raise ValueError(f"malformed architecture document: {error!r}") from error


def _branch_order(branch: Branch) -> str:
    return json.dumps(asdict(branch), sort_keys=True)


def functional_key(arch: Architecture) -> str:
    """A key equal for architectures that compute the same family of networks: `to_json`
    of `arch` with the two live branches of every block put in one order (every combiner
    is symmetric: add and multiply commute, and concatenation is followed by a learned
    projection, which absorbs the order). Two trials with equal keys train the same model.
    """

    def ordered(cell: Cell) -> Cell:
        blocks = []
        for block in cell.blocks:
            left, right = block.branches
            if not right.dead and _branch_order(right) < _branch_order(left):
                left, right = right, left
            blocks.append(Block(left, right, block.combiner))
        return Cell(tuple(blocks))

    encoder = None if arch.encoder is None else ordered(arch.encoder)
    return to_json(replace(arch, encoder=encoder, decoder=ordered(arch.decoder)))


# --- one line for logs ----------------------------------------------------------------------

_SHORT = {
    "identity": "id",
    "encoder_attention": "enc_attn",
    "attention": "attn",
    "encoder_mdha": "enc_mdha",
}
_DIM_TEXT = {0.5: "d/2", 1.0: "d", 2.0: "2d", 4.0: "4d"}
_COMBINER_TEXT = {"add": "+", "multiply": "*", "concat": "&"}


def branch_text(b: Branch) -> str:
    """A branch in `summary`'s notation (e.g. `ln.attn4h>d@0`)."""
    if b.dead:
        return "dead"
    text = ("ln." if b.norm == "layer_norm" else "") + _SHORT.get(b.layer, b.layer)
    text += f"{b.heads}h" if b.heads else ""
    text += f"r{b.reduction}" if b.reduction else ""
    text += f">{_DIM_TEXT[b.dim]}" if b.dim is not None else ""
    text += f".{b.activation}" if b.activation != "none" else ""
    return f"{text}@{b.input}"


def _cell_text(cell: Cell) -> str:
    blocks = []
    for block in cell.blocks:
        live = [b for b in block.branches if not b.dead]
        op = f" {_COMBINER_TEXT[block.combiner]} " if len(live) == 2 else ""
        blocks.append(op.join(branch_text(b) for b in live))
    return "[" + " | ".join(blocks) + "]"


def short_name(arch: Architecture) -> str:
    """A few words for a table: width, cells per side and the live branches by kind, e.g.
    `d64 e1 d2 4ffn 3attn 2xattn 1glu` (`summary` has every detail)."""
    kinds: dict[str, int] = {}
    for cell in (arch.encoder, arch.decoder):
        for block in cell.blocks if cell is not None else ():
            for b in block.branches:
                if not b.dead and b.layer != "identity":
                    kind = next(k for prefix, k in _KINDS if b.layer.startswith(prefix))
                    kinds[kind] = kinds.get(kind, 0) + 1
    counts = " ".join(f"{n}{kind}" for kind, n in sorted(kinds.items(), key=lambda x: -x[1]))
    return f"d{arch.d_model} e{arch.encoder_cells} d{arch.decoder_cells} {counts}".strip()


_KINDS = (
    ("attention", "attn"),
    ("encoder_attention", "xattn"),
    ("mdha", "mdha"),
    ("encoder_mdha", "xmdha"),
    ("conv_1x1", "ffn"),
    ("conv_3x1", "conv"),
    ("sep_conv", "sepconv"),
    ("light_conv", "lconv"),
    ("glu", "glu"),
    ("", "other"),
)


def summary(arch: Architecture) -> str:
    """One line: d_model, cells per side and every block as `left op right`.

    A branch reads `ln.` (layer norm) + layer + heads/reduction + `>width` + `.activation`
    + `@input`; op is + (add), * (multiply) or & (concat then project).
    """
    parts = [f"d={arch.d_model}"]
    if arch.encoder is not None:
        parts.append(f"enc {arch.encoder_cells}x{_cell_text(arch.encoder)}")
    parts.append(f"dec {arch.decoder_cells}x{_cell_text(arch.decoder)}")
    return " ".join(parts)
