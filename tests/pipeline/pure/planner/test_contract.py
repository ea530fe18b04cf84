"""One contract over every planner of the registry (`pipeline.pure.planner.PLANNERS`), as
Optuna runs one suite over every storage: what `Planner.plan` promises whatever the
strategy. Each planner's own objective is checked against brute force in its own module."""

from __future__ import annotations

import dataclasses
import random

import pytest

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner import PLANNERS, InfeasibleBudgetError, Plan, Planner, get_planner
from pipeline.pure.registry import UnknownName

SHAPES = [(1, "1f1b", 1), (2, "gpipe", 4), (3, "1f1b", 4), (4, "zbh1", 8), (4, "zbv", 4)]


def costs(seed: int, n: int = 9) -> list[LayerCost]:
    rng = random.Random(seed)
    return [
        LayerCost(
            f"layer{i}",
            forward_s=rng.uniform(1e-3, 5e-3),
            backward_s=rng.uniform(2e-3, 1e-2),
            activation_bytes=rng.randrange(1 << 16, 1 << 20),
            output_bytes=rng.randrange(1 << 12, 1 << 16),
            param_bytes=rng.randrange(1 << 14, 1 << 18),
            grad_bytes=rng.randrange(1 << 14, 1 << 18),
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("name", list(PLANNERS))
@pytest.mark.parametrize(("n_stages", "schedule", "m"), SHAPES)
def test_every_planner_plans_every_layer_once_in_order(
    name: str, n_stages: int, schedule: str, m: int
) -> None:
    layers = costs(n_stages)
    plan = get_planner(name).plan(layers, n_stages, schedule=schedule, n_microbatches=m)
    assert isinstance(plan, Plan) and plan.n_stages == n_stages
    assert sum(plan.sizes) == len(layers) and all(size >= 1 for size in plan.sizes)
    assert (plan.schedule, plan.n_microbatches) == (schedule, m)
    assert plan.predicted_iteration_s > 0 and len(plan.predicted_stage_bytes) == n_stages
    assert Plan.from_dict(plan.to_dict()) == plan  # rank 0 broadcasts it
    again = get_planner(name).plan(layers, n_stages, schedule=schedule, n_microbatches=m)
    assert again == plan  # deterministic: every rank that plans agrees


@pytest.mark.parametrize("name", list(PLANNERS))
def test_every_planner_fits_a_budget_or_names_the_smallest_that_fits(name: str) -> None:
    layers, planner = costs(7), get_planner(name)
    with pytest.raises(InfeasibleBudgetError) as refused:
        planner.plan(layers, 2, schedule="1f1b", n_microbatches=4, memory_budget=1)
    smallest = refused.value.min_budget
    assert smallest > 1
    plan = planner.plan(layers, 2, schedule="1f1b", n_microbatches=4, memory_budget=smallest)
    assert max(plan.predicted_stage_bytes) <= smallest


def test_a_planner_is_found_by_name_any_case_or_by_import_path() -> None:
    assert all(isinstance(get_planner(name), Planner) for name in PLANNERS)
    assert type(get_planner("TIME")) is PLANNERS["time"]
    path = f"{PLANNERS['memory'].__module__}:{PLANNERS['memory'].__qualname__}"
    assert type(get_planner(path)) is PLANNERS["memory"]
    with pytest.raises(UnknownName, match="is not a subclass of pipeline.pure.planner.base"):
        get_planner("pipeline.pure.costs:LayerCost")
    with pytest.raises(TypeError, match="bad options for planner 'time'.*valid options: "):
        get_planner("time", fastest=True)


@pytest.mark.parametrize("name", list(PLANNERS))
def test_whether_a_budget_fits_depends_on_the_bytes_alone(name: str) -> None:
    """A shape is ruled out on its layers' bytes before they are timed
    (`pipeline.pure.shape.plan_shape`): the same refusal with every second unknown (0)."""
    layers, planner = costs(5), get_planner(name)
    untimed = [dataclasses.replace(c, forward_s=0.0, backward_s=0.0) for c in layers]
    for n_stages, m in ((1, 1), (2, 4), (3, 8)):
        with pytest.raises(InfeasibleBudgetError) as refused:
            planner.plan(layers, n_stages, schedule="1f1b", n_microbatches=m, memory_budget=1)
        least = refused.value.min_budget
        for budget in (least - 1, least):
            outcomes: list[int | None] = []
            for given in (layers, untimed):
                try:
                    planner.plan(
                        given, n_stages, schedule="1f1b", n_microbatches=m, memory_budget=budget
                    )
                    outcomes.append(None)
                except InfeasibleBudgetError as error:
                    outcomes.append(error.min_budget)
            assert outcomes[0] == outcomes[1], (n_stages, m, budget, outcomes)
            assert (outcomes[0] is None) == (budget >= least)
