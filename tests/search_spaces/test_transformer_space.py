"""`search_spaces.transformer_space`: the plain Transformer's hyper-parameters as a space."""

from __future__ import annotations

import pytest
import torch

from search_spaces import get_space
from search_spaces.architecture import Architecture, InvalidArchitecture
from search_spaces.compile import compile
from search_spaces.evolved_transformer import evolved_transformer
from search_spaces.seeds import transformer
from search_spaces.transformer_space import TransformerSpace
from tests.search_spaces.common import D

SPACE = TransformerSpace(d_model=(D,))
PARENT = transformer(D, 4, 2, 2)
PARAMS = SPACE.seed_params(PARENT)


def shapes(arch: Architecture) -> dict[str, torch.Size]:
    return {
        f"{spec.key}.{name}": tensor.shape
        for spec in compile(arch, 50, max_len=20, dropout=0.0)
        for name, tensor in spec.factory().state_dict().items()
    }


def test_the_space_is_registered_and_its_answers_are_the_transformers_hyper_parameters() -> None:
    assert get_space("transformer") is TransformerSpace
    assert PARAMS == {
        "d_model": D,
        "enc.layers": 2,
        "dec.layers": 2,
        "ff": 4.0,
        "heads": 4,
        "activation": "relu",
    }
    wide = SPACE.replay({**PARAMS, "enc.layers": 6, "ff": 2.0, "activation": "squared_relu"})
    assert wide == transformer(D, 4, 6, 2, ff=2.0, activation="squared_relu")


@pytest.mark.parametrize(
    ("arch", "message"),
    [
        (evolved_transformer(D, 4, 1, 1), "not a Transformer of this space"),
        (transformer(D, 4, 2, 2, activation="leaky_relu"), "'activation'"),
        (transformer(D, 4, 8, 2), "'enc.layers'"),
        (transformer(D, 4, 0, 2), "a decoder-only architecture is not in a space of"),
    ],
    ids=["evolved_transformer", "activation", "layers", "decoder_only"],
)
def test_an_architecture_outside_the_space_is_refused_saying_why(
    arch: Architecture, message: str
) -> None:
    with pytest.raises(InvalidArchitecture, match=message):
        SPACE.validate(arch)


@pytest.mark.parametrize(("name", "new"), [("ff", 1.0), ("heads", 8), ("activation", "swish")])
def test_an_edit_names_every_tensor_whose_shape_it_changes(
    name: str, new: float | int | str
) -> None:
    child = SPACE.replay({**PARAMS, name: new})
    edited = tuple(SPACE.edited_tensors(name, PARAMS[name], new, child))
    before, after = shapes(PARENT), shapes(child)
    changed = [t for t, shape in after.items() if before.get(t) != shape]
    assert all(t.startswith(edited) for t in changed)
    touched = [t for t in after if t.startswith(edited)]
    assert touched and len(touched) < len(after)  # the edited layers only
    assert SPACE.edited_tensors("dec.layers", 2, 4, child) == []  # new layers start afresh
