"""Helpers shared by the search-space tests: build compiled specs and run them in order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from pipeline.local.spec import LayerSpec, build_layer
from search_spaces.architecture import Architecture, InvalidArchitecture
from search_spaces.evolved_transformer import sample
from search_spaces.suggest import RandomSuggest

D = 32  # small enough for CPU tests, the smallest d_model the space allows
VOCAB, MAX_LEN, PAD = 13, 16, 0


def build(specs: Sequence[LayerSpec], seed: int = 0) -> list[nn.Module]:
    return [build_layer(spec, seed, torch.device("cpu")) for spec in specs]


def run(modules: Sequence[nn.Module], x: Any) -> torch.Tensor:
    """What the runtime does in one process: each layer takes the previous carry."""
    carry = x
    for module in modules:
        carry = module(carry)
    assert isinstance(carry, torch.Tensor)
    return carry


def valid_architectures(
    n: int, *, decoder_only: bool = False, start: int = 0
) -> Iterator[Architecture]:
    """The first n valid random architectures at d_model D with 1-2 cells per side."""
    found, seed = 0, start
    while found < n:
        try:
            yield sample(
                RandomSuggest(seed), d_model=D, decoder_only=decoder_only, cells=(1, 2), window=None
            )
            found += 1
        except InvalidArchitecture:
            pass
        seed += 1


def tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    """Random non-pad token ids (1..VOCAB-1)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, VOCAB, (batch, length), generator=g)
