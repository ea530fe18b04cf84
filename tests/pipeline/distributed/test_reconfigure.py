"""reconfigure(): the next model on the same processes trains like a fresh one."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

import pipeline
from pipeline import ElasticPipeline, LayerSpec, PlanOptions, StageContext
from pipeline.local.models import mlp_stack, transformer_stack
from pipeline.local.reference import ReferenceTrainer
from tests.pipeline.distributed.common import ADAM

pytestmark = pytest.mark.multiprocess
SEED = 9


def halving(optimizer: torch.optim.Optimizer) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: 0.5**step)


def seq(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randn(4, 5, 16, generator=g), torch.randn(4, 5, 16, generator=g)) for _ in range(n)
    ]


def flat(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(4)
    return [
        (torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(n)
    ]


def mlp() -> list[pipeline.LayerSpec]:
    return mlp_stack([6, 24, 24, 3], batch_norm=True)


def transformer_pipeline(partition: Any) -> ElasticPipeline:
    """Four Transformer layers on 2 micro-batches: the first candidate of a search."""
    return ElasticPipeline(
        transformer_stack(4, 16, 2),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=2,
        seed=SEED,
        planning=PlanOptions(partition=partition),
    )


def candidates(ctx: StageContext) -> dict[str, Any]:
    pipe = transformer_pipeline([2, 2])
    for x, y in seq(3):
        pipe.train_step(x, y)
    trained = pipe.full_state_dict()
    # six Transformer layers on [3, 3]: block0-3 inherit (block2 comes from the other stage)
    pipe.reconfigure(transformer_stack(6, 16, 2), partition=[3, 3], inherit_weights=True)
    inherited = pipe.full_state_dict()
    pipe.train_step(*seq(1)[0])
    six, snapshot = pipe.full_state_dict(), pipe.snapshot()
    # a different architecture, loss and data on the same processes
    pipe.reconfigure(mlp(), partition=[1, 2], loss_fn=F.cross_entropy)
    losses = [pipe.train_step(x, y) for x, y in flat(4)]
    out = {
        "trained": trained,
        "inherited": inherited,
        "losses": losses,
        "six": six,
        "state": pipe.full_state_dict(),
        "generation": pipe.generation,
        "step": pipe.step,
    }
    # the same model with another seed (its initial weights and dropout): as a fresh one
    pipe.reconfigure(mlp(), partition=[2, 1], seed=SEED + 1)
    out["reseeded"] = [pipe.train_step(x, y) for x, y in flat(4)]
    out["reseeded_state"] = pipe.full_state_dict()
    # four layers of the six-layer model, from its snapshot, on another partition
    pipe.reconfigure(
        transformer_stack(4, 16, 2),
        partition=[1, 3],
        inherit_from=snapshot,
        loss_fn=F.mse_loss,
        seed=SEED,
    )
    out["from_snapshot"] = pipe.full_state_dict()
    # the same, block1's first linear layer edited (left fresh), on yet another partition
    pipe.reconfigure(
        transformer_stack(4, 16, 2),
        partition=[3, 1],
        inherit_from=snapshot.without(["block1.linear1."]),
    )
    out["edited"] = pipe.full_state_dict()
    out["took"] = [e.details for e in pipe.events if e.kind == "inherit"]
    # a model with its own lr schedule (the pipeline was built with none): from its step 0
    pipe.reconfigure(transformer_stack(4, 16, 2), partition=[2, 2], lr_scheduler=halving)
    for x, y in seq(2):
        pipe.train_step(x, y)
    assert pipe.optimizer is not None
    out["rates"] = [group["lr"] for group in pipe.optimizer.param_groups]
    pipe.close()
    return out


@functools.cache
def results() -> dict[str, Any]:
    return pipeline.launch(candidates, 2, threads_per_stage=1, timeout_s=60)[0]


def test_reconfigured_model_matches_a_fresh_reference() -> None:
    torch.set_num_threads(1)
    ref = ReferenceTrainer(
        mlp(), optimizer=ADAM, loss_fn=F.cross_entropy, n_microbatches=2, seed=SEED
    )
    ref_losses = [ref.train_step(x, y) for x, y in flat(4)]
    r = results()
    assert r["losses"] == pytest.approx(ref_losses, abs=1e-6)
    ref_state = ref.full_state_dict()
    for key, state in r["state"].items():
        for name, value in state.items():
            assert torch.allclose(value.double(), ref_state[key][name].double(), atol=1e-6)
    assert (r["generation"], r["step"]) == (2, 4)


def test_a_reconfigured_model_with_another_seed_trains_as_a_fresh_one_with_it() -> None:
    torch.set_num_threads(1)
    ref = ReferenceTrainer(
        mlp(), optimizer=ADAM, loss_fn=F.cross_entropy, n_microbatches=2, seed=SEED + 1
    )
    ref_losses = [ref.train_step(x, y) for x, y in flat(4)]
    r = results()
    assert r["reseeded"] == pytest.approx(ref_losses, abs=1e-6)
    assert r["reseeded"] != pytest.approx(r["losses"], abs=1e-6)  # the seed changed them
    ref_state = ref.full_state_dict()
    for key, state in r["reseeded_state"].items():
        for name, value in state.items():
            assert torch.allclose(value.double(), ref_state[key][name].double(), atol=1e-6)


def test_inherit_weights_where_keys_and_shapes_match() -> None:
    r = results()
    fresh = ReferenceTrainer(
        transformer_stack(6, 16, 2), optimizer=ADAM, loss_fn=F.mse_loss, n_microbatches=2, seed=SEED
    ).full_state_dict()
    for key, state in r["inherited"].items():
        source = r["trained"] if key in r["trained"] else fresh
        for name, value in state.items():
            assert torch.equal(value, source[key][name]), (key, name)
    assert not torch.equal(  # inherited weights are the trained ones, not a fresh init
        r["inherited"]["block2"]["linear1.weight"], fresh["block2"]["linear1.weight"]
    )


class MixedOutputs(nn.Module):
    """A last layer whose outputs are of three dtypes: every one must reach every rank."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.linear(x)  # 5 bools a row: the int64s after them start off their alignment
        return y.half(), y[:, :5, 0] > 0, y.argmax(-1)


