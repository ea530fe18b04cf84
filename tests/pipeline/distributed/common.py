"""What the exactness tests of the distributed runtime share: models, data, yardsticks, a launch.

Every such test trains one of `MODELS` on its `batches` (`model_pipeline`), compares the
result with `ReferenceTrainer` trained the same way in this process (`reference_run`) or with
another run (`assert_same_trajectory`), by `max_state_diff`. Each test module lists its
configurations per rank count (`configs(n_ranks)`: name -> arguments of its `train`) and
reads rank 0's results; one launch per rank count trains them all in the same processes
(`launch_configs`), so a module pays the process start-up once.
"""

from __future__ import annotations

import functools
import json
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import ElasticPipeline, LayerSpec, Plan, PlanOptions, StageContext
from pipeline.local.models import mlp_stack, transformer_stack
from pipeline.local.reference import ReferenceTrainer
from pipeline.pure.schedule import ScheduleLike

STEPS, BATCH, MICROBATCHES = 5, 8, 4
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)
SEED = 3

Batch = tuple[Any, torch.Tensor]


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


def mixed_stack() -> list[LayerSpec]:
    """7 layers of four types; the carry is (hidden, ids) until `take`, then hidden."""
    tokens = [LayerSpec(f"tok{i}", functools.partial(AddTokenBias, 11, 16)) for i in range(2)]
    linear = [LayerSpec(f"lin{i}", functools.partial(torch.nn.Linear, 16, 16)) for i in range(2)]
    return [
        *tokens,
        LayerSpec("take", TakeHidden),
        linear[0],
        *transformer_stack(2, 16, 2),
        linear[1],
    ]


def other_stack() -> list[LayerSpec]:
    """Another model on the mixed model's carry, for `reconfigure`: the same first layers,
    wider linear layers after `take`."""
    wide = [LayerSpec(f"wide{i}", functools.partial(torch.nn.Linear, 16, 16)) for i in range(4)]
    return [*mixed_stack()[:3], *wide]


MODELS: dict[str, Any] = {
    # name: (specs, batches, loss)
    "transformer": (lambda: transformer_stack(4, 16, 2, dropout=0.1), "seq", F.mse_loss),
    "mlp": (lambda: mlp_stack([12, 32, 32, 24, 16, 5], dropout=0.1), "flat", F.cross_entropy),
    "tuple": (tuple_stack, "tokens", F.mse_loss),
    "mixed": (mixed_stack, "tokens", F.mse_loss),
    "other": (other_stack, "tokens", F.mse_loss),
}


def batches(kind: str) -> list[Batch]:
    g = torch.Generator().manual_seed(7)
    out: list[Batch] = []
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


def model_pipeline(
    model: str,
    schedule: ScheduleLike,
    n_microbatches: int,
    partition: Any,
    *,
    handoff: list[int] | None = None,
    **options: Any,
) -> tuple[ElasticPipeline, list[Batch]]:
    """`MODELS[model]` pipelined under `schedule`, seeded and optimised as `reference_run`
    trains it (`options`: more of `ElasticPipeline`'s arguments), and the model's batches."""
    make_specs, kind, loss_fn = MODELS[model]
    pipe = ElasticPipeline(
        make_specs(),
        optimizer=ADAM,
        loss_fn=loss_fn,
        schedule=schedule,
        n_microbatches=n_microbatches,
        seed=SEED,
        planning=PlanOptions(partition=partition, handoff=handoff),
        **options,
    )
    return pipe, batches(kind)


@functools.cache
def reference_run(
    model: str,
    n_microbatches: int = MICROBATCHES,
    *,
    drain_at: tuple[int, tuple[int, ...]] | None = None,
    **options: Any,
) -> tuple[list[float], dict[str, Any]]:
    """`MODELS[model]` trained on its batches in this process (`options`: more of
    `ReferenceTrainer`'s arguments, hashable; `drain_at`: (step, sizes), a stream's boundary
    before that step, `ReferenceTrainer.drain(sizes)`): its losses and full state dict."""
    make_specs, kind, loss_fn = MODELS[model]
    ref = ReferenceTrainer(
        make_specs(),
        optimizer=ADAM,
        loss_fn=loss_fn,
        n_microbatches=n_microbatches,
        seed=SEED,
        **options,
    )
    losses = []
    for step, (x, y) in enumerate(batches(kind)):
        if drain_at is not None and step == drain_at[0]:
            ref.drain(drain_at[1])
        losses.append(ref.train_step(x, y))
    return losses, ref.full_state_dict()


def recomputing(sizes: list[int], schedule: str, n_microbatches: int) -> Plan:
    """A plan of `sizes` under `schedule` that recomputes every other layer (the first too)."""
    actions = tuple("recompute" if i % 2 == 0 else "keep" for i in range(sum(sizes)))
    n = len(sizes)
    return Plan(tuple(sizes), actions, schedule, n_microbatches, 0.0, (0.0,) * n, (0,) * n)


def timeline_spans(pipe: ElasticPipeline) -> list[tuple[int, str, str]]:
    """(row, name, category) of every span of the pipeline's saved timeline ([] on the
    ranks that do not write it)."""
    with tempfile.TemporaryDirectory() as tmp:
        trace = pipe.save_timeline(Path(tmp) / "t.json")
        if trace is None:
            return []
        events = json.loads(trace.read_text())["traceEvents"]
    return [(e["tid"], e["name"], e["cat"]) for e in events if e["ph"] == "X"]


def max_state_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    """The largest difference between two full state dicts (layer key -> name -> tensor)."""
    assert a.keys() == b.keys()
    return max(
        (a[k][name].double() - b[k][name].double()).abs().max().item() for k in a for name in a[k]
    )


def assert_same_trajectory(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    """Two runs' results ("losses", "state") agree to 1e-6: the same training, step by step."""
    assert a["losses"] == pytest.approx(b["losses"], abs=1e-6)
    assert max_state_diff(a["state"], b["state"]) <= 1e-6


def _run(
    ctx: StageContext, train: Callable[..., Any], configs: Mapping[str, tuple[Any, ...]]
) -> dict[str, Any]:
    return {name: train(*config) for name, config in configs.items()}


def launch_configs(
    train: Callable[..., Any],
    configs: Mapping[str, tuple[Any, ...]],
    n_ranks: int,
    timeout_s: float = 90,
) -> dict[str, Any]:
    """`train(*config)` for every config, in one launch of `n_ranks` processes: rank 0's
    results by name (every rank returns the same losses; rank 0 holds the full state)."""
    run = functools.partial(_run, train=train, configs=dict(configs))
    return pipeline.launch(run, n_ranks, threads_per_stage=1, timeout_s=timeout_s)[0]
