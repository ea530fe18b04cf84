"""Pure helpers of the runtime: partitions, layer specs and seeds, carry headers."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from pipeline.distributed.links import TensorMeta, _decode, _encode
from pipeline.local.carry import as_carry
from pipeline.local.determinism import dropout_seed, layer_seed
from pipeline.local.spec import LayerSpec, build_layer, check_specs
from pipeline.pure.partition import bounds, check_sizes, equal_sizes

CPU = torch.device("cpu")


def test_equal_sizes() -> None:
    assert equal_sizes(8, 2) == [4, 4]
    assert equal_sizes(10, 4) == [3, 3, 2, 2]
    assert bounds([3, 3, 2, 2]) == [(0, 3), (3, 6), (6, 8), (8, 10)]
    with pytest.raises(ValueError, match="3 layers over 4 stages"):
        equal_sizes(3, 4)


@pytest.mark.parametrize(
    "sizes,match",
    [([4], "1 stages"), ([2, 3], "holds 5 layers"), ([0, 4], "positive"), ([2.0, 2], "positive")],
)
def test_check_sizes_rejects(sizes: list[int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_sizes(sizes, 4, 2)


def test_weights_depend_on_seed_and_key_only() -> None:
    spec = LayerSpec("a", functools.partial(nn.Linear, 4, 4))

    def weight(spec: LayerSpec, seed: int) -> torch.Tensor:
        return build_layer(spec, seed, CPU).get_parameter("weight")

    w1 = weight(spec, 0)
    torch.manual_seed(123)  # the global RNG does not matter
    assert torch.equal(w1, weight(spec, 0))
    assert not torch.equal(w1, weight(LayerSpec("b", spec.factory), 0))
    assert not torch.equal(w1, weight(spec, 1))


def test_build_layer_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    build_layer(LayerSpec("a", functools.partial(nn.Linear, 4, 4)), 0, CPU)
    assert torch.equal(torch.rand(3), expected)


def test_seeds_are_distinct_and_stable() -> None:
    seeds = {dropout_seed(0, step, mb, key) for step in range(4) for mb in range(4) for key in "ab"}
    assert len(seeds) == 32
    assert layer_seed(0, "x") == layer_seed(0, "x") != layer_seed(0, "y")


def test_a_factory_error_names_the_layer() -> None:
    with pytest.raises(RuntimeError, match="negative dimension") as info:
        build_layer(LayerSpec("proj", functools.partial(nn.Linear, -1, 3)), 0, CPU)
    assert any("layer 'proj'" in note for note in info.value.__notes__)


def test_factory_that_builds_no_module() -> None:
    with pytest.raises(TypeError, match="'bad'.*returned a int"):
        build_layer(LayerSpec("bad", int), 0, CPU)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "specs,error,match",
    [
        ([], ValueError, "empty"),
        ([nn.Linear(2, 2)], TypeError, "expected a LayerSpec"),
        ([LayerSpec("a", nn.ReLU), LayerSpec("a", nn.ReLU)], ValueError, "duplicate layer key"),
    ],
)
def test_check_specs(specs: list, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        check_specs(specs)


def test_layer_spec_validates() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        LayerSpec("", nn.ReLU)
    with pytest.raises(TypeError, match="nn.Module instance"):
        LayerSpec("a", nn.ReLU())  # a module, not a factory


def test_header_round_trip() -> None:
    metas = (
        TensorMeta((4, 16, 32), torch.float32, True),
        TensorMeta((4, 16), torch.int64, False),
        TensorMeta((), torch.bfloat16, False),
    )
    assert _decode(_encode(metas)) == metas


def test_as_carry() -> None:
    t = torch.zeros(2)
    assert as_carry(t, "x") == (t,)
    assert as_carry([t, t], "x") == (t, t)
    with pytest.raises(TypeError, match="layer 'k'.*str"):
        as_carry((t, "no"), "layer 'k'")
    with pytest.raises(TypeError, match="callable"):
        LayerSpec("a", 3)  # type: ignore[arg-type]
