"""A plan made from wrong costs is corrected by what the stages measure, and stays exact.

The cost cache is seeded with equal costs for every layer (as a profile taken on a busy
core, or a stale cache, might say), so the first plan cuts the model in the middle; in truth
the first layer costs far more than the rest. After `correct_after` steps the pipeline
re-plans from its measured costs (`ElasticOptions.correct_after`, on by default), migrates to
the best cut by brute force over those costs, teaches them to the cache, and trains exactly
as one process does.
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
from pipeline.local.profiler import trace_shapes
from pipeline.local.reference import ReferenceTrainer

pytestmark = pytest.mark.multiprocess

WIDTH, BATCH, MICROBATCHES, STEPS = 128, 32, 4, 14
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)
WRONG_S = 1e-3  # what the seeded cache says every layer costs, forward (backward: twice)


class Heavy(nn.Module):
    """A wide MLP: many times the cost of a `Light` layer, same input and output width."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 32 * WIDTH), nn.Linear(32 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.tanh(self.up(x)))


def specs() -> list[LayerSpec]:
    light = functools.partial(nn.Linear, WIDTH, WIDTH)
    return [LayerSpec("heavy", Heavy), *(LayerSpec(f"light{i}", light) for i in range(5))]


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g))
    ] * STEPS


def corrected(ctx: StageContext) -> dict[str, Any]:
    data = batches()
    example = data[0][0].chunk(MICROBATCHES)[0]
    signatures = [shape.signature for shape in trace_shapes(specs(), example)]
    cache = CostCache()
    for signature, shape in zip(signatures, trace_shapes(specs(), example), strict=True):
        cache.put(signature, WRONG_S, 2 * WRONG_S, shape.saved_bytes)
    pipe = ElasticPipeline(
        specs(),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        schedule="1f1b",
        n_microbatches=MICROBATCHES,
        seed=5,
        planning=PlanOptions(cost_cache=cache),
        elastic=ElasticOptions(correct_after=4, measure_memory_every=5),
    )
    losses = [pipe.train_step(x, y) for x, y in data]
    measured, _ = pipe.layer_costs()
    out = {
        "losses": losses,
        "history": pipe.partition_history,
        "sizes": pipe.sizes,
        "triggers": [e.details["reason"] for e in pipe.events if e.kind == "trigger"],
        "measured_s": [c.forward_s + c.backward_s for c in measured],
        "learned_s": [(cache.get(s) or {}).get("forward_s", 0.0) for s in signatures[:2]],
        "state": pipe.full_state_dict(),
    }
    pipe.close()
    return out


def test_a_plan_from_wrong_costs_moves_to_the_measured_best_and_stays_exact() -> None:
    torch.set_num_threads(1)
    run = pipeline.launch(corrected, 2, threads_per_stage=1, timeout_s=120)[0]
    first_step, first_sizes = run["history"][0]
    assert (first_step, first_sizes) == (0, [3, 3])  # equal costs: the middle
    assert any("correction" in reason for reason in run["triggers"]), run["triggers"]
    # the cut it ends on is the best by brute force over the costs it measured
    times = run["measured_s"]
    best = min(range(1, 6), key=lambda k: max(sum(times[:k]), sum(times[k:])))
    assert run["sizes"] == [best, 6 - best] != first_sizes, (run["sizes"], times)
    # the cache learned the measured costs in place of the equal wrong ones
    heavy_s, light_s = run["learned_s"]
    assert WRONG_S not in (heavy_s, light_s) and heavy_s > 2 * light_s, run["learned_s"]
    # exact: the migration changed nothing the single process would not do
    reference = ReferenceTrainer(
        specs(), optimizer=ADAM, loss_fn=F.mse_loss, n_microbatches=MICROBATCHES, seed=5
    )
    expected = [reference.train_step(x, y) for x, y in batches()]
    assert run["losses"] == pytest.approx(expected, abs=1e-5)
    state = reference.full_state_dict()
    for key, tensors in state.items():
        for name, tensor in tensors.items():
            torch.testing.assert_close(run["state"][key][name], tensor, atol=1e-5, rtol=0)
