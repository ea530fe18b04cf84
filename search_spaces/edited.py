"""Which tensors of a compiled architecture one edited answer touches.

A child one edit away from a trained parent (`nas.search.edits`) can start from the parent's
weights tensor by tensor where names and shapes match (`pipeline.WeightSnapshot`), except
where the edit is: an edited branch starts afresh, as it would in a model trained from
scratch, while the rest carries what the parent learned. This module names those tensors as
qualified prefixes, `<layer key>.<tensor name prefix>`, in `compile`'s layer keys and the
cell modules' attribute names (`cells.py`):

    enc.block3.left.<anything>     enc<i>.cell.blocks.3.left.          every encoder cell i
    dec.block5.right.<anything>    dec<i>.cell.blocks.5.right.         every decoder cell i
    <side>.block2.combiner         <side><i>.cell.blocks.2.project     the concat projection
    dec.cross_block (old -> new)   the left branches of both blocks, every decoder cell
    dec.cross_layer                the cross block's left branch, every decoder cell
    d_model, <side>.cells          nothing: every shape changes, or whole cells come or go
                                   (new keys start afresh anyway)

`snapshot.without(edited_tensors(...))` is then the parent's weights the child inherits.
`branch_prefixes` names the branches of a compiled architecture that a test picks, for a
space whose edits reach every branch of one kind (`search_spaces.transformer_space`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

from search_spaces.architecture import CROSS_LAYERS, Architecture, Branch
from search_spaces.suggest import CategoricalChoice

__all__ = ["branch_prefixes", "cell_keys", "edited_tensors"]

_BRANCH = re.compile(r"^(enc|dec)\.block(\d+)\.(left|right)\.[a-z_]+$")
_COMBINER = re.compile(r"^(enc|dec)\.block(\d+)\.combiner$")
_WHOLE = re.compile(r"^(d_model|(enc|dec)\.cells)$")


def edited_tensors(
    name: str, old: CategoricalChoice, new: CategoricalChoice, child: Architecture
) -> list[str]:
    """The qualified tensor prefixes of `child` (compiled) that the edit of parameter `name`
    from `old` to `new` touches (module doc); ValueError for a name the space never asks."""
    if match := _BRANCH.match(name):
        side, block, branch = match.groups()
        return [f"{key}.cell.blocks.{block}.{branch}." for key in cell_keys(child, side)]
    if match := _COMBINER.match(name):
        side, block = match.groups()
        return [f"{key}.cell.blocks.{block}.project" for key in cell_keys(child, side)]
    if name == "dec.cross_block":
        if not isinstance(old, int) or not isinstance(new, int):
            raise ValueError(f"dec.cross_block edits block indices, got {old!r} -> {new!r}")
        blocks = sorted({old, new})
        return [f"{key}.cell.blocks.{b}.left." for key in cell_keys(child, "dec") for b in blocks]
    if name == "dec.cross_layer":
        block = _cross_block(child)
        return [f"{key}.cell.blocks.{block}.left." for key in cell_keys(child, "dec")]
    if _WHOLE.match(name):
        return []
    raise ValueError(
        f"parameter {name!r} is not one the Evolved Transformer space asks (d_model, "
        "<side>.cells, dec.cross_block, dec.cross_layer, <side>.block<b>.combiner, "
        "<side>.block<b>.<left|right>.<choice>)"
    )


def cell_keys(arch: Architecture, side: str) -> list[str]:
    """`compile`'s layer keys of the cells of one side."""
    count = arch.encoder_cells if side == "enc" else arch.decoder_cells
    return [f"{side}{i}" for i in range(count)]


def _cross_block(arch: Architecture) -> int:
    """The decoder block whose left branch attends to the encoder."""
    for index, block in enumerate(arch.decoder.blocks):
        if block.left.layer in CROSS_LAYERS:
            return index
    raise ValueError("the architecture's decoder has no block attending to the encoder")


def branch_prefixes(arch: Architecture, picked: Callable[[Branch], bool]) -> list[str]:
    """The qualified tensor prefixes of every branch of `arch` (compiled) that `picked`
    picks, in every cell of its side."""
    sides = (("enc", arch.encoder), ("dec", arch.decoder))
    return [
        f"{key}.cell.blocks.{index}.{lr}."
        for side, cell in sides
        if cell is not None
        for index, block in enumerate(cell.blocks)
        for lr, branch in zip(("left", "right"), block.branches, strict=True)
        if picked(branch)
        for key in cell_keys(arch, side)
    ]
