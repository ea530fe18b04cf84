"""The facade's small parts on their own, without processes: `PlanAge`, `EventLog`,
`TrainingRecipe`."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from pipeline.distributed.events import EventLog
from pipeline.distributed.triggers import PlanAge
from pipeline.local.recipe import TrainingRecipe


def test_the_first_step_of_a_plan_measures_memory_then_every_n() -> None:
    age = PlanAge()
    assert not age.measures(3, 10) and age.measures(10, 10)
    age.restart(5)
    assert age.measures(5, 10) and age.steps_on_plan(8) == 3
    age.measured()
    assert not age.measures(6, 10)
    age.restart(12, measure=False)  # a re-plan that changed nothing: no extra measurement
    assert not age.measures(13, 10) and age.steps_on_plan(13) == 1


def test_events_are_stamped_with_the_pipeline_generation_and_step() -> None:
    now = [0, 0]
    log = EventLog(lambda: (now[0], now[1]))
    log.record("build", sizes=[2, 2])
    now[:] = [1, 7]
    event = log.record("trigger", reason="drift")
    assert [(e.generation, e.step, e.kind) for e in log.events] == [(0, 0, "build"),
                                                                     (1, 7, "trigger")]
    assert event.details == {"reason": "drift"}


def test_a_recipe_changes_as_one_value() -> None:
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    adam = functools.partial(torch.optim.Adam, lr=1e-3)
    recipe = TrainingRecipe.of(3, sgd, F.mse_loss)
    assert recipe.optimizer_state_ratio == 0.0  # plain SGD keeps no state
    same = recipe.changed()
    assert same == recipe
    changed = recipe.changed(optimizer=adam, loss_fn=F.l1_loss)
    assert (changed.seed, changed.optimizer, changed.loss_fn) == (3, adam, F.l1_loss)
    assert changed.optimizer_state_ratio == pytest.approx(2.0)  # Adam: two moments
