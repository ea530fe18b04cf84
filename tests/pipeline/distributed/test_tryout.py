"""schedule="auto" tries the plans its cost model cannot rank and keeps the fastest measured,
exactly: the losses across every switch are the single process's.

The cost cache says the model's predictions have been off by half (a made-up history of
plans that ran at once and three times their prediction), so every exact schedule's plan
for equal layers is within its error of the best: each runs a few measured steps, the
fastest measured is kept, the cache learns what each one measured, and a "tryout" event
records them (`pipeline.distributed.tryout`).
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
    CostCache,
    ElasticOptions,
    ElasticPipeline,
    LayerSpec,
    PlanOptions,
    StageContext,
)
from pipeline.local.reference import ReferenceTrainer
from pipeline.pure.planner.tryout import PredictionErrors

pytestmark = pytest.mark.multiprocess

WIDTH, BATCH, MICROBATCHES, STEPS, LAYERS = 32, 16, 4, 24, 8
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)


def specs() -> list[LayerSpec]:
    return [LayerSpec(f"l{i}", functools.partial(nn.Linear, WIDTH, WIDTH)) for i in range(LAYERS)]


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g))
        for _ in range(STEPS)
    ]


def tried(ctx: StageContext) -> dict[str, Any]:
    cache = CostCache(errors=PredictionErrors({"made-up": [1.0, 3.0]}))  # error: 50%
    pipe = ElasticPipeline(
        specs(),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        schedule="auto",
        n_microbatches=MICROBATCHES,
        seed=3,
        planning=PlanOptions(cost_cache=cache),
        elastic=ElasticOptions(try_plans=4, try_steps=2, measure_memory_every=50),
    )
    losses = [pipe.train_step(x, y) for x, y in batches()]
    out = {
        "losses": losses,
        "tryouts": [e.details for e in pipe.events if e.kind == "tryout"],
        "switches": [e.details["plan"]["schedule"] for e in pipe.events if e.kind == "switch"],
        "schedule": pipe.schedule.name,
        "learned": cache.errors.to_dict(),
        "state": pipe.full_state_dict(),
    }
    pipe.close()
    return out


def test_the_plans_the_model_cannot_rank_are_tried_and_the_fastest_kept_exactly() -> None:
    torch.set_num_threads(1)
    run = pipeline.launch(tried, 2, threads_per_stage=1, timeout_s=180)[0]
    begun, ended = run["tryouts"]
    assert begun["kept"] is None and len(begun["tried"]) >= 2, begun
    contenders = [t["schedule"] for t in ended["tried"]]
    assert contenders == [t["schedule"] for t in begun["tried"]]
    measured = {t["schedule"]: t["measured_s"] for t in ended["tried"]}
    assert all(s is not None and s > 0 for s in measured.values()), measured
    fastest = min(measured, key=lambda name: measured[name])
    assert ended["kept"] == fastest == run["schedule"]
    assert run["switches"][: len(contenders) - 1] == contenders[1:]  # each tried in turn
    assert run["switches"][len(contenders) - 1 :] in ([], [fastest])  # then back to the best
    assert set(contenders) <= set(run["learned"]), run["learned"]  # the cache learned them
    reference = ReferenceTrainer(
        specs(), optimizer=ADAM, loss_fn=F.mse_loss, n_microbatches=MICROBATCHES, seed=3
    )
    expected = [reference.train_step(x, y) for x, y in batches()]
    assert run["losses"] == pytest.approx(expected, abs=1e-5)
    for key, tensors in reference.full_state_dict().items():
        for name, tensor in tensors.items():
            torch.testing.assert_close(run["state"][key][name], tensor, atol=1e-5, rtol=0)
