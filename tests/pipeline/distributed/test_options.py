"""Bad knobs are refused where their group is made, naming the value; old keywords name
their new place."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from pipeline import ElasticOptions, ElasticPipeline, PipelineOptions, PlanOptions
from pipeline.pure.planner import get_planner

GROUPS: dict[str, Any] = {
    "plan": PlanOptions,
    "elastic": ElasticOptions,
    "pipeline": PipelineOptions,
}


@pytest.mark.parametrize(
    "group,field,value,match",
    [
        ("pipeline", "n_microbatches", 0, "n_microbatches must be a positive int, got 0"),
        ("pipeline", "n_microbatches", 2.0, "n_microbatches must be a positive int, got 2.0"),
        ("pipeline", "on_nonfinite", "warn", r"on_nonfinite must be one of \('raise', 'ignore'\)"),
        ("plan", "memory_budget", -1, "memory_budget must be a positive int, got -1"),
        ("plan", "profile", "guess", r"profile must be one of \('sandbox', 'estimate'\)"),
        ("plan", "partition", "even", "partition must be 'auto', stage sizes or a Plan"),
        ("plan", "handoff", (1, -1), r"handoff must be layer counts >= 0, got \(1, -1\)"),
        ("elastic", "rebalance_every", 0, "rebalance_every must be a positive int"),
        ("elastic", "rebalance_horizon", True, "rebalance_horizon must be a positive int"),
        ("elastic", "measure_memory_every", 0, "measure_memory_every must be a positive int"),
        ("elastic", "try_plans", 0, "try_plans must be a positive int, got 0"),
        ("elastic", "try_steps", 1.5, "try_steps must be a positive int, got 1.5"),
        ("elastic", "try_rounds", 0, "try_rounds must be a positive int, got 0"),
        ("elastic", "try_rounds_max", 1, r"try_rounds_max must be an int >= try_rounds \(2\)"),
        ("elastic", "rebalance_settle", -1, "rebalance_settle must be an int >= 0, got -1"),
        ("elastic", "rebalance_on_drift", 0.0, "rebalance_on_drift must be a fraction > 0"),
    ],
)
def test_a_bad_knob_names_its_value_and_what_is_valid(
    group: str, field: str, value: Any, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        GROUPS[group](**{field: value})


def test_a_handoff_needs_explicit_sizes() -> None:
    with pytest.raises(ValueError, match="handoff= needs explicit stage sizes"):
        PlanOptions(handoff=[1])
    assert PlanOptions(partition=[2, 2], handoff=[1]).handoff == (1,)  # kept as a tuple


def test_groups_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(TypeError, match="planning must be a PlanOptions"):
        PipelineOptions(planning=ElasticOptions())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="planner must be a name or a Planner"):
        PlanOptions(planner=3)  # type: ignore[arg-type]
    memory = get_planner("memory")
    assert PlanOptions(planner=memory).planner is memory


def test_defaults_are_documented_values_and_frozen() -> None:
    options = PipelineOptions()
    assert dataclasses.asdict(options.elastic) == {
        "rebalance_every": None,
        "rebalance_on_drift": None,
        "rebalance_horizon": 100,
        "rebalance_settle": 3,
        "measure_memory_every": 10,
        "correct_after": 10,
        "try_plans": 4,
        "try_steps": 3,
        "try_rounds": 2,
        "try_rounds_max": 4,
    }
    plan = options.planning
    assert (plan.partition, plan.planner, plan.memory_budget, plan.profile, plan.handoff) == (
        "auto",
        "time",
        None,
        "sandbox",
        None,
    )
    assert (options.n_microbatches, options.on_nonfinite, options.pipemare) == (4, "raise", None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.n_microbatches = 8  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.memory_budget = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    "old,new",
    [
        ({"memory_budget": 1 << 20}, r"memory_budget= is now planning=PlanOptions\(memory_budget"),
        ({"partition": [2, 2]}, r"partition= is now planning=PlanOptions\(partition="),
        ({"rebalance_every": 5}, r"rebalance_every= is now elastic=ElasticOptions\("),
        ({"stages_per_rank": 3}, r"get_schedule\('interleaved_1f1b', stages_per_rank=...\)"),
        ({"n_stage": 3}, "n_stage= is not an argument"),
    ],
)
def test_an_old_keyword_names_its_new_place(old: dict[str, Any], new: str) -> None:
    """Raised before any process group is needed."""
    with pytest.raises(TypeError, match=new):
        ElasticPipeline(
            [],
            optimizer=functools.partial(torch.optim.SGD, lr=0.1),
            loss_fn=F.mse_loss,
            **old,
        )


def test_a_group_given_as_a_dict_is_refused_before_any_process_talks() -> None:
    with pytest.raises(TypeError, match="planning must be a PlanOptions, got"):
        ElasticPipeline(
            [],
            optimizer=functools.partial(torch.optim.SGD, lr=0.1),
            loss_fn=F.mse_loss,
            planning={"partition": [2, 2]},  # type: ignore[arg-type]
        )
