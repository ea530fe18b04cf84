"""One contract over every built-in tracker (as Optuna tests every storage): the study loop's
calls in order (an exported model logged in a trial, the trial's run id), a crash's (a trial
left open), and calls out of order or malformed refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nas.tracking import TRACKERS, Tracker, TrialEnd, make_tracker
from nas.tracking.base import LifecycleTracker
from pipeline import PipelineEvent
from tests.nas.harness.common import offline_wandb


def _tracker(name: str, tmp_path: Path) -> Tracker:
    options: dict[str, dict[str, Any]] = {
        "none": {},
        "jsonl": {"directory": tmp_path / "jsonl"},
        "wandb": {"directory": tmp_path / "wandb", "mode": "offline"},
    }
    return make_tracker(name, **options[name])


@pytest.mark.parametrize("name", TRACKERS)
def test_every_tracker_takes_a_study_and_a_crash_in_it(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline_wandb(monkeypatch, tmp_path)
    event = PipelineEvent(0, 1, "build", {"sizes": [2, 2], "plan": None}).to_dict()
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"seed": 0}')
    ids: list[str | None] = []
    with _tracker(name, tmp_path) as tracker:
        tracker.start_study("contract", {"train": {"steps": 2}})
        for number, state in enumerate(TrialEnd):
            tracker.start_trial(number, {"d_model": 32}, {"architecture": "{}"})
            ids.append(tracker.run_id)
            tracker.log_step(1, {"loss": 2.0, "validation_loss": None})
            tracker.log_event(1, event)
            tracker.log_step(2, {"loss": float("nan")})
            tracker.log_model(f"contract-model-{number}", folder, {"trial": number, "seed": 0})
            failed = state is TrialEnd.FAILED
            tracker.end_trial(state, {"validation_loss": 1.5}, "boom" if failed else None)
        assert tracker.run_id is None  # outside a trial
        tracker.end_study([{"number": 0, "validation_loss": 1.5}], [], {"best": 1.5})
    tracker.close()  # idempotent
    if name == "none":
        assert ids == [None] * len(TrialEnd)
    else:  # one id per run, each a different one
        assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids)

    crashed = _tracker(name, tmp_path / "crash")
    crashed.start_study("crash", {})
    crashed.start_trial(0, {}, {})
    crashed.log_step(1, {"loss": 1.0})
    crashed.close()  # the open trial is ended as failed, nothing raises


@pytest.mark.parametrize("name", [n for n in TRACKERS if n != "none"])
def test_calls_out_of_order_are_refused_naming_the_tracker(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline_wandb(monkeypatch, tmp_path)
    with _tracker(name, tmp_path) as tracker:
        assert isinstance(tracker, LifecycleTracker)
        kind = type(tracker).__name__
        with pytest.raises(RuntimeError, match=f"{kind}: log_step outside a trial"):
            tracker.log_step(1, {"loss": 1.0})
        with pytest.raises(RuntimeError, match=f"{kind}: log_model outside a trial"):
            tracker.log_model("m", tmp_path, {})
        tracker.start_study("order", {})
        tracker.start_trial(0, {}, {})
        with pytest.raises(ValueError, match="unknown trial state 'running'"):
            tracker.end_trial("running", {})
        with pytest.raises(ValueError, match="got 'a/b' \\(artifact_name makes one\\)"):
            tracker.log_model("a/b", tmp_path, {})
        with pytest.raises(NotADirectoryError, match="missing is not one"):
            tracker.log_model("m", tmp_path / "missing", {})
        tracker.end_trial("FAIL", {}, "an Optuna state name is taken")
