"""The facade's small parts on their own, without processes: `PlanAge`, `EventLog`,
`TrainingRecipe`, `ModelHolder`."""

from __future__ import annotations

import functools
import logging

import pytest
import torch
import torch.nn.functional as F

from pipeline.distributed.events import EventLog
from pipeline.distributed.holder import ModelHolder
from pipeline.distributed.inheritance import WeightSnapshot
from pipeline.distributed.migration import MigrationRecord
from pipeline.distributed.triggers import PlanAge
from pipeline.local.inflight import StepTimes
from pipeline.local.recipe import TrainingRecipe
from pipeline.local.spec import LayerSpec
from pipeline.local.stage import Stage
from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import get_planner


def test_the_first_step_of_a_plan_measures_memory_then_every_n() -> None:
    age = PlanAge()
    assert not age.measures(3, 10) and age.measures(10, 10)
    age.restart(5)
    assert age.measures(5, 10) and age.steps_on_plan(8) == 3
    age.measured()
    assert not age.measures(6, 10)
    age.restart(12, measure=False)  # a re-plan that changed nothing: no extra measurement
    assert not age.measures(13, 10) and age.steps_on_plan(13) == 1


def test_drift_is_confirmed_by_two_checks_in_a_row_of_one_plan() -> None:
    age = PlanAge()
    assert [age.drift_confirmed(d) for d in (True, False, True, True)] == [False] * 3 + [True]
    assert not age.drift_confirmed(True)  # confirmed drift starts the count again
    age.restart(7)  # a new plan: what the old one's checks found is void
    assert [age.drift_confirmed(d) for d in (True, True)] == [False, True]


def test_events_are_stamped_with_the_pipeline_generation_and_step() -> None:
    now = [0, 0]
    log = EventLog(lambda: (now[0], now[1]))
    log.record("build", sizes=[2, 2])
    now[:] = [1, 7]
    event = log.record("trigger", reason="drift")
    assert [(e.generation, e.step, e.kind) for e in log.events] == [
        (0, 0, "build"),
        (1, 7, "trigger"),
    ]
    assert event.details == {"reason": "drift"}


def test_events_go_to_the_logger_at_their_level(caplog: pytest.LogCaptureFixture) -> None:
    log = EventLog(lambda: (2, 5))
    with caplog.at_level(logging.DEBUG, logger="pipeline"):
        log.record("migration", moved=[("l1", 0, 1)])
        log.record("error", error="boom")
        log.record("inherit", layers=3)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "model 2 step 5: migration {'moved': [['l1', 0, 1]]}"),
        (logging.WARNING, "model 2 step 5: error {'error': 'boom'}"),
        (logging.DEBUG, "model 2 step 5: inherit {'layers': 3}"),
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pipeline"):  # an operator turns it down
        log.record("build", sizes=[2, 2])
    assert not caplog.records


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


def _holder_with_stage(n_layers: int = 4) -> tuple[ModelHolder, Stage]:
    specs = [LayerSpec(f"l{i}", functools.partial(torch.nn.Linear, 4, 4)) for i in range(n_layers)]
    holder = ModelHolder(specs, requested_handoff=None)
    sgd = functools.partial(torch.optim.SGD, lr=0.1)
    stage = Stage(
        0, 1, specs, seed=0, device=torch.device("cpu"), optimizer=sgd, loss_fn=F.mse_loss
    )
    return holder, stage


def test_a_model_holder_counts_builds_migrations_and_steps() -> None:
    holder, stage = _holder_with_stage()
    with pytest.raises(RuntimeError, match="first train_step"):
        holder.live_stage()
    costs = [LayerCost(f"l{i}", 1.0, 2.0, 10, 10, 100, 100, 0) for i in range(4)]
    plan = get_planner("time").plan(costs, 2, schedule="1f1b", n_microbatches=4)
    holder.install([stage], plan.sizes, plan)
    assert holder.live_stage() is stage and holder.stages == [stage] and holder.plan is plan
    holder.stepped(8, None, StepTimes())
    holder.stepped(8, 64, StepTimes())
    assert holder.step == 2 and holder.history.steps == 2
    other = [1, 3] if list(plan.sizes) != [1, 3] else [3, 1]
    record = MigrationRecord(2, 1, tuple(plan.sizes), tuple(other), (), 0, 0.0)
    holder.moved(record, other)
    assert holder.sizes == other and holder.version == 1 and holder.migrations == [record]
    assert holder.plan is None  # the plan was for other sizes
    assert holder.partition_history == [(0, list(plan.sizes)), (2, other)]
    holder.sizes.append(9)  # views are copies: the holder changes only through its methods
    assert holder.sizes == other
    holder.close()
    assert not holder.built and stage.layers == []


def test_a_model_holder_hands_a_pending_inheritance_over_once() -> None:
    holder, _ = _holder_with_stage()
    assert holder.take_inheritance() is None
    snapshot = WeightSnapshot(("l0",), (1,), {})
    holder.expect_inheritance(snapshot)
    assert holder.inheritance_pending
    assert holder.take_inheritance() is snapshot and holder.take_inheritance() is None