def mixed_stack() -> list[LayerSpec]:
    return [*transformer_stack(4, 16, 2, dropout=0.5), LayerSpec("mixed", MixedOutputs)]


def inference(ctx: StageContext) -> dict[str, Any]:
    pipe = ElasticPipeline(
        transformer_stack(4, 16, 2, dropout=0.5),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=4,
        seed=SEED,
    )
    x, y = seq(1)[0]
    before = pipe.forward(x[:3])  # batch 3: split into 3 micro-batches; plans the pipeline
    pipe.train_step(x, y)
    out = {"before": before, "after": pipe.forward(x[:3]), "again": pipe.forward(x[:3])}
    out["replica"] = pipe.replica()(x[:3])  # the whole trained model on this rank
    pipe.reconfigure(mixed_stack(), partition=[2, 3])
    out["mixed"] = pipe.forward(x)
    pipe.close()
    return out


def test_forward_and_replicas_are_inference_on_every_rank() -> None:
    results = pipeline.launch(inference, 2, threads_per_stage=1, timeout_s=60)
    assert torch.equal(results[0]["after"], results[1]["after"])  # every rank gets it
    torch.set_num_threads(1)
    ref = ReferenceTrainer(
        transformer_stack(4, 16, 2, dropout=0.5),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        n_microbatches=4,
        seed=SEED,
    )
    x = seq(1)[0][0]
    for layer in ref.layers:
        layer.eval()
    with torch.no_grad():
        expected = x[:3]
        for layer in ref.layers:
            expected = layer(expected)
    assert torch.allclose(results[0]["before"], expected, atol=1e-5)
    assert torch.equal(results[0]["after"], results[0]["again"])  # eval mode: no dropout
    for rank in (0, 1):  # each rank's replica computes what the pipeline does
        assert torch.allclose(results[rank]["replica"], results[0]["after"], atol=1e-6)
    assert not torch.allclose(results[0]["after"], results[0]["before"])  # it trained
    # outputs of any dtype, the micro-batches concatenated, the same on every rank
    mixed = ReferenceTrainer(
        mixed_stack(), optimizer=ADAM, loss_fn=F.mse_loss, n_microbatches=4, seed=SEED
    )
    with torch.no_grad():
        expected = seq(1)[0][0]
        for layer in mixed.layers:
            expected = layer.eval()(expected)
    for got, other, want in zip(results[0]["mixed"], results[1]["mixed"], expected, strict=True):
        assert got.dtype == other.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, other)
    half, positive, argmax = results[0]["mixed"]
    assert torch.allclose(half.float(), expected[0].float(), atol=1e-3)
    assert torch.equal(positive, expected[1]) and torch.equal(argmax, expected[2])


