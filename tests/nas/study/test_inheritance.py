"""`nas.study.inheritance`'s pure parts: the weights file every stage process reads and
the bank of trained weights a stage process keeps (no processes)."""

from __future__ import annotations

from pathlib import Path

import torch

from nas.study.inheritance import (
    INHERITED_FROM,
    WeightBank,
    inherited_attrs,
    load_snapshot,
    save_weights,
)
from pipeline import WeightSnapshot


def state() -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed": {"weight": torch.randn(5, 3, generator=g)},
        "enc.block0.left": {
            "linear.weight": torch.randn(3, 3, generator=g),
            "linear.bias": torch.zeros(3),
        },
        "head": {"weight": torch.randn(5, 3, generator=g)[:, :2]},  # a non-contiguous view
    }


def test_weights_round_trip_as_stage_zero_of_any_pipeline(tmp_path: Path) -> None:
    path = save_weights(state(), tmp_path / "w.safetensors")
    first = load_snapshot(path, rank=0, world_size=3)
    assert first.keys == ("embed", "enc.block0.left", "head")  # the model's layer order
    assert first.sizes == (3, 0, 0)  # stage 0 sends each layer to its owner
    for key, layer in state().items():
        for name, tensor in layer.items():
            assert torch.equal(first.states[key][name], tensor), (key, name)
    other = load_snapshot(path, rank=2, world_size=3)
    assert (other.keys, other.sizes, dict(other.states)) == (first.keys, first.sizes, {})
    kept = first.without(["enc.block0.left.linear."])  # an edited branch: afresh
    assert kept.states["enc.block0.left"] == {} and "weight" in kept.states["embed"]


def _snapshot(value: float) -> WeightSnapshot:
    layers = {"embed": {"weight": torch.full((2, 2), value)}, "enc.left": {"w": torch.ones(2)}}
    return WeightSnapshot(tuple(layers), (2,), layers)


def test_the_bank_keeps_the_last_trials_and_a_child_of_its_parent_takes_all_but_its_edit() -> None:
    bank = WeightBank(keep=2)
    for number in (3, 5, 8):
        bank.put(number, _snapshot(float(number)))
    assert bank.numbers == [5, 8]  # the oldest dropped
    assert bank.source(5) == 5 and bank.source(3) == 8  # a parent no longer kept: the last
    assert bank.source(None) == 8
    child = bank.inherited(5, parent=5, edited=("enc.left.",))
    assert child is not None and child.states["enc.left"] == {}  # its edit starts afresh
    assert torch.equal(child.states["embed"]["weight"], torch.full((2, 2), 5.0))
    other = bank.inherited(8, parent=5, edited=("enc.left.",))  # not its parent: all of it
    assert other is not None and "w" in other.states["enc.left"]
    assert inherited_attrs(8) == {INHERITED_FROM: 8}
    assert inherited_attrs(5, 1) == {INHERITED_FROM: 5, "inherited_fresh_tensors": 1}
