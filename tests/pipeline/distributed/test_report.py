"""The typed report of a running pipeline, without processes: `PipelineStats`, `StageStats`,
`PipelineEvent` (JSON round trips, frozen) and the arithmetic behind them."""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from typing import Any, cast

import pytest
import torch

import pipeline
from pipeline.distributed import report
from pipeline.distributed.events import PipelineEvent, plain
from pipeline.distributed.migration import MigrationRecord
from pipeline.pure.costs import LayerCost
from pipeline.pure.placement import Placement
from pipeline.pure.planner import Plan, evaluate

PLAN = Plan(
    sizes=(1, 2),
    actions=("keep", "recompute", "keep"),
    schedule="1f1b",
    n_microbatches=4,
    predicted_iteration_s=5.0,
    predicted_stage_s=(1.0, 0.5),
    predicted_stage_bytes=(1_000, 2_000),
    planner="time",
)
RECORD = MigrationRecord(
    step=3,
    version=1,
    old_sizes=(2, 1),
    new_sizes=(1, 2),
    moved=(("block1", 0, 1),),
    bytes_moved=4_096,
    pause_s=0.01,
)


def stage_stats(stage: int, allocator: int | None = None) -> report.StageStats:
    return report.StageStats(
        stage=stage,
        layers=(f"block{stage}",),
        memory_actions=("keep",),
        forward_s=1.0,
        backward_s=2.0,
        wait_s=0.5,
        optimizer_s=0.1,
        total_s=3.6,
        param_bytes=100,
        state_bytes=400,
        activation_peak_bytes=50,
        measured_peak_bytes=450,
        predicted_peak_bytes=440,
        predicted_compute_s=3.0,
        allocator_peak_bytes=allocator,
        process_peak_bytes=9_000,
    )


def pipeline_stats(plan: Plan | None = PLAN) -> report.PipelineStats:
    return report.PipelineStats(
        generation=1,
        steps=7,
        plan_version=1,
        plan=plan,
        schedule="1f1b",
        n_microbatches=4,
        partition=(1, 2),
        iteration_s=3.6,
        predicted_iteration_s=5.0,
        samples_per_s=4.4,
        tokens_per_s=None,
        bubble_fraction=0.1,
        predicted_bubble_fraction=0.2,
        migrations=(RECORD,),
        stages=(stage_stats(0), stage_stats(1, allocator=1 << 20)),
    )


def round_trip(data: dict[str, Any]) -> Any:
    return json.loads(json.dumps(data, allow_nan=False))


# -- to_dict ------------------------------------------------------------------------------------
@pytest.mark.parametrize("plan", [PLAN, None])
def test_pipeline_stats_to_dict_is_plain_json(plan: Plan | None) -> None:
    stats = pipeline_stats(plan)
    data = stats.to_dict()
    assert round_trip(data) == data  # nothing but JSON values: no tuples, no dataclasses
    assert data["plan"] == (None if plan is None else plan.to_dict())
    assert data["partition"] == [1, 2]
    assert data["migrations"] == [
        {
            "step": 3,
            "version": 1,
            "old_sizes": [2, 1],
            "new_sizes": [1, 2],
            "moved": [["block1", 0, 1]],
            "bytes_moved": 4_096,
            "pause_s": 0.01,
        }
    ]
    assert data["stages"] == [s.to_dict() for s in stats.stages]
    assert set(data) == {f.name for f in dataclasses.fields(report.PipelineStats)}
    if plan is not None:
        assert Plan.from_dict(data["plan"]) == plan


def test_stage_stats_to_dict_has_every_field() -> None:
    data = stage_stats(1, allocator=7).to_dict()
    assert round_trip(data) == data
    assert set(data) == {f.name for f in dataclasses.fields(report.StageStats)}
    assert data["layers"] == ["block1"] and data["allocator_peak_bytes"] == 7
    assert stage_stats(0).busy_s == pytest.approx(3.1)


def test_event_to_dict_is_plain_json() -> None:
    event = PipelineEvent(0, 3, "migration", dataclasses.asdict(RECORD))
    data = event.to_dict()
    assert round_trip(data) == data
    assert data["kind"] == "migration" and data["step"] == 3 and data["generation"] == 0
    assert data["details"]["new_sizes"] == [1, 2]
    assert event.details["new_sizes"] == (1, 2)  # the record's own values, untouched
    build = PipelineEvent(0, 0, "build", {"sizes": [1, 2], "plan": PLAN.to_dict()})
    assert round_trip(build.to_dict())["details"]["plan"] == PLAN.to_dict()


def test_plain_takes_what_json_does_not() -> None:
    value = {1: (RECORD, {2.5}), "nan": float("nan"), "device": torch.device("cpu")}
    data = plain(value)
    assert round_trip(data) == data
    assert data["1"][0]["moved"] == [["block1", 0, 1]]
    assert data["nan"] is None and data["device"] == "cpu"


# -- frozen, picklable --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "obj,field",
    [
        (stage_stats(0), "total_s"),
        (pipeline_stats(), "samples_per_s"),
        (PipelineEvent(0, 0, "build"), "kind"),
    ],
)
def test_the_records_are_frozen(obj: Any, field: str) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(obj, field, 1)


