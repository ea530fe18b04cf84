"""The tracker interface without any backend: the do-nothing default, the fan-out, the value
conversions every tracker shares, and the runtime's statistics flattened into step metrics."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from nas.tracking import (
    CompositeTracker,
    NoneTracker,
    Tracker,
    clean_metrics,
    json_safe,
    pipeline_metrics,
)
from nas.tracking.base import (
    ARTIFACT_NAME_MAX,
    Rows,
    Summary,
    artifact_name,
    check_state,
    check_step,
)
from pipeline.distributed.events import PipelineEvent
from pipeline.distributed.migration import MigrationRecord
from pipeline.distributed.report import PipelineStats, StageStats


class Recorder(Tracker):
    """Remembers every call, to see what a composite passes on."""

    def __init__(self, fail_on: str | None = None, run_id: str | None = None) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.fail_on = fail_on
        self.id = run_id

    @property
    def run_id(self) -> str | None:
        return self.id

    def _note(self, *call: Any) -> None:
        self.calls.append(call)
        if call[0] == self.fail_on:
            raise RuntimeError(f"{call[0]} failed")

    def start_study(self, study_name: str, config: Mapping[str, Any]) -> None:
        self._note("start_study", study_name, config)

    def start_trial(
        self, trial_number: int, params: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        self._note("start_trial", trial_number, params, config)

    def log_step(self, step: int, metrics: Mapping[str, float | int | None]) -> None:
        self._note("log_step", step, metrics)

    def log_event(self, step: int, event: Mapping[str, Any]) -> None:
        self._note("log_event", step, event)

    def log_model(self, name: str, folder: str | Path, metadata: Mapping[str, Any]) -> None:
        self._note("log_model", name, folder, metadata)

    def end_trial(self, state: str, summary: Summary, error: str | None = None) -> None:
        self._note("end_trial", state, summary, error)

    def end_study(self, trials_table: Rows, pareto_front: Rows, summary: Summary) -> None:
        self._note("end_study", trials_table, pareto_front, summary)

    def close(self) -> None:
        self._note("close")


def run_lifecycle(tracker: Tracker) -> None:
    tracker.start_study("s", {"seed": 0})
    tracker.start_trial(0, {"d_model": 64}, {"summary": "2 layers"})
    tracker.log_step(1, {"loss": 2.0, "validation": None})
    tracker.log_event(1, {"kind": "build"})
    tracker.log_model("s-trial-0", "models/trial-0", {"seed": 1})
    tracker.end_trial("failed", {"loss": 2.0}, "StageError: boom")
    tracker.end_study([{"number": 0}], [], {"best": None})
    tracker.close()


EXPECTED_CALLS = [
    ("start_study", "s", {"seed": 0}),
    ("start_trial", 0, {"d_model": 64}, {"summary": "2 layers"}),
    ("log_step", 1, {"loss": 2.0, "validation": None}),
    ("log_event", 1, {"kind": "build"}),
    ("log_model", "s-trial-0", "models/trial-0", {"seed": 1}),
    ("end_trial", "failed", {"loss": 2.0}, "StageError: boom"),
    ("end_study", [{"number": 0}], [], {"best": None}),
    ("close",),
]


def test_the_base_tracker_and_none_tracker_do_nothing() -> None:
    for tracker in (Tracker(), NoneTracker()):
        run_lifecycle(tracker)  # no error, no output
        assert tracker.run_id is None
        with tracker as entered:
            assert entered is tracker


def test_composite_passes_every_call_on_in_order() -> None:
    first, second = Recorder(), Recorder()
    run_lifecycle(CompositeTracker([first, second]))
    assert first.calls == EXPECTED_CALLS
    assert second.calls == EXPECTED_CALLS


def test_composite_calls_every_tracker_before_raising_the_first_error() -> None:
    failing, other_failing, healthy = Recorder("log_step"), Recorder("log_step"), Recorder()
    composite = CompositeTracker([failing, other_failing, healthy])
    composite.start_study("s", {})
    composite.start_trial(0, {}, {})
    with pytest.raises(RuntimeError, match="log_step failed") as raised:
        composite.log_step(1, {"loss": 1.0})
    assert healthy.calls[-1] == ("log_step", 1, {"loss": 1.0})
    assert any("also raised" in note for note in raised.value.__notes__)


def test_composite_closes_on_exit_and_rejects_non_trackers() -> None:
    recorder = Recorder()
    with CompositeTracker([recorder]):
        pass
    assert recorder.calls == [("close",)]
    with pytest.raises(TypeError, match="Tracker objects"):
        CompositeTracker([object()])  # type: ignore[list-item]


def test_composite_run_id_is_the_primary_trackers_else_the_first_known() -> None:
    mirror, service = Recorder(run_id="s/trial-0"), Recorder(run_id="abc123")
    assert CompositeTracker([mirror, service]).run_id == "s/trial-0"
    assert CompositeTracker([mirror, service], primary=1).run_id == "abc123"
    assert CompositeTracker([mirror, Recorder()], primary=1).run_id == "s/trial-0"
    assert CompositeTracker([Recorder(), NoneTracker()]).run_id is None
    with pytest.raises(ValueError, match="primary=2 is not an index of the 2 trackers"):
        CompositeTracker([mirror, service], primary=2)


@pytest.mark.parametrize(
    "text,name",
    [
        ("study-trial-3", "study-trial-3"),
        ("my study/trial 3", "my-study-trial-3"),
        ("été:v1.0_best", "t-v1.0_best"),
        ("x" * 200, "x" * ARTIFACT_NAME_MAX),
    ],
)
def test_artifact_name_keeps_what_every_backend_takes(text: str, name: str) -> None:
    assert artifact_name(text) == name
    assert artifact_name(name) == name  # already a name: unchanged


def test_artifact_name_of_nothing_usable_is_an_error() -> None:
    with pytest.raises(ValueError, match="no artifact name can be made from '// '"):
        artifact_name("// ")


# -- values -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Point:
    x: float
    y: tuple[int, ...]


def test_json_safe_gives_strict_json() -> None:
    value = {
        "nan": math.nan,
        "inf": -math.inf,
        "tuple": (1, (2, 3)),
        "set": {3, 1},
        "dataclass": Point(1.5, (1,)),
        "event": PipelineEvent(0, 3, "migration", {"a": (1,)}),
        "path": Path("/tmp/x"),
        7: "int key",
        "numpy": np.float32(0.5),
        "array": np.arange(2),
        "tensor": torch.tensor(3),
        "object": object,
    }
    safe = json_safe(value)
    assert json.loads(json.dumps(safe, allow_nan=False)) == safe
    assert safe["nan"] is None and safe["inf"] is None
    assert safe["tuple"] == [1, [2, 3]] and safe["set"] == [1, 3]
    assert safe["dataclass"] == {"x": 1.5, "y": [1]}
    assert safe["event"] == {"generation": 0, "step": 3, "kind": "migration", "details": {"a": [1]}}
    assert safe["path"] == "/tmp/x" and safe["7"] == "int key"
    assert safe["numpy"] == 0.5 and safe["array"] == [0, 1] and safe["tensor"] == 3
    assert safe["object"] == str(object)


def test_clean_metrics_drops_none_keeps_nan_and_converts_scalars() -> None:
    scalars: dict[str, Any] = {"tokens": torch.tensor(7), "loss": np.float64(1.5)}
    cleaned = clean_metrics({"ok": True, "val": None, "nan": math.nan, **scalars})
    assert set(cleaned) == {"loss", "ok", "nan", "tokens"}
    assert cleaned["loss"] == 1.5 and type(cleaned["loss"]) is float
    assert cleaned["ok"] == 1 and type(cleaned["ok"]) is int
    assert math.isnan(cleaned["nan"]) and cleaned["tokens"] == 7
    with pytest.raises(TypeError, match="'name'"):
        clean_metrics({"name": "text"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="metric name"):
        clean_metrics({"": 1.0})
    with pytest.raises(TypeError, match="'v'"):
        clean_metrics({"v": torch.ones(2)})  # type: ignore[dict-item]


def test_state_and_step_checks() -> None:
    for state in ("complete", "pruned", "failed"):
        assert check_state(state) == state
    assert [check_state(s) for s in ("COMPLETE", "PRUNED", "FAIL", "fail")] == [
        "complete",
        "pruned",
        "failed",
        "failed",
    ]
    with pytest.raises(ValueError, match="valid states: complete, pruned, failed"):
        check_state("running")
    check_step(0)
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match="non-negative int"):
            check_step(bad)  # type: ignore[arg-type]


# -- the runtime's figures as metrics -------------------------------------------------------------
def stage(index: int, peak: int) -> StageStats:
    return StageStats(
        stage=index,
        layers=("a", "b")[: index + 1],
        memory_actions=("keep",) * (index + 1),
        forward_s=1.0,
        backward_s=2.0,
        wait_s=0.5,
        optimizer_s=0.1,
        total_s=3.6,
        param_bytes=100,
        state_bytes=400,
        activation_peak_bytes=peak - 400,
        measured_peak_bytes=peak,
        predicted_peak_bytes=None,
        predicted_compute_s=None,
        allocator_peak_bytes=None,
        process_peak_bytes=2 * peak,
    )


def test_pipeline_metrics_flattens_the_real_stats_dict() -> None:
    moves = [
        MigrationRecord(
            step=s,
            version=s,
            old_sizes=(2, 1),
            new_sizes=(1, 2),
            moved=(("b", 0, 1),),
            bytes_moved=1000 * s,
            pause_s=0.25,
        )
        for s in (1, 2)
    ]
    stats = PipelineStats(
        generation=0,
        steps=5,
        plan_version=2,
        plan=None,
        schedule="1f1b",
        n_microbatches=4,
        partition=(1, 2),
        iteration_s=3.6,
        predicted_iteration_s=None,
        samples_per_s=8.0,
        tokens_per_s=1024.0,
        bubble_fraction=0.25,
        predicted_bubble_fraction=None,
        migrations=tuple(moves),
        stages=(stage(0, 450), stage(1, 900)),
    )
    metrics = pipeline_metrics(stats.to_dict())
    assert metrics["tokens_per_s"] == 1024.0 and metrics["samples_per_s"] == 8.0
    assert metrics["bubble_fraction"] == 0.25 and metrics["predicted_iteration_s"] is None
    assert metrics["plan_version"] == 2 and metrics["generation"] == 0
    assert metrics["stage0/total_s"] == 3.6 and metrics["stage1/measured_peak_bytes"] == 900
    assert metrics["stage0/layers"] == 1 and metrics["stage1/layers"] == 2
    assert metrics["peak_bytes"] == 900
    assert metrics["migrations/count"] == 2
    assert metrics["migrations/bytes_moved"] == 3000 and metrics["migrations/pause_s"] == 0.5
    assert set(clean_metrics(metrics)) == {k for k, v in metrics.items() if v is not None}