def planned_candidates(ctx: StageContext) -> dict[str, Any]:
    """Two "auto" candidates in a row: the second is planned from the cost cache alone."""
    pipe = transformer_pipeline("auto")
    pipe.train_step(*seq(1)[0])
    (signature,) = pipe.cost_cache.entries()  # one distinct layer, timed once
    entry = pipe.cost_cache.get(signature)
    assert entry is not None
    pipe.cost_cache.put(signature, 123.0, 246.0, entry["activation_bytes"])  # a marker
    old_modules = list(pipe.layers.values())
    pipe.reconfigure(mlp(), partition=[1, 2], loss_fn=F.cross_entropy)
    pipe.train_step(*flat(1)[0])
    pipe.reconfigure(transformer_stack(6, 16, 2), partition="auto", loss_fn=F.mse_loss)
    pipe.train_step(*seq(1)[0])
    assert pipe.optimizer is not None
    optimized = {id(p) for group in pipe.optimizer.param_groups for p in group["params"]}
    live = list(pipe.layers.values())
    assert pipe.plan is not None
    out = {
        "predicted_stage_s": pipe.plan.predicted_stage_s,
        "cache_size": len(pipe.cost_cache),
        "keys": list(pipe.layer_keys),
        "optimizes_only_live_layers": optimized == {id(p) for m in live for p in m.parameters()},
        "old_modules_alive": any(m is n for m in old_modules for n in live),
    }
    pipe.close()
    return out


def test_auto_reconfigure_plans_from_the_cache_and_frees_the_old_layers() -> None:
    results = pipeline.launch(planned_candidates, 2, threads_per_stage=1, timeout_s=60)
    for rank, r in enumerate(results):
        assert r["cache_size"] == 1  # no new timing: the signature was cached
        assert min(r["predicted_stage_s"]) >= 3 * (123.0 + 246.0)  # planned from the marker
        assert r["optimizes_only_live_layers"] and not r["old_modules_alive"], r
        assert r["keys"] == [f"block{i}" for i in range(3 * rank, 3 * rank + 3)], r["keys"]


def test_a_snapshot_of_an_earlier_model_starts_a_later_one() -> None:
    r = results()
    assert list(r["from_snapshot"]) == [f"block{i}" for i in range(4)]
    for key, state in r["from_snapshot"].items():
        for name, value in state.items():
            assert torch.equal(value, r["six"][key][name])


def test_an_edited_part_starts_afresh_and_the_rest_carries_the_trained_values_exactly() -> None:
    r = results()
    fresh = ReferenceTrainer(
        transformer_stack(4, 16, 2), optimizer=ADAM, loss_fn=F.mse_loss, n_microbatches=2, seed=SEED
    ).full_state_dict()
    edited = 0
    for key, state in r["edited"].items():
        for name, value in state.items():
            is_edited = f"{key}.{name}".startswith("block1.linear1.")
            edited += is_edited
            source = fresh if is_edited else r["six"]  # the snapshot was of the trained six
            assert torch.equal(value, source[key][name]), (key, name)
    assert edited == 2  # its weight and bias
    assert r["took"][-1]["fresh_tensors"] == 2
    assert r["took"][-1]["tensors"] == sum(len(s) for s in r["edited"].values()) - 2


def test_the_inheritance_is_recorded_in_the_events() -> None:
    took, back, _ = results()["took"]  # block0-3 inherited; block2 moved from stage 1 to 0
    per_layer = sum(v.numel() * v.element_size() for v in results()["trained"]["block2"].values())
    assert (took["layers"], took["moved"]) == (4, 1)
    assert (took["bytes"], took["moved_bytes"]) == (4 * per_layer, per_layer)
    # [3, 3] -> [1, 3]: block1 and block2 move to stage 1
    assert (back["layers"], back["moved"], back["moved_bytes"]) == (4, 2, 2 * per_layer)


def test_a_new_model_takes_its_own_lr_schedule_from_its_first_step() -> None:
    rates = results()["rates"]
    assert len(rates) == 2  # rank 0's two layers, one group each
    assert rates == pytest.approx([1e-3 * 0.5**2] * 2)  # after two steps of halving
