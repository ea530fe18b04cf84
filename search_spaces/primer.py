"""Primer's two primitives applied to an existing architecture, to measure what they add.

So et al. (2021) found that two cheap changes carry most of Primer's gain over the
Transformer: squared ReLU in place of the feed-forward activation, and multi-DConv-head
attention (MDHA, a width-3 depthwise convolution after each of Q, K and V). Before a search
is given these primitives, `benchmarks/space_room.py` trains the seeds with and without
them; `with_primitives` makes those variants, the same cells with only the named changes:

* "squared_relu": every branch's activation other than "none" becomes "squared_relu";
* "mdha": every "attention" becomes "mdha" and every "encoder_attention" "encoder_mdha".

Everything else (inputs, widths, heads, norms, combiners) is kept, so a variant's parameter
count differs from its source only by MDHA's 3 * 3 * width weights per attention layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from search_spaces.architecture import Architecture, Block, Branch, Cell
from search_spaces.evolved_transformer import PRIMITIVES, Primitive

__all__ = ["with_primitives"]

_MDHA = {"attention": "mdha", "encoder_attention": "encoder_mdha"}


def _branch(branch: Branch, primitives: Sequence[Primitive]) -> Branch:
    if "squared_relu" in primitives and branch.activation != "none":
        branch = replace(branch, activation="squared_relu")
    if "mdha" in primitives and branch.layer in _MDHA:
        branch = replace(branch, layer=_MDHA[branch.layer])
    return branch


def _cell(cell: Cell, primitives: Sequence[Primitive]) -> Cell:
    return Cell(
        tuple(
            Block(_branch(b.left, primitives), _branch(b.right, primitives), b.combiner)
            for b in cell.blocks
        )
    )


def with_primitives(arch: Architecture, primitives: Sequence[Primitive]) -> Architecture:
    """`arch` with Primer's `primitives` (of PRIMITIVES) in place (module docstring)."""
    unknown = [p for p in primitives if p not in PRIMITIVES]
    if unknown or isinstance(primitives, str):
        raise ValueError(f"primitives {primitives!r}: each must be one of {PRIMITIVES}")
    encoder = None if arch.encoder is None else _cell(arch.encoder, primitives)
    return replace(arch, encoder=encoder, decoder=_cell(arch.decoder, primitives))
