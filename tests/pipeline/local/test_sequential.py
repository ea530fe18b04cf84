"""A user's `nn.Sequential` as specs: keys from its children's names, exactly its computation,
and torch pipelining's split points as stage sizes."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import ReferenceTrainer, partition_from_split_points, specs_from_sequential
from tests.pipeline.common import (
    USER_ADAM,
    USER_MICROBATCHES,
    as_module_state,
    train_module,
    user_batches,
    user_model,
)


def train_specs(module: nn.Sequential, seed: int = 0) -> tuple[list[float], dict[str, Any]]:
    ref = ReferenceTrainer(
        specs_from_sequential(module),
        optimizer=USER_ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=USER_MICROBATCHES,
        seed=seed,
    )
    losses = [ref.train_step(x, y) for x, y in user_batches()]
    return losses, ref.full_state_dict()


def test_keys_are_the_childrens_names() -> None:
    unnamed = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert [s.key for s in specs_from_sequential(unnamed)] == ["0", "1", "2"]
    model = user_model()
    keys = [s.key for s in specs_from_sequential(model)]
    assert keys == ["proj", "blocks.0", "blocks.1", "act", "norm", "head"]
    for spec in specs_from_sequential(model):  # each key is the child's path in the module
        built = spec.factory()
        assert type(built) is type(model.get_submodule(spec.key))
    top = [s.key for s in specs_from_sequential(model, flatten=False)]
    assert top == ["proj", "blocks", "act", "norm", "head"]


class Residual(nn.Sequential):
    """A Sequential subclass with its own forward: kept whole, never flattened."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + super().forward(x)


def test_a_nested_sequential_with_its_own_forward_stays_one_layer() -> None:
    model = nn.Sequential(nn.Linear(4, 4), Residual(nn.Linear(4, 4), nn.Tanh()))
    specs = specs_from_sequential(model)
    assert [s.key for s in specs] == ["0", "1"]
    x = torch.randn(3, 4)
    out = x
    for spec in specs:
        out = spec.factory()(out)
    assert torch.equal(out, model(x))


def test_reference_trainer_on_the_specs_is_training_the_module_itself() -> None:
    torch.set_num_threads(1)
    losses, state = train_specs(user_model())
    module = user_model()
    assert losses == train_module(module, USER_MICROBATCHES)  # bit-identical, step by step
    mine = module.state_dict()
    theirs = as_module_state(state)
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[name], theirs[name]) for name in mine)
    assert losses[-1] < losses[0]  # it trained
    full_batch = train_module(user_model(), 1)  # one mean over the batch: equal up to rounding
    assert losses == pytest.approx(full_batch, abs=1e-6)


def test_initial_weights_are_the_modules_whatever_the_seed() -> None:
    assert train_specs(user_model(), seed=0)[0] == train_specs(user_model(), seed=9)[0]


def test_the_full_state_loads_back_into_the_users_module() -> None:
    _, state = train_specs(user_model())
    module = user_model()
    module.load_state_dict(as_module_state(state))  # strict: every name matches
    assert torch.equal(module.get_parameter("head.weight"), state["head"]["weight"])


def test_specs_are_a_snapshot_that_pickles() -> None:
    model = user_model()
    specs = specs_from_sequential(model)
    before = model.get_parameter("proj.weight").detach().clone()
    with torch.no_grad():
        model.get_parameter("proj.weight").add_(
            1.0
        )  # the user's later changes do not reach the specs
    travelled = pickle.loads(pickle.dumps(specs))  # what spawn does to a stage's arguments
    for source in (specs, travelled):
        first = source[0].factory()
        assert torch.equal(first.get_parameter("weight"), before)
        assert first is not source[0].factory()  # a fresh copy per build


@pytest.mark.parametrize(
    "module,error,match",
    [
        (nn.Linear(2, 2), TypeError, r"takes an nn.Sequential .*got a Linear"),
        ([nn.Linear(2, 2)], TypeError, r"got a list"),
        (Residual(nn.Linear(2, 2)), TypeError, r"Residual overrides nn.Sequential.forward"),
        (nn.Sequential(), ValueError, r"the Sequential has no layers; valid: an nn.Sequential"),
        (nn.Sequential(nn.Sequential()), ValueError, r"has no layers"),
    ],
)
def test_a_module_that_is_no_sequential_is_refused(
    module: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        specs_from_sequential(module)


def test_tied_weights_and_duplicate_keys_are_refused() -> None:
    shared = nn.Linear(3, 3)
    with pytest.raises(ValueError, match=r"layers '0' and '2' share a parameter"):
        specs_from_sequential(nn.Sequential(shared, nn.ReLU(), shared))
    relu = nn.ReLU()  # a module without weights may repeat; it runs, so it counts, twice
    repeated = specs_from_sequential(nn.Sequential(shared, relu, relu))
    assert [s.key for s in repeated] == ["0", "1", "2"]
    twice = specs_from_sequential(nn.Sequential(nn.Linear(2, 2))) * 2
    with pytest.raises(ValueError, match=r"duplicate layer key '0'"):
        partition_from_split_points(twice, ["0"])
    with pytest.raises(ValueError, match=r"duplicate layer key '0'"):
        ReferenceTrainer(twice, optimizer=USER_ADAM, loss_fn=F.mse_loss, n_microbatches=1)


def test_a_none_child_is_named_by_its_place() -> None:
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    model.add_module("gap", None)  # add_module accepts None; nn.Sequential cannot run it
    with pytest.raises(ValueError, match=r"child 2 of the model is None; valid: a module"):
        specs_from_sequential(model)


def test_split_points_become_stage_sizes() -> None:
    specs = specs_from_sequential(user_model())  # proj, blocks.0, blocks.1, act, norm, head
    assert partition_from_split_points(specs, ["blocks.1"]) == [2, 4]
    assert partition_from_split_points(specs, {"blocks": "END", "norm": "beginning"}) == [3, 1, 2]
    assert partition_from_split_points(specs, {"blocks": "beginning"}) == [1, 5]
    pipelining = pytest.importorskip("torch.distributed.pipelining")
    split_spec = {"blocks.1": pipelining.SplitPoint.BEGINNING, "act": pipelining.SplitPoint.END}
    assert partition_from_split_points(specs, split_spec) == [2, 2, 2]
    assert pipeline.PlanOptions(partition=[2, 2, 2]).partition == (2, 2, 2)


@pytest.mark.parametrize(
    "split_points,match",
    [
        ({"proj": "beginning"}, r"'proj' \(beginning\) cuts at the start of the model"),
        ({"head": "end"}, r"cuts at the end of the model"),
        ({"blocks.0.linear1": "end"}, r"inside layer 'blocks.0', and the runtime cuts between"),
        ({"encoder": "end"}, r"'encoder' names no layer; valid: the layer keys \['proj'"),
        ({"act": "middle"}, r"position 'middle' is not valid; valid: SplitPoint.BEGINNING"),
        ({"blocks": "end", "act": "beginning"}, r"'blocks' and 'act' both cut between"),
    ],
)
def test_bad_split_points_are_refused(split_points: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        partition_from_split_points(specs_from_sequential(user_model()), split_points)
