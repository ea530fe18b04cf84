"""Rank 0's decisions never strand a rank: real faults in storage, tracker and sampler.

Each study runs on two real stage processes. A fault inside rank 0's Optuna or tracker work
either fails the trial it hit (with the cause recorded) and the study goes on, or stops the
study on every rank with that error; it never kills a stage ("stage 0 died") and never
hangs. The pure part, `Leader.close`, is tested in-process.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import optuna
import pytest

from nas.errors import LeaderError
from nas.study.leader import Leader
from nas.study.run import run_study
from nas.study.trials import counted
from nas.tracking import read_jsonl
from nas.tracking.wandb.history import find_run_files, read_run
from tests.nas.harness.common import locked, offline_wandb, tiny_settings
from tests.nas.harness.faulty import SAMPLER, TRACKER, summaries

FAIL, COMPLETE = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_tracker_and_a_sampler_that_raise_fail_their_trial_and_the_study_goes_on(
    tmp_path: Path,
) -> None:
    tracking = tmp_path / "tracking"
    config = tiny_settings(
        tmp_path,
        "study.name=faults",
        "study.n_trials=4",
        f"tracker.name={TRACKER}",
        f"+tracker.options.directory={tracking}",
        "+tracker.options.trial=1",
        "+tracker.options.step=1",
        "sampler=random",
        f"sampler.name={SAMPLER}",
        "+sampler.options.trial=2",
    )
    result = run_study(config)
    assert (result.finished, result.restarts) == (4, 0)  # no stage died, nothing restarted
    trials = optuna.load_study(study_name="faults", storage=config.storage_url).trials
    assert [t.state for t in trials] == [COMPLETE, FAIL, FAIL, COMPLETE]
    assert all(counted(t) for t in trials)  # failed with a cause: they count
    # the tracker failed at step 1; the trial learned it at its first evaluation (step 3)
    assert "TrackerBug: log_step failed at step 1 of trial 1" in trials[1].user_attrs["fail_reason"]
    assert "SamplerBug: sample_independent failed" in trials[2].user_attrs["fail_reason"]
    ended = summaries(read_jsonl(tracking / "faults.jsonl"))  # trial 2 never began to train
    assert ended == {0: "complete", 1: "failed", 3: "complete"}


@pytest.mark.multiprocess
@pytest.mark.timeout(240)
def test_a_sampler_that_raises_in_ask_stops_the_study_on_every_rank_and_runs_finish(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    offline_wandb(monkeypatch, tmp_path)
    config = tiny_settings(
        tmp_path,
        "study.name=stop",
        "study.n_trials=4",
        "tracker=wandb",
        "sampler=random",
        f"sampler.name={SAMPLER}",
        "+sampler.options.trial=2",
        "+sampler.options.where=ask",
    )
    started = time.monotonic()
    with pytest.raises(LeaderError, match="could not ask for a trial: SamplerBug"):
        run_study(config)
    assert time.monotonic() - started < 120  # not a collective's 300 s timeout
    trials = optuna.load_study(study_name="stop", storage=config.storage_url).trials
    assert [t.state for t in trials[:2]] == [COMPLETE, COMPLETE]
    runs = [read_run(path) for path in find_run_files(tmp_path / "run" / "tracking")]
    assert sorted(run.name for run in runs) == ["stop-study", "stop-trial-0", "stop-trial-1"]
    assert all(run.exit_code is not None for run in runs)  # every W&B run was finished


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_locked_database_mid_study_is_a_recorded_error_not_a_dead_stage(
    tmp_path: Path,
) -> None:
    db = tmp_path / "locked.db"
    config = tiny_settings(
        tmp_path,
        "study.name=lock",
        "study.n_trials=3",
        "tracker=none",
        f"study.storage='sqlite:///{db}?timeout=1'",
    )
    lock_held = threading.Event()

    def lock_when_trial_1_trains() -> None:  # as another worker or a backup would
        while not _running(db, trial=1):
            time.sleep(0.05)
        with locked(db, release_after_s=8.0):
            lock_held.set()

    thread = threading.Thread(target=lock_when_trial_1_trains, daemon=True)
    thread.start()
    try:
        result = run_study(config)
    except LeaderError as error:  # the write that failed stopped the study on every rank
        assert "database is locked" in str(error)
    else:  # or the trial it hit failed with the cause and the study went on
        assert result.restarts == 0
        trials = optuna.load_study(study_name="lock", storage=config.storage_url).trials
        assert any("database is locked" in t.user_attrs.get("fail_reason", "") for t in trials)
    thread.join(timeout=60)
    assert lock_held.is_set()
    # nothing recorded is lost: the study resumes once the lock is gone
    assert run_study(config).finished == 3


def _running(db: Path, trial: int) -> bool:
    """Whether trial `trial` of the study in `db` is RUNNING (read without locking)."""
    import sqlite3

    if not db.exists():
        return False
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.1) as connection:
        try:
            rows = connection.execute(
                "SELECT state FROM trials WHERE number = ?", (trial,)
            ).fetchall()
        except sqlite3.OperationalError:  # tables not created yet
            return False
    return bool(rows) and rows[0][0] == "RUNNING"


def test_closing_never_replaces_the_first_error_and_finishes_the_tracker(tmp_path: Path) -> None:
    tracking = tmp_path / "tracking"
    config = tiny_settings(
        tmp_path,
        "study.name=close",
        f"tracker.name={TRACKER}",
        f"+tracker.options.directory={tracking}",
        "+tracker.options.fail_end_study=true",
    )
    Path(config.studies_dir).mkdir(parents=True)
    leader = Leader(config, owner="test:1")
    first = LeaderError("ask for a trial", "SamplerBug: the first error")
    end = leader.close(first)  # end_study raises: kept beside the first error, not over it
    assert end.close_errors and "TrackerBug: end_study failed" in end.close_errors[0]
    assert any("TrackerBug: end_study failed" in note for note in first.__notes__)
    records = read_jsonl(tracking / "close.jsonl")
    assert [r["kind"] for r in records] == ["study_start", "study_end"]
    assert leader.close() is end  # twice: nothing more to do, nothing raised
