"""`search_spaces.edited`: the tensors one edited answer touches, read off compiled modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
import torch

from search_spaces.architecture import Architecture
from search_spaces.compile import compile
from search_spaces.edited import edited_tensors
from search_spaces.evolved_transformer import PRIMITIVES, evolved_transformer, sample, seed_params
from search_spaces.suggest import CategoricalChoice, RandomSuggest

ET = evolved_transformer(32, n_heads=4, n_enc=1, n_dec=1)
PARAMS = seed_params(ET, primitives=PRIMITIVES)


class Answers(RandomSuggest):
    """`params` first, at random (seeded) what they lack."""

    def __init__(self, params: Mapping[str, CategoricalChoice]) -> None:
        super().__init__(0)
        self.params = dict(params)


def child(name: str, value: CategoricalChoice) -> Architecture:
    return sample(
        Answers({**PARAMS, name: value}),
        d_model=32,
        cells=(1, 1),
        window=None,
        primitives=PRIMITIVES,
    )


def shapes(arch: Architecture) -> dict[str, torch.Size]:
    """Every tensor of the compiled model by qualified name, `<layer key>.<tensor name>`."""
    torch.manual_seed(0)
    return {
        f"{spec.key}.{name}": tensor.shape
        for spec in compile(arch, 50, max_len=20, dropout=0.0)
        for name, tensor in spec.factory().state_dict().items()
    }


def outside(names: Sequence[str], prefixes: Sequence[str]) -> set[str]:
    return {n for n in names if not n.startswith(tuple(prefixes))}


@pytest.mark.parametrize(
    ("name", "new"),
    [
        ("dec.block2.right.activation", "relu"),  # keeps every shape
        ("dec.block2.right.layer", "light_conv_3x1"),  # changes the branch's tensors
        ("enc.block1.left.norm", "none"),  # removes the branch's norm
    ],
)
def test_outside_the_edited_branch_every_tensor_has_its_parents_name_and_shape(
    name: str, new: CategoricalChoice
) -> None:
    kid = child(name, new)
    prefixes = edited_tensors(name, PARAMS[name], new, kid)
    side, block, branch = name.split(".")[:3]
    assert prefixes == [f"{side}0.cell.blocks.{block.removeprefix('block')}.{branch}."]
    parent, mine = shapes(ET), shapes(kid)
    assert any(n.startswith(prefixes[0]) for n in mine)  # the branch is live: it has tensors
    rest = outside(list(mine), prefixes)
    assert rest == outside(list(parent), prefixes)  # the same names outside the edit...
    assert all(mine[n] == parent[n] for n in rest)  # ...with the same shapes: all inherited


def test_a_width_edit_names_its_branch_and_what_it_ripples_into_has_new_names_or_shapes() -> None:
    kid = child("enc.block0.left.dim", 2.0)
    prefixes = edited_tensors("enc.block0.left.dim", PARAMS["enc.block0.left.dim"], 2.0, kid)
    assert prefixes == ["enc0.cell.blocks.0.left."]
    parent, mine = shapes(ET), shapes(kid)
    changed = {n for n in outside(list(mine), prefixes) if parent.get(n) != mine[n]}
    assert changed and all(n.startswith("enc0.") for n in changed)  # a new width downstream:
    # new tensors (a cell projection) or new shapes start afresh by themselves


def test_cross_block_edits_touch_both_blocks_and_whole_model_edits_touch_none() -> None:
    cross = PARAMS["dec.cross_block"]
    assert isinstance(cross, int)
    other = 0 if cross != 0 else 1
    kid = child("dec.cross_block", other)
    assert edited_tensors("dec.cross_block", cross, other, kid) == [
        f"dec0.cell.blocks.{b}.left." for b in sorted({cross, other})
    ]
    assert edited_tensors("dec.cross_layer", "attention", "mdha", kid) == [
        f"dec0.cell.blocks.{other}.left."
    ]
    assert edited_tensors("d_model", 32, 64, ET) == []
    assert edited_tensors("enc.cells", 1, 2, ET) == []
    with pytest.raises(ValueError, match="'enc.block1.middle.layer' is not one"):
        edited_tensors("enc.block1.middle.layer", "a", "b", ET)
