"""A trial whose worker dies is retried, at most `study.max_retries` times, and the study
goes on: real stage processes killed (`os._exit`) in their loss, a journal-file study read
back by the report."""

from __future__ import annotations

import io
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from nas.report import report_study
from nas.storage.opening import ATTEMPT, dashboard_target, make_storage
from nas.study.run import run_study
from nas.study.trials import counted
from tests.nas.harness.common import tiny_settings
from tests.nas.harness.faulty import DYING_TASK

FAIL, COMPLETE = optuna.trial.TrialState.FAIL, optuna.trial.TrialState.COMPLETE


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_an_architecture_that_kills_its_worker_ends_failed_after_two_retries(
    tmp_path: Path,
) -> None:
    markers = tmp_path / "deaths"
    markers.mkdir()
    journal = tmp_path / "studies" / "dies.log"
    settings = tiny_settings(
        tmp_path,
        "study.name=dies",
        "study.n_trials=1",
        "study.enqueue_seeds=false",  # the first trial samples; its retries come next
        f"study.storage=journal://{journal}",
        "tracker=none",
        "task=charlm",
        f"task.name={DYING_TASK}",
        "task.options.seq_len=16",
        f"+task.options.marker_dir={markers}",
    )
    result = run_study(settings)  # three deaths, then a trial that trains
    assert result.finished == 1
    assert result.restarts == 2  # the third death retried nothing: it did not count
    study = optuna.load_study(study_name="dies", storage=make_storage(settings.storage_url))
    assert study.metric_names == ["validation_loss"]  # what optuna-dashboard shows
    trials = study.trials
    dead = [t for t in trials if t.state == FAIL]
    assert [t.user_attrs.get(ATTEMPT, 0) for t in dead] == [0, 1, 2]
    assert all(t.params == dead[0].params for t in dead)  # the same architecture each time
    assert [t.user_attrs.get("retry_of") for t in dead] == [None, dead[0].number, dead[1].number]
    assert all("died" in t.user_attrs["fail_reason"] for t in dead)
    assert "retried 2 times: not again" in dead[-1].user_attrs["fail_reason"]
    assert not any(counted(t) for t in dead)
    assert [t.state for t in trials if counted(t)] == [COMPLETE]
    assert not [t for t in trials if t.state == optuna.trial.TrialState.WAITING]

    out = io.StringIO()
    report_study(settings, result, console=Console(file=out, width=200))
    assert f"optuna-dashboard {journal}" in out.getvalue()  # the file, as the dashboard takes it
    assert dashboard_target(f"journal://{journal}") == str(journal)
