"""The W&B tracker where a study does not end well, or W&B is told not to run: an open
trial and an unfinished study closed, online mode without credentials, disabled mode, and
W&B's service process killed mid-trial. Sealed as the offline session is
(`tests.nas.tracking.common.seal_wandb`): no network, no service left after `close`.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nas.tracking.wandb import WandbTracker, read_run
from pipeline.distributed import procfs
from tests.nas.tracking.common import (
    child_wandb_pids,
    child_wandb_processes,
    model_folder,
    seal_wandb,
)

pytest.importorskip("wandb")


@pytest.fixture
def sealed_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """W&B confined to tmp_path and offline; yields the list of Python-side connection
    attempts to network addresses."""
    yield seal_wandb(monkeypatch, tmp_path)
    assert not child_wandb_processes()


@pytest.mark.timeout(120)
def test_close_fails_an_open_trial_and_an_unfinished_study(
    tmp_path: Path, sealed_wandb: list[Any]
) -> None:
    tracker = WandbTracker("elastic-nas-test", directory=tmp_path)
    with tracker:
        tracker.start_study("crashed", {})
        tracker.start_trial(7, {}, {})
        tracker.log_step(0, {"loss": 1.0})
    assert not sealed_wandb
    trial = read_run(tracker.trial_directories[7])
    assert trial.exit_code == 1 and trial.summary["state"] == "failed"
    assert "closed before" in trial.summary["error"]
    assert tracker.study_directory is not None
    study = read_run(tracker.study_directory)
    assert study.exit_code == 1  # the study never ended
    assert study.metrics() == [
        {
            "_step": 1,
            "trials/complete": 0,
            "trials/pruned": 0,
            "trials/failed": 1,
            "trials/ended": 1,
        }
    ]
    with pytest.raises(RuntimeError, match="after close"):
        tracker.start_study("again", {})


@pytest.mark.timeout(60)
def test_online_without_credentials_raises_instead_of_prompting(
    tmp_path: Path, sealed_wandb: list[Any]
) -> None:
    tracker = WandbTracker("elastic-nas-test", mode="online", directory=tmp_path)
    with pytest.raises(RuntimeError, match="WANDB_API_KEY"):
        tracker.start_study("s", {})
    tracker.close()
    assert not sealed_wandb and not tracker.run_directories


@pytest.mark.timeout(60)
def test_disabled_mode_writes_nothing(tmp_path: Path, sealed_wandb: list[Any]) -> None:
    tracker = WandbTracker("elastic-nas-test", mode="disabled", directory=tmp_path / "d")
    tracker.start_study("s", {})
    tracker.start_trial(0, {}, {})
    tracker.log_step(0, {"loss": 1.0})
    tracker.log_event(0, {"kind": "build"})
    tracker.log_model("m", model_folder(tmp_path / "model"), {"seed": 0})
    tracker.end_trial("complete", {"loss": 1.0})
    tracker.end_study([{"a": 1}], [], {"objectives": ["a", "b"]})
    tracker.close()
    assert tracker.run_directories == [] and not (tmp_path / "d" / "wandb").exists()


@pytest.mark.timeout(120)
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds W&B's service in Linux's /proc")
def test_a_killed_service_ends_its_runs_and_the_next_trial_starts_a_new_one(
    tmp_path: Path, sealed_wandb: list[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """W&B's service process killed mid-trial (as the soak's stage kills once did, or an
    out-of-memory killer would): no call raises, the next trial's run and the study run
    start on a new service and are whole on disk (issue 53)."""
    tracker = WandbTracker("elastic-nas-test", directory=tmp_path)
    with tracker:
        tracker.start_study("survives", {"n_trials": 2})
        tracker.start_trial(0, {}, {})
        tracker.log_step(1, {"loss": 1.0})
        services = child_wandb_pids()
        assert services, "no W&B service process under this one"
        for pid in services:
            os.kill(pid, signal.SIGKILL)
        while any(procfs.running(pid) for pid in services):
            time.sleep(0.01)
        tracker.log_step(2, {"loss": 0.9})  # the service is found gone here
        tracker.end_trial("complete", {"loss": 0.9})
        tracker.start_trial(1, {}, {})
        tracker.log_step(1, {"loss": 0.8})
        tracker.end_trial("complete", {"loss": 0.8})
        tracker.end_study([{"number": 0}, {"number": 1}], [], {"objectives": ["loss"]})
    assert "W&B's service process is gone" in caplog.text
    trial = read_run(tracker.trial_directories[1])
    assert trial.exit_code == 0 and trial.metrics() == [{"_step": 1, "loss": 0.8}]
    assert (
        tracker.study_directory is not None
        and tracker.study_directory != (tracker.run_directories[0])
    )  # the study run started again
    study = read_run(tracker.study_directory)
    assert study.exit_code == 0 and study.metrics()[-1]["trials/ended"] == 2
    assert read_run(tracker.trial_directories[0]).exit_code is None  # ended with its service
