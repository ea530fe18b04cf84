"""The JSON-lines mirror: one file per study, one strict-JSON record per call, each on disk
as soon as the call returns; misuse of the lifecycle is an error."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nas.tracking import JsonlTracker, read_jsonl
from nas.tracking.jsonl import study_file_name


def test_records_in_order_with_their_fields(tmp_path: Path) -> None:
    tracker = JsonlTracker(tmp_path / "runs")
    tracker.start_study("study/one", {"shape": (2, 3)})
    assert tracker.path == tmp_path / "runs" / "study_one.jsonl"
    tracker.start_trial(4, {"d_model": 64}, {"architecture": {"layers": ("a", "b")}})
    tracker.log_step(1, {"loss": 2.5, "validation": None, "tokens_per_s": 100})
    tracker.log_step(2, {"loss": math.nan, "tokens_per_s": math.inf})
    tracker.log_event(
        2, {"generation": 0, "step": 2, "kind": "migration", "details": {"moved": (("b", 0, 1),)}}
    )
    tracker.end_trial("pruned", {"loss": 2.0})
    tracker.end_study([{"number": 4, "state": "pruned"}], [], {"best": math.nan})
    tracker.close()

    assert tracker.path is not None
    lines = tracker.path.read_text().splitlines()
    for line in lines:  # strict JSON, no NaN
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    records = read_jsonl(tracker.path)
    assert [r["kind"] for r in records] == [
        "study_start",
        "trial_start",
        "step",
        "step",
        "event",
        "trial_end",
        "study_end",
    ]
    assert all(r["study"] == "study/one" and isinstance(r["time"], float) for r in records)
    assert [list(r)[:2] for r in records] == [["kind", "study"]] * len(records)
    start, trial, step1, step2, event, end, study_end = records
    assert start["config"] == {"shape": [2, 3]}
    assert trial["trial"] == 4 and trial["params"] == {"d_model": 64}
    assert trial["config"] == {"architecture": {"layers": ["a", "b"]}}
    assert step1["trial"] == 4 and step1["step"] == 1
    assert step1["metrics"] == {"loss": 2.5, "tokens_per_s": 100}  # None: not measured
    assert step2["metrics"] == {"loss": None, "tokens_per_s": None}  # non-finite
    assert event["step"] == 2 and event["event"]["details"] == {"moved": [["b", 0, 1]]}
    assert (end["state"], end["error"], end["summary"]) == ("pruned", None, {"loss": 2.0})
    assert study_end["trials"] == [{"number": 4, "state": "pruned"}]
    assert study_end["pareto_front"] == [] and study_end["summary"] == {"best": None}


def test_each_record_is_on_disk_when_the_call_returns(tmp_path: Path) -> None:
    tracker = JsonlTracker(tmp_path)
    tracker.start_study("s", {})
    tracker.start_trial(0, {}, {})
    assert tracker.path is not None
    for step in range(3):
        tracker.log_step(step, {"loss": 1.0 / (step + 1)})
        assert read_jsonl(tracker.path)[-1]["step"] == step  # read while still open
    tracker.close()


def test_close_fails_an_open_trial_and_resuming_appends(tmp_path: Path) -> None:
    with JsonlTracker(tmp_path) as tracker:
        tracker.start_study("s", {})
        tracker.start_trial(0, {}, {})
    tracker.close()  # twice is fine
    again = JsonlTracker(tmp_path)
    again.start_study("s", {"resumed": True})
    again.close()
    records = read_jsonl(tmp_path / "s.jsonl")
    assert [r["kind"] for r in records] == [
        "study_start",
        "trial_start",
        "trial_end",
        "study_start",
    ]
    assert records[2]["state"] == "failed" and "closed before" in records[2]["error"]


def test_an_unfinished_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    path.write_text('{"kind": "study_start"}\n{"kind": "st')
    assert read_jsonl(path) == [{"kind": "study_start"}]
    path.write_text('{"kind": "st\n{"kind": "study_start"}\n')
    with pytest.raises(json.JSONDecodeError):
        read_jsonl(path)  # corruption in the middle is not hidden


def test_lifecycle_misuse_is_an_error(tmp_path: Path) -> None:
    tracker = JsonlTracker(tmp_path)
    with pytest.raises(RuntimeError, match="before start_study"):
        tracker.start_trial(0, {}, {})
    tracker.start_study("s", {})
    with pytest.raises(RuntimeError, match="still running"):
        tracker.start_study("t", {})
    with pytest.raises(RuntimeError, match="outside a trial"):
        tracker.log_step(0, {"loss": 1.0})
    tracker.start_trial(0, {}, {})
    with pytest.raises(RuntimeError, match="has not ended"):
        tracker.start_trial(1, {}, {})
    with pytest.raises(ValueError, match="valid states"):
        tracker.end_trial("done", {})
    with pytest.raises(RuntimeError, match="trial 0 is open"):
        tracker.end_study([], [], {})
    tracker.end_trial("COMPLETE", {})  # Optuna's name is taken, written as ours
    assert tracker.path is not None and read_jsonl(tracker.path)[-1]["state"] == "complete"
    tracker.close()
    with pytest.raises(RuntimeError, match="after close"):
        tracker.start_study("s", {})


def test_study_file_names() -> None:
    assert study_file_name("nas-charlm_v1.2") == "nas-charlm_v1.2.jsonl"
    assert study_file_name(" a b/c ") == "a_b_c.jsonl"
    with pytest.raises(ValueError, match="non-empty"):
        study_file_name(" ")
