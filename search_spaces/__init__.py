"""Architectures as data and the torch modules they build, and the search spaces over them.

    from search_spaces import get_space
    from search_spaces.compile import compile
    from search_spaces.architecture import summary
    from search_spaces.suggest import RandomSuggest

    space = get_space("evolved_transformer").configure(d_model=(128,))  # or "transformer"
    arch = space.sample(RandomSuggest(0))           # or an optuna.Trial: define-by-run
    print(summary(arch))
    specs = compile(arch, vocab_size, max_len=64, dropout=0.1)  # list[pipeline.LayerSpec]

The spaces by name (`SPACES`, `space_names`, `get_space`), each a `SearchSpace`
(`search_spaces.space`: the interface the harness drives, and its lifecycle):
`evolved_transformer` (the paper's cells, with Primer's optional primitives) and
`transformer` (the plain Transformer's hyper-parameters). Both build the same
`Architecture`.

Modules: `suggest` (the Suggest protocol and two stand-ins for a trial), `layers` (one torch
module per layer type), `architecture` (the frozen dataclasses, JSON, summary), `cells`
(a cell as a module), `compile` (LayerSpecs and the carry convention), `space` (the
interface), `evolved_transformer` (the ET space's sampling, validity, Primer's optional
primitives as choices) and `evolved_transformer_space` (it as a `SearchSpace`),
`transformer_space`, `seeds` (the Transformer and Evolved Transformer seeds), `edited`
(the tensors an edit touches), `primer` (Primer's primitives applied to an architecture, to
measure them). Only the registry is exported here: `compile` and `evolved_transformer` are
both module and function names, and a re-export would shadow the module. Imports only the
standard library, torch, numpy and `pipeline`.
"""

from __future__ import annotations

from pipeline.pure.registry import Registry
from search_spaces.evolved_transformer_space import EvolvedTransformerSpace
from search_spaces.space import SearchSpace
from search_spaces.transformer_space import TransformerSpace

__all__ = ["SPACES", "SearchSpace", "get_space", "space_names"]

# Every space by name; a user's `SearchSpace` subclass is found by import path as well.
SPACES: Registry[type[SearchSpace]] = Registry(
    "search space",
    {space.name: space for space in (EvolvedTransformerSpace, TransformerSpace)},
    base=SearchSpace,
)


def space_names() -> tuple[str, ...]:
    """The registered spaces' names, the default (`evolved_transformer`) first."""
    return tuple(SPACES)


def get_space(name: str) -> type[SearchSpace]:
    """The space registered as `name`, or a `SearchSpace` subclass by import path, to
    configure with its options; `UnknownName` (a ValueError) naming the valid ones otherwise."""
    return SPACES.find(name)