def test_the_records_pickle() -> None:  # stats and events travel back from stage processes
    for obj in (pipeline_stats(), PipelineEvent(1, 2, "trigger", {"reason": "drifted"})):
        assert pickle.loads(pickle.dumps(obj)) == obj


def test_an_event_needs_a_known_kind() -> None:
    for kind in ("", "handof"):
        with pytest.raises(ValueError, match=f"kind={kind!r} is not valid; valid: schedule, "):
            PipelineEvent(0, 0, kind)  # type: ignore[arg-type]


def test_the_public_names() -> None:
    assert pipeline.PipelineStats is report.PipelineStats
    assert pipeline.StageStats is report.StageStats
    assert pipeline.PipelineEvent is PipelineEvent


# -- the arithmetic -----------------------------------------------------------------------------
def test_bubble_fraction_is_the_bottleneck_idle_share() -> None:
    assert report.bubble_fraction([3.0, 2.0], 4.0) == pytest.approx(0.25)
    assert report.bubble_fraction([4.0], 4.0) == 0.0
    assert report.bubble_fraction([5.0], 4.0) == 0.0  # medians may overshoot: clamped
    assert report.bubble_fraction([1.0], 0.0) == 0.0  # nothing timed yet
    assert report.bubble_fraction([], 1.0) == 0.0


def test_predicted_bubble_fraction_reads_the_plan() -> None:
    assert report.predicted_bubble_fraction(None) is None
    # busiest stage: 1.0 s per micro-batch x 4 micro-batches, over a 5 s iteration
    assert report.predicted_bubble_fraction(PLAN) == pytest.approx(0.2)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("n_stages,n_microbatches", [(2, 4), (4, 8), (3, 1)])
def test_predicted_bubble_of_uniform_stages_is_the_closed_form(
    schedule: str, n_stages: int, n_microbatches: int
) -> None:
    costs = [LayerCost(f"l{i}", forward_s=1.0, backward_s=2.0) for i in range(n_stages)]
    plan = evaluate(costs, [1] * n_stages, schedule=schedule, n_microbatches=n_microbatches)
    expected = (n_stages - 1) / (n_microbatches + n_stages - 1)
    assert report.predicted_bubble_fraction(plan) == pytest.approx(expected)


@pytest.mark.parametrize(
    "x,tokens",
    [
        (torch.zeros(8, 16, dtype=torch.long), 128),  # (batch, seq) token ids
        (torch.zeros(8, 16, 3, dtype=torch.int32), 128),  # extra dims: still batch x seq
        ((torch.zeros(4, 10, dtype=torch.long), torch.zeros(4, 10)), 40),  # first tensor
        ([torch.zeros(4, 10, dtype=torch.int64)], 40),
        (torch.zeros(8, 16), None),  # floating: not tokens
        (torch.zeros(8, dtype=torch.long), None),  # no sequence dim
        (torch.zeros(8, 16, dtype=torch.bool), None),
        ((torch.zeros(4, 10), torch.zeros(4, 10, dtype=torch.long)), None),  # first is float
        ((), None),
        ("not a tensor", None),
    ],
)
def test_token_count(x: Any, tokens: int | None) -> None:
    assert report.token_count(x) == tokens


def test_throughputs_are_medians_over_the_iteration() -> None:
    assert report.per_second([16, 16, 32], 2.0) == pytest.approx(8.0)
    assert report.per_second([16], 0.0) == 0.0 and report.per_second([], 1.0) == 0.0
    assert report.tokens_per_s([128, 128], 0.5) == pytest.approx(256.0)
    assert report.tokens_per_s([128, None], 0.5) is None  # a step without tokens
    assert report.tokens_per_s([], 0.5) is None


@pytest.mark.parametrize("last_steps", [0, -1, 1.5, True])
def test_stats_rejects_a_bad_last_steps_before_any_collective(last_steps: Any) -> None:
    message = re.escape(f"last_steps must be a positive int, got {last_steps!r}")
    with pytest.raises(ValueError, match=message):
        report.stats(cast(Any, None), cast(Any, None), last_steps)


@pytest.mark.parametrize("n_ranks,n_microbatches", [(2, 4), (4, 8)])
def test_predicted_bubble_with_several_stages_per_rank_counts_a_rank_busy_for_all(
    n_ranks: int, n_microbatches: int
) -> None:
    """Interleaved 1F1B on 2R equal stages: Megatron's (R - 1) / (v M + R - 1) of the step."""
    stages = 2 * n_ranks
    costs = [LayerCost(f"l{i}", forward_s=0.5, backward_s=1.0) for i in range(stages)]
    plan = evaluate(costs, [1] * stages, schedule="interleaved_1f1b", n_microbatches=n_microbatches)
    expected = (n_ranks - 1) / (2 * n_microbatches + n_ranks - 1)
    placement = Placement("loop", n_ranks, 2)
    assert report.predicted_bubble_fraction(plan, placement) == pytest.approx(expected)
