"""schedule="auto" tries the plans its cost model cannot rank and keeps the fastest measured,
exactly: the losses across every switch are the single process's.

The cost cache says the model's predictions have been off by half (a made-up history of
plans that ran at once and three times their prediction), so every exact schedule's plan
for equal layers is within its error of the best: each runs a few measured steps, the
fastest measured is kept, the cache learns what each one measured, and a "tryout" event
records them (`pipeline.distributed.tryout`); a third round runs the fastest and those it did
not beat in both.

At the first plan's correction the same happens with the plans from the measured costs:
the cache also says 1F1B's plans ran at half their prediction, so 1F1B alone is planned on
the first step, untried; the correction re-plans it and tries the other schedules' plans
from the same costs against it (`pipeline.distributed.tryout`, 5.).
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

WIDTH, BATCH, MICROBATCHES, STEPS, LAYERS = 32, 16, 4, 48, 8
ADAM = functools.partial(torch.optim.Adam, lr=1e-3)


def specs() -> list[LayerSpec]:
    return [LayerSpec(f"l{i}", functools.partial(nn.Linear, WIDTH, WIDTH)) for i in range(LAYERS)]


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randn(BATCH, WIDTH, generator=g), torch.randn(BATCH, WIDTH, generator=g))
        for _ in range(STEPS)
    ]


def tried(
    ctx: StageContext, errors: dict[str, list[float]], elastic: ElasticOptions
) -> dict[str, Any]:
    cache = CostCache(errors=PredictionErrors(errors))
    pipe = ElasticPipeline(
        specs(),
        optimizer=ADAM,
        loss_fn=F.mse_loss,
        schedule="auto",
        n_microbatches=MICROBATCHES,
        seed=3,
        planning=PlanOptions(cost_cache=cache),
        elastic=elastic,
    )
    losses = [pipe.train_step(x, y) for x, y in batches()]
    out = {
        "losses": losses,
        "tryouts": [e.details for e in pipe.events if e.kind == "tryout"],
        "switches": [plan_of(e.details["plan"]) for e in pipe.events if e.kind == "switch"],
        "schedule": pipe.schedule.name,
        "learned": cache.errors.to_dict(),
        "state": pipe.full_state_dict(),
    }
    pipe.close()
    return out


def plan_of(details: dict[str, Any]) -> tuple[str, tuple[int, ...]]:
    """A plan as an event records it: (schedule, sizes)."""
    return details["schedule"], tuple(details["sizes"])


def run_tried(errors: dict[str, list[float]], elastic: ElasticOptions) -> dict[str, Any]:
    torch.set_num_threads(1)
    work = functools.partial(tried, errors=errors, elastic=elastic)
    return pipeline.launch(work, 2, threads_per_stage=1, timeout_s=180)[0]


def assert_exact(run: dict[str, Any]) -> None:
    """The losses and the final weights are the single process's."""
    reference = ReferenceTrainer(
        specs(), optimizer=ADAM, loss_fn=F.mse_loss, n_microbatches=MICROBATCHES, seed=3
    )
    expected = [reference.train_step(x, y) for x, y in batches()]
    assert run["losses"] == pytest.approx(expected, abs=1e-5)
    for key, tensors in reference.full_state_dict().items():
        for name, tensor in tensors.items():
            torch.testing.assert_close(run["state"][key][name], tensor, atol=1e-5, rtol=0)


def test_the_plans_the_model_cannot_rank_are_tried_and_the_fastest_kept_exactly() -> None:
    elastic = ElasticOptions(
        try_plans=4, try_steps=2, try_rounds=2, try_rounds_max=3, measure_memory_every=50
    )
    run = run_tried({"made-up": [1.0, 3.0]}, elastic)  # error: 50%
    begun, ended = run["tryouts"]
    assert begun["kept"] is None and len(begun["tried"]) >= 2, begun
    contenders = [plan_of(t) for t in ended["tried"]]
    assert contenders == [plan_of(t) for t in begun["tried"]]
    measured = {plan_of(t): t["measured_s"] for t in ended["tried"]}
    assert all(s is not None and s > 0 for s in measured.values()), measured
    fastest = min(measured, key=lambda plan: measured[plan])
    assert (ended["kept"], tuple(ended["kept_sizes"])) == fastest
    assert fastest[0] == run["schedule"]
    turns = contenders[1:] + contenders  # each tried in turn, twice over (A B C A B C)
    assert run["switches"][: len(turns)] == turns
    # a third round of the fastest and those it did not beat in both, if any; then back to it
    visits = sum(len(t["visits_s"]) for t in ended["tried"])
    assert ended["rounds"] in (2, 3) and 2 * len(contenders) <= visits, ended
    assert (ended["rounds"] == 2) == (visits == 2 * len(contenders)), ended
    assert len(run["switches"]) - (visits - 1) in (0, 1)
    assert run["switches"][visits - 1 :] in ([], [fastest])
    learned = {schedule for schedule, _ in contenders}
    assert learned <= set(run["learned"]), run["learned"]  # the cache learned them
    assert_exact(run)


def test_a_correction_tries_other_schedules_and_cuts_from_measured_costs_exactly() -> None:
    """The correction's rivals: the other schedules' plans and 1F1B on the cuts one layer
    from the plan in force, switched to in turn (repartitions among them), exactly."""
    errors = {"made-up": [1.0, 3.0], "1f1b": [0.5, 0.5]}  # error 50%; 1f1b twice as fast
    elastic = ElasticOptions(
        try_plans=6, try_steps=2, try_rounds=1, correct_after=4, measure_memory_every=4
    )
    run = run_tried(errors, elastic)
    begun, ended = run["tryouts"]  # none on the first step: 1f1b alone was planned
    tried = [plan_of(t) for t in ended["tried"]]
    in_force = tried[0]
    assert in_force[0] == "1f1b" and len(set(tried)) == len(tried) >= 3, ended
    assert {schedule for schedule, _ in tried[1:]} - {"1f1b"}, "another schedule is tried"
    cuts = [sizes for schedule, sizes in tried[1:] if schedule == "1f1b"]
    assert cuts, "a cut one layer from the plan in force is tried"
    assert all(sum(abs(a - b) for a, b in zip(c, in_force[1], strict=True)) == 2 for c in cuts)
    assert [plan_of(t) for t in begun["tried"]] == tried and begun["kept"] is None
    assert begun["error"] >= 0.5, begun  # the cache's error, or the plan in force's miss
    measured = {plan_of(t): t["measured_s"] for t in ended["tried"]}
    kept = min(measured, key=lambda plan: measured[plan])
    assert (ended["kept"], tuple(ended["kept_sizes"])) == kept and kept[0] == run["schedule"]
    assert run["switches"][: len(tried) - 1] == tried[1:]
    assert run["switches"][len(tried) - 1 :] in ([], [kept])  # then back to the best
    assert run["learned"] == errors  # predictions from measured costs teach no error
    assert_exact(run)
