"""Pipelined training equals single-process training: real processes, gloo, 1 thread each.

Each launch runs several configurations in the same stage processes (one process group,
one start-up cost) and returns their losses and full state dicts; the assertions compare
them with `ReferenceTrainer`, which trains the same specs in this process.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import (
    Action,
    ElasticPipeline,
    LayerSpec,
    Op,
    PlanOptions,
    ScheduleSpec,
    StageContext,
)
from pipeline.local.models import mlp_stack, transformer_stack
from pipeline.local.reference import ReferenceTrainer

pytestmark = pytest.mark.multiprocess

STEPS, BATCH, MICROBATCHES = 5, 8, 4
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)


class AddTokenBias(nn.Module):
    """A carry of two tensors: (hidden (b, t, d) float, ids (b, t) int64) -> same."""

    def __init__(self, vocab: int, d: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.drop = nn.Dropout(0.1)

    def forward(self, carry: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        h, ids = carry
        return self.drop(torch.tanh(h + self.emb(ids))), ids


class TakeHidden(nn.Module):
    def forward(self, carry: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return carry[0]


def tuple_stack() -> list[LayerSpec]:
    specs = [LayerSpec(f"tok{i}", functools.partial(AddTokenBias, 11, 16)) for i in range(4)]
    return [*specs, LayerSpec("take", TakeHidden)]


MODELS: dict[str, Any] = {
    # name: (specs, batches, loss)
    "transformer": (lambda: transformer_stack(4, 16, 2, dropout=0.1), "seq", F.mse_loss),
    "mlp": (lambda: mlp_stack([12, 32, 32, 24, 16, 5], dropout=0.1), "flat", F.cross_entropy),
    "tuple": (tuple_stack, "tokens", F.mse_loss),
}


def batches(kind: str) -> list[tuple[Any, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    out: list[tuple[Any, torch.Tensor]] = []
    for _ in range(STEPS):
        hidden = torch.randn(BATCH, 6, 16, generator=g)
        if kind == "seq":
            out.append((hidden, torch.randn(BATCH, 6, 16, generator=g)))
        elif kind == "flat":
            flat = torch.randn(BATCH, 12, generator=g)
            out.append((flat, torch.randint(0, 5, (BATCH,), generator=g)))
        else:
            ids = torch.randint(0, 11, (BATCH, 6), generator=g)
            out.append(((hidden, ids), torch.randn(BATCH, 6, 16, generator=g)))
    return out


def _eager_1f1b(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """A user's schedule, from a spec outside the package: 1F1B with one more warm-up forward
    on every stage (more in flight; backwards still in micro-batch order, so exact)."""
    warmup = min(n_stages - stage, n_microbatches)
    actions = [Action(Op.FORWARD, i, stage) for i in range(warmup)]
    for i in range(n_microbatches):
        if warmup + i < n_microbatches:
            actions.append(Action(Op.FORWARD, warmup + i, stage))
        actions.append(Action(Op.BACKWARD, i, stage))
    return [*actions, Action(Op.OPTIMIZER_STEP)]


EAGER_1F1B = ScheduleSpec("eager_1f1b", _eager_1f1b)


def train(
    model: str, schedule: str | ScheduleSpec, partition: Any
) -> tuple[list[float], dict[str, Any]]:
    make_specs, kind, loss_fn = MODELS[model]
    pipe = ElasticPipeline(
        make_specs(),
        optimizer=ADAM,
        loss_fn=loss_fn,
        schedule=schedule,
        n_microbatches=MICROBATCHES,
        seed=3,
        planning=PlanOptions(partition=partition),
    )
    losses = [pipe.train_step(x, y) for x, y in batches(kind)]
    state = pipe.full_state_dict()
    pipe.close()
    return losses, state


Config = tuple[str, str | ScheduleSpec, Any]  # model, schedule, partition
CONFIGS: dict[int, list[Config]] = {
    2: [
        *[(m, s, "auto") for m in MODELS for s in ("gpipe", "1f1b")],
        ("transformer", "1f1b", [1, 3]),
        ("transformer", "1f1b", [2, 2]),
        ("tuple", "gpipe", [3, 2]),
        ("transformer", EAGER_1F1B, "auto"),
        ("tuple", EAGER_1F1B, [3, 2]),
    ],
    4: [(m, s, "auto") for m in ("transformer", "mlp") for s in ("gpipe", "1f1b", EAGER_1F1B)],
}


def run_configs(ctx: StageContext, n_stages: int) -> dict[Any, Any]:
    return {(m, s, str(p)): train(m, s, p) for m, s, p in CONFIGS[n_stages]}


@functools.cache
def reference(model: str) -> tuple[list[float], dict[str, Any]]:
    make_specs, kind, loss_fn = MODELS[model]
    ref = ReferenceTrainer(
        make_specs(), optimizer=ADAM, loss_fn=loss_fn, n_microbatches=MICROBATCHES, seed=3
    )
    losses = [ref.train_step(x, y) for x, y in batches(kind)]
    return losses, ref.full_state_dict()


@functools.cache
def pipelined(n_stages: int) -> dict[Any, Any]:
    results = pipeline.launch(
        functools.partial(run_configs, n_stages=n_stages),
        n_stages,
        threads_per_stage=1,
        timeout_s=60,
    )
    assert all(r.keys() == results[0].keys() for r in results)
    return results[0]  # every rank returns the same losses; rank 0 holds the state


def max_state_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(
        (a[k][name].double() - b[k][name].double()).abs().max().item() for k in a for name in a[k]
    )


@pytest.mark.parametrize("n_stages", [2, 4])
def test_pipeline_matches_single_process(n_stages: int) -> None:
    torch.set_num_threads(1)
    for (model, schedule, partition), (losses, state) in pipelined(n_stages).items():
        ref_losses, ref_state = reference(model)
        what = f"{model} {schedule} {partition} on {n_stages} stages"
        assert losses == pytest.approx(ref_losses, abs=1e-5), what
        assert max_state_diff(state, ref_state) <= 1e-5, what
        # training did something: the weights moved away from their initial values
        assert losses[-1] != losses[0], what


def test_partition_changes_nothing() -> None:
    results = pipelined(2)
    a = results[("transformer", "1f1b", "[2, 2]")]
    b = results[("transformer", "1f1b", "[1, 3]")]
    assert a[0] == pytest.approx(b[0], abs=1e-6)
    assert max_state_diff(a[1], b[1]) <= 1e-6


def test_dropout_is_active() -> None:
    """The reference with dropout differs from the same model without: masks are applied."""
    torch.set_num_threads(1)
    x, y = batches("seq")[0]
    losses = []
    for p in (0.1, 0.0):
        ref = ReferenceTrainer(
            transformer_stack(4, 16, 2, dropout=p),
            optimizer=ADAM,
            loss_fn=F.mse_loss,
            n_microbatches=MICROBATCHES,
            seed=3,
        )
        losses.append(ref.train_step(x, y))
    assert losses[0] != losses[1]
