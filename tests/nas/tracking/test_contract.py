"""One contract over every tracker of the registry (`nas.tracking.TRACKERS`) and over the
composite that fans out to all of them (as Optuna tests every storage): the study loop's
calls in order (an exported model logged in a trial, the trial's run id), a crash's (a trial
left open), and calls out of order or malformed refused by name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from nas.tracking import TRACKERS, CompositeTracker, Tracker, TrialEnd, make_tracker
from nas.tracking.lifecycle import LifecycleTracker
from pipeline import PipelineEvent
from tests.nas.harness.common import offline_wandb

COMPOSITE = "composite"  # every registered tracker at once, through `CompositeTracker`
KINDS = (*TRACKERS, COMPOSITE)


def _registered(name: str, folder: Path) -> Tracker:
    """The registered tracker `name`, writing under `folder` where it writes at all."""
    if not TRACKERS.takes(name, "directory"):
        return make_tracker(name)
    return make_tracker(name, directory=folder / name)


def _tracker(kind: str, folder: Path) -> Tracker:
    if kind == COMPOSITE:
        return CompositeTracker([_registered(name, folder) for name in TRACKERS])
    return _registered(kind, folder)


def _checked(tracker: Tracker) -> LifecycleTracker:
    """The tracker whose checks a call out of order meets first: itself, or a composite's
    first tracker that checks the lifecycle."""
    if isinstance(tracker, CompositeTracker):
        return next(t for t in tracker.trackers if isinstance(t, LifecycleTracker))
    assert isinstance(tracker, LifecycleTracker)
    return tracker


@pytest.mark.parametrize("kind", KINDS)
def test_every_tracker_takes_a_study_and_a_crash_in_it(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline_wandb(monkeypatch, tmp_path)
    event = PipelineEvent(0, 1, "build", {"sizes": [2, 2], "plan": None}).to_dict()
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "metrics.json").write_text('{"seed": 0}')
    ids: list[str | None] = []
    with _tracker(kind, tmp_path) as tracker:
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
    if kind == "none":
        assert ids == [None] * len(TrialEnd)
    else:  # one id per run, each a different one
        assert all(isinstance(i, str) and i for i in ids) and len(set(ids)) == len(ids)

    crashed = _tracker(kind, tmp_path / "crash")
    crashed.start_study("crash", {})
    crashed.start_trial(0, {}, {})
    crashed.log_step(1, {"loss": 1.0})
    crashed.close()  # the open trial is ended as failed, nothing raises


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "none"])
def test_calls_out_of_order_are_refused_naming_the_tracker(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline_wandb(monkeypatch, tmp_path)
    with _tracker(kind, tmp_path) as tracker:
        named = type(_checked(tracker)).__name__
        with pytest.raises(RuntimeError, match=f"{named}: log_step outside a trial"):
            tracker.log_step(1, {"loss": 1.0})
        with pytest.raises(RuntimeError, match=f"{named}: log_model outside a trial"):
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


@pytest.mark.parametrize("name", list(TRACKERS))
def test_what_a_tracker_preloads_exists(name: str) -> None:
    """`Tracker.preload` names modules (the stage processes' server imports them): each one
    is found by name (its parents imported, not itself)."""
    preload = TRACKERS[name].preload
    assert isinstance(preload, tuple) and all(isinstance(m, str) for m in preload)
    assert all(importlib.util.find_spec(module) is not None for module in preload), preload
