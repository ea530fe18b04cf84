"""`RetryingStorage`: a server storage's calls wait out an outage, and every call of
Optuna's storage interface goes through that wait.

The outage is Optuna's in-memory storage failing as a stopped server does (the real server
is stopped in test_server_storage.py).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from typing import Any

import optuna
import pytest
import sqlalchemy.exc
from optuna.storages import BaseStorage, InMemoryStorage
from optuna.trial import TrialState

from nas.search.records import trial_id
from nas.storage.retrying import RETRIED, RetryingStorage, StorageUnavailableError


class FlakyStorage(InMemoryStorage):
    """Optuna's in-memory storage whose calls fail as a database server's do while it is
    down: each call raises `error` while `down` is set; `lose_reply` makes the next trial
    state change commit, then fail as a dropped connection does."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False
        self.lose_reply = False
        self.error: Exception = sqlalchemy.exc.OperationalError(
            "SELECT 1", {}, Exception("connection refused")
        )

    def get_all_trials(self, *args: Any, **kwargs: Any) -> list[optuna.trial.FrozenTrial]:
        if self.down:
            raise self.error
        return super().get_all_trials(*args, **kwargs)

    def set_trial_state_values(self, *args: Any, **kwargs: Any) -> bool:
        done = super().set_trial_state_values(*args, **kwargs)
        if self.lose_reply:
            self.lose_reply = False
            raise self.error
        return done


def _flaky(wait_s: float) -> tuple[FlakyStorage, RetryingStorage]:
    inner = FlakyStorage()
    name = "postgresql://nas:***@db/postgres"
    # mypy sees the class before its class decorator gives it the abstract methods
    return inner, RetryingStorage(inner, name, wait_s)  # type: ignore[abstract]


def test_every_call_of_the_storage_interface_is_retried_or_answered_by_the_inner_one() -> None:
    """Optuna's public storage methods and the heartbeat's database calls wait out an
    outage, with Optuna's signatures; the few defined by hand do not reach the database."""
    public = {n for n, f in vars(BaseStorage).items() if inspect.isfunction(f) and n[0] != "_"}
    by_hand = {"remove_session", "check_trial_is_updatable"}
    assert set(RETRIED) == (public - by_hand) | {"record_heartbeat", "_get_stale_trial_ids"}
    for name in RETRIED:
        method = getattr(RetryingStorage, name)
        assert inspect.signature(method) == inspect.signature(method.__wrapped__), name
    assert not RetryingStorage.__abstractmethods__
    _, wrapped = _flaky(wait_s=1)
    assert isinstance(wrapped, BaseStorage) and wrapped.get_heartbeat_interval() is None


def test_an_outage_shorter_than_the_wait_is_waited_out_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inner, wrapped = _flaky(wait_s=30)
    study = optuna.create_study(storage=wrapped)
    heard: list[str | None] = []
    wrapped.on_wait = heard.append
    inner.down = True
    threading.Timer(1.2, lambda: setattr(inner, "down", False)).start()  # back after 1.2 s
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="nas.storage.opening"):
        assert study.trials == []
    assert 1.0 < time.monotonic() - started < 5
    said = [r.getMessage() for r in caplog.records if r.name == "nas.storage.opening"]
    assert said[0].startswith("storage postgresql://nas:***@db/postgres unreachable")
    assert "connection refused" in said[0] and "study.storage_wait_s" in said[0]
    assert said[-1].startswith("storage postgresql://nas:***@db/postgres reachable again")
    assert heard[0] is not None and heard[-1] is None  # rank 0's progress bar hears it too


def test_an_outage_longer_than_the_wait_ends_in_an_error_naming_the_storage() -> None:
    inner, wrapped = _flaky(wait_s=1)
    study = optuna.create_study(storage=wrapped)
    inner.down = True
    started = time.monotonic()
    with pytest.raises(StorageUnavailableError, match=r"postgresql://nas:\*\*\*@db/postgres "):
        study.get_trials()
    assert 0.9 < time.monotonic() - started < 3
    started = time.monotonic()
    with pytest.raises(StorageUnavailableError):  # given up: the next call tries once
        study.get_trials()
    assert time.monotonic() - started < 0.5
    inner.down = False
    assert study.trials == []  # back: calls work (and would wait) again


def test_an_error_no_wait_mends_is_raised_at_once() -> None:
    inner, wrapped = _flaky(wait_s=30)
    study = optuna.create_study(storage=wrapped)
    inner.error = sqlalchemy.exc.OperationalError(
        "SELECT 1", {}, Exception('password authentication failed for user "nas"')
    )
    inner.down = True
    started = time.monotonic()
    with pytest.raises(sqlalchemy.exc.OperationalError, match="authentication failed"):
        study.get_trials()
    assert time.monotonic() - started < 0.5


def test_a_finished_trial_whose_reply_was_lost_is_told_once() -> None:
    inner, wrapped = _flaky(wait_s=30)
    study = optuna.create_study(storage=wrapped)
    trial = study.ask()
    inner.lose_reply = True  # committed, then the connection dropped: told again
    study.tell(trial, 1.0)
    assert [(t.state, t.value) for t in study.trials] == [(TrialState.COMPLETE, 1.0)]
    stale = study.ask()  # as Optuna fails a stale trial: its state passed by name
    inner.lose_reply = True
    assert wrapped.set_trial_state_values(trial_id(stale), state=TrialState.FAIL)
    assert study.trials[-1].state == TrialState.FAIL
