"""`python -m nas` interrupted as studies are on shared machines: killed in a top-rung
trial and run again (it resumes with every rung it completed), and paused beside a peer
harness on one SQLite study (the peer leaves its running trial alone, and together they
finish the study)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from nas.study.trials import INTERRUPTED, OWNER, counted
from tests.nas.harness.common import SMALL, locked, run

pytestmark = pytest.mark.multiprocess


def test_a_study_killed_in_a_top_rung_trial_resumes_with_every_completed_rung(
    tmp_path: Path,
) -> None:
    """Hurdles at 5 and 10 steps, the top rung at 30, a checkpoint every 5 steps: SIGKILL
    the harness (and its stage processes) while a trial trains past its last hurdle, once a
    trial is complete. The re-run keeps every rung already recorded (the killed trial's too,
    on its failed record), asks the killed architecture again, which goes on from the
    killed attempt's last checkpoint with its rungs reported again, and finishes the rest of
    the trials, no more; no checkpoint is left."""
    overrides = [
        "study.name=rungs",
        "study.n_trials=3",
        "study.workers=1",  # one trial in flight when it is killed
        "stages=[search]",
        "tracker=none",
        "pruner=pdh",
        "pruner.options.budgets=[5,10,30]",
        "pruner.options.min_trials=2",
        "train.steps=30",
        "train.eval_every=5",
        "study.checkpoint_every=5",
        "train.eval_batches=1",
        "train.decode_pairs=0",
        "train.final_decode_pairs=4",
        "train.batch_size=16",
        "search_space.d_model=[32]",
        "search_space.max_cells=1",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"studies_dir={tmp_path / 'studies'}",
    ]
    db = tmp_path / "studies" / "rungs.db"
    harness = subprocess.Popen(
        [sys.executable, "-m", "nas", *overrides],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not _in_top_rung(db, after_complete=1, rung=10):
        assert harness.poll() is None, "the harness stopped before it was killed"
        time.sleep(0.1)
    os.killpg(harness.pid, signal.SIGKILL)
    harness.wait()
    storage = f"sqlite:///{db}"
    before = optuna.load_study(study_name="rungs", storage=storage).trials
    killed = [t for t in before if t.state == optuna.trial.TrialState.RUNNING]
    assert len(killed) == 1 and 10 in killed[0].intermediate_values
    assert run(tmp_path, *overrides[:-2]).returncode == 0
    after = optuna.load_study(study_name="rungs", storage=storage).trials
    for old in before:  # every rung recorded before the kill is still there, unchanged
        assert after[old.number].intermediate_values == old.intermediate_values
    interrupted = after[killed[0].number]
    assert interrupted.state == optuna.trial.TrialState.FAIL
    assert interrupted.user_attrs.get(INTERRUPTED)
    again = [t for t in after[len(before) :] if t.params == interrupted.params]
    assert again and again[0].state != optuna.trial.TrialState.RUNNING
    assert "left running" in interrupted.user_attrs["fail_reason"]
    resumed = again[0].user_attrs["resumed_at_step"]  # step 5's checkpoint at least
    assert resumed in (5, 10, 15, 20, 25)
    replayed = {s: v for s, v in interrupted.intermediate_values.items() if s <= resumed}
    shared = {s: v for s, v in again[0].intermediate_values.items() if s in replayed}
    assert 5 in shared and shared == {s: replayed[s] for s in shared}  # a hurdle may stop it
    assert not any((tmp_path / "studies" / "checkpoints").glob("*/trial-*"))
    assert sum(map(counted, after)) == 3
    assert not any(t.state == optuna.trial.TrialState.RUNNING for t in after)


def test_two_workers_share_one_study(tmp_path: Path) -> None:
    """Two harnesses (each with its own stage processes) on one SQLite study: together they
    finish it, and neither fails the other's running trials as orphans.

    Both start at once. The one that asks the first trial is paused (SIGSTOP, its stage
    processes too) while the test holds the database's write lock, so it is paused between
    two of its writes, never inside one, and resumed once the other has finished: the other
    must leave the paused trial alone and stop when it and its peer's trial make the
    study's 3. Unpaused, the harness that started first could finish all 3 before the other
    asked one."""
    overrides = [
        "study.name=shared",
        "study.n_trials=3",
        "study.workers=1",  # each harness one worker (study.workers=N: the next test)
        "study.heartbeat_grace_s=600",  # a paused harness beats no heart: it is not dead
        "stages=[search]",
        "tracker=none",
        "train.steps=2",
        *SMALL,
        "train.eval_every=2",
        f"studies_dir={tmp_path / 'studies'}",
    ]
    db = tmp_path / "studies" / "shared.db"
    db.parent.mkdir()
    url = f"sqlite:///{db}"
    optuna.create_study(study_name="shared", storage=url)  # created once, before both start
    harnesses = {
        popen.pid: popen  # each leads its own process group: paused with its stage processes
        for popen in (
            subprocess.Popen(
                [sys.executable, "-m", "nas", *overrides, f"hydra.run.dir={tmp_path / f'run{i}'}"],
                cwd=tmp_path,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
            for i in range(2)
        )
    }
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and (owner := _first_owner(db)) is None:
        assert all(h.poll() is None for h in harnesses.values()), "a harness stopped early"
        time.sleep(0.05)
    assert owner is not None, "no harness asked a trial within 240 s"
    with locked(db):
        paused = harnesses.pop(os.getpgid(owner))
        os.killpg(paused.pid, signal.SIGSTOP)
    try:
        [other] = harnesses.values()
        _, err = other.communicate(timeout=600)
        assert other.returncode == 0, err[-3000:]
    finally:
        os.killpg(paused.pid, signal.SIGCONT)
    _, err = paused.communicate(timeout=600)
    assert paused.returncode == 0, err[-3000:]
    trials = optuna.load_study(study_name="shared", storage=url).trials
    assert sum(map(counted, trials)) == 3  # each stops once 3 are done or in a peer's hands
    assert not any(t.user_attrs.get(INTERRUPTED) for t in trials)
    assert not any(t.state == optuna.trial.TrialState.RUNNING for t in trials)
    assert len({t.user_attrs[OWNER] for t in trials if counted(t)}) == 2


def _first_owner(db: Path) -> int | None:
    """The pid of the process that asked a RUNNING trial, once one has recorded its owner."""
    found = _read_only(
        db,
        "SELECT value_json FROM trials JOIN trial_user_attributes USING (trial_id) "
        "WHERE trials.state = 'RUNNING' AND key = ? ORDER BY trial_id LIMIT 1",
        (OWNER,),
    )
    return None if found is None else int(json.loads(found[0]).rpartition(":")[2])


def _in_top_rung(db: Path, *, after_complete: int, rung: int) -> bool:
    """Some trial is complete, and a running one has recorded its value at `rung` (it now
    trains toward the top rung)."""
    done = _read_only(db, "SELECT COUNT(*) FROM trials WHERE state = 'COMPLETE'")
    running = _read_only(
        db,
        "SELECT COUNT(*) FROM trials JOIN trial_intermediate_values USING (trial_id) "
        "WHERE trials.state = 'RUNNING' AND trial_intermediate_values.step = ?",
        (rung,),
    )
    return done is not None and done[0] >= after_complete and bool(running and running[0])


def _read_only(db: Path, query: str, parameters: tuple[object, ...] = ()) -> tuple[Any, ...] | None:
    """The first row `query` finds in the study's SQLite file, read-only (never creates the
    storage's tables under Optuna); None where there is no row, file or table yet."""
    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
            row: tuple[Any, ...] | None = connection.execute(query, parameters).fetchone()
            return row
    except sqlite3.Error:  # tables not created yet
        return None
