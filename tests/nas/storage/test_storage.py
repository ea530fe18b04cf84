"""Storages and orphaned trials: which RUNNING trials a (re)started harness, or a worker
before each trial it asks, may fail (each once, however many check at once); URLs; how a
server storage's calls wait out an outage.

Real Optuna storages (SQLite and a journal file), real processes and rank 0's `Leader`; no
stage processes.
The outage is Optuna's in-memory storage failing as a stopped server does (the real server
is stopped in test_server_storage.py).
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy.exc
from optuna.storages import InMemoryStorage, RDBStorage

from nas import storage
from nas.errors import HeartbeatError
from nas.search.records import StudyRecords, trial_id
from nas.storage.retrying import RetryingStorage, StorageUnavailableError
from nas.storage.url import StorageKind, kind, masked, without_password
from nas.study.leader import Leader, TrialOrder
from nas.study.trials import DUPLICATE_OF, INTERRUPTED, OWNER, counted, fail_running
from tests.nas.harness.common import composed, locked, tiny_settings

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


def _study(url: str, **kwargs: int) -> optuna.Study:
    return optuna.create_study(
        study_name="s", storage=storage.make_storage(url, **kwargs), load_if_exists=True
    )


def _url(tmp_path: Path, scheme: str) -> str:
    """A new study file under `tmp_path`: SQLite or a journal file."""
    if scheme == "sqlite":
        return f"sqlite:///{tmp_path / 's.db'}"
    return f"journal://{tmp_path / 's.log'}"


def _dead_owner() -> str:
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return f"{socket.gethostname()}:{child.stdout.strip()}"  # exited: its pid is free


@pytest.mark.parametrize("scheme", ["sqlite", "journal"])
def test_only_orphaned_trials_are_failed_and_asked_again(tmp_path: Path, scheme: str) -> None:
    study = _study(_url(tmp_path, scheme))
    orphan, live, remote, mine = (
        study.ask({"x": optuna.distributions.FloatDistribution(0, 1)}) for _ in range(4)
    )
    orphan.set_user_attr(OWNER, _dead_owner())
    live.set_user_attr(OWNER, storage.this_owner())  # another worker, alive
    remote.set_user_attr(OWNER, "another-machine:1")  # unknown: left to its heartbeat
    mine.set_user_attr(OWNER, "me:7")
    fail_running(study, "left running")  # a harness starting: orphans only
    states = {t.number: t.state for t in study.get_trials()}
    assert states[orphan.number] == optuna.trial.TrialState.FAIL
    assert {states[t.number] for t in (live, remote, mine)} == {optuna.trial.TrialState.RUNNING}
    fail_running(study, "stage 1 died", owner="me:7")  # after its own stage processes died
    trials = study.get_trials()
    assert trials[mine.number].state == optuna.trial.TrialState.FAIL
    assert trials[live.number].state == optuna.trial.TrialState.RUNNING
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    assert all(t.user_attrs[INTERRUPTED] and not counted(t) for t in failed)
    retries = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert sorted(t.user_attrs["retry_of"] for t in retries) == [orphan.number, mine.number]
    assert [t.system_attrs["fixed_params"] for t in retries] == [orphan.params, mine.params]


def test_a_trial_whose_heartbeat_stops_is_failed_uncounted_and_asked_again(
    tmp_path: Path,
) -> None:
    study = _study(f"sqlite:///{tmp_path / 's.db'}", heartbeat_s=1, grace_s=1)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    trial.set_user_attr(OWNER, "another-machine:1")
    beat = storage.Heartbeat(study, trial)
    beat.start()
    time.sleep(2.5)
    fail_running(study, "left running")  # still beating: alive
    assert study.get_trials()[0].state == optuna.trial.TrialState.RUNNING
    beat.stop()  # the worker "dies"
    time.sleep(2.5)
    fail_running(study, "left running")
    stale, retry = study.get_trials()
    assert stale.state == optuna.trial.TrialState.FAIL and not counted(stale)
    assert retry.state == optuna.trial.TrialState.WAITING
    assert retry.user_attrs["retry_of"] == stale.number
    assert retry.system_attrs["fixed_params"] == stale.params


@pytest.mark.parametrize(
    "url,message",
    [
        ("outputs/x.db", "not a storage URL; valid: sqlite:///path.db"),
        ("journal://", "names no file"),
        ("grpc://proxy-host", "use grpc://host:port"),
        ("postgres ql://u:secret@h/db", r"study.storage='postgres ql://u:\*\*\*@h/db'"),
    ],
)
def test_a_bad_storage_url_says_what_is_valid(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        storage.make_storage(url)
    with pytest.raises(ValueError, match=message):  # refused when the settings are read
        composed(f"study.storage={url}")


def test_storage_wait_s_is_checked() -> None:
    assert composed("study.storage_wait_s=5").study.storage_wait_s == 5
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ValueError, match=rf"study.storage_wait_s={bad}.* is not valid"):
            composed(f"study.storage_wait_s={bad}")


def test_heartbeat_grace_s_is_checked_and_sets_the_beat(tmp_path: Path) -> None:
    assert composed("study.heartbeat_grace_s=3").study.heartbeat_grace_s == 3
    for bad in ("1", "0", "-30"):
        with pytest.raises(ValueError, match=rf"study.heartbeat_grace_s={bad} is not valid"):
            composed(f"study.heartbeat_grace_s={bad}")
    assert [storage.heartbeat_every(g) for g in (30, 300, 12, 3)] == [5, 5, 2, 1]
    rdb = storage.make_storage(f"sqlite:///{tmp_path / 's.db'}", grace_s=3)
    assert isinstance(rdb, RDBStorage) and rdb.get_heartbeat_interval() == 1


def test_what_is_shown_of_a_url_hides_its_password() -> None:
    url = "postgresql+psycopg2://nas:s3:cr@t@db.example:5432/postgres"
    assert masked(url) == "postgresql+psycopg2://nas:***@db.example:5432/postgres"
    assert without_password(url) == "postgresql+psycopg2://nas@db.example:5432/postgres"
    assert storage.dashboard_target(url) == without_password(url)  # PGPASSWORD gives it
    assert masked("sqlite:///a.db") == "sqlite:///a.db"
    assert "the --storage URL of the proxy" in storage.dashboard_target("grpc://h:13000")
    assert kind("grpc://h:13000") == StorageKind.GRPC and kind(url) == StorageKind.SERVER


class FlakyStorage(InMemoryStorage):
    """Optuna's in-memory storage whose calls fail as a database server's do while it is
    down: each call raises `error` while `down` is set; `lose_reply` makes the next trial
    finish commit, then fail as a dropped connection does."""

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
    return inner, RetryingStorage(inner, "postgresql://nas:***@db/postgres", wait_s)


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
    assert [(t.state, t.value) for t in study.trials] == [(optuna.trial.TrialState.COMPLETE, 1.0)]


def test_owner_alive() -> None:
    assert storage.owner_alive(storage.this_owner())
    assert not storage.owner_alive(_dead_owner())
    assert storage.owner_alive("elsewhere:1") and storage.owner_alive(None)


def test_a_heartbeat_that_cannot_record_is_reported_not_silent(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    study = _study(f"sqlite:///{path}?timeout=0.2", heartbeat_s=1, grace_s=5)
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    beat = storage.Heartbeat(study, trial)
    beat.start()
    beat.check()  # beating: nothing to report
    with locked(path):  # another process holds the write lock past the busy timeout
        time.sleep(1.6)
    with pytest.raises(HeartbeatError, match="database is locked"):
        beat.check()
    beat.stop()


def test_a_write_waits_for_a_lock_shorter_than_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    study = _study(f"sqlite:///{path}")  # SQLITE_BUSY_S, longer than sqlite3's 5 s
    trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
    with locked(path, release_after_s=6.0):
        study.tell(trial, 0.5)  # waits for the lock instead of raising after 5 s
    assert study.get_trials()[0].state == optuna.trial.TrialState.COMPLETE


def test_a_trial_is_asked_again_at_most_max_retries_times(tmp_path: Path) -> None:
    study = _study(f"sqlite:///{tmp_path / 's.db'}", max_retries=2)
    space: dict[str, optuna.distributions.BaseDistribution] = {
        "x": optuna.distributions.FloatDistribution(0, 1)
    }
    first = study.ask(space)
    first.set_user_attr(OWNER, "me:7")
    attempts = []
    for _ in range(4):  # the worker dies on this architecture every time
        assert fail_running(study, "stage 1 died", owner="me:7", max_retries=2) in (0, 1)
        again = [t for t in study.get_trials() if t.state == optuna.trial.TrialState.WAITING]
        if not again:
            break
        trial = study.ask(space)  # the retry: same parameters, its attempt number
        trial.set_user_attr(OWNER, "me:7")
        attempts.append(trial.user_attrs[storage.ATTEMPT])
        assert trial.params == first.params
    assert attempts == [1, 2]  # then no third retry
    last = study.get_trials()[-1]
    assert last.state == optuna.trial.TrialState.FAIL
    assert last.user_attrs["fail_reason"] == "stage 1 died (retried 2 times: not again)"
    with pytest.raises(ValueError, match=r"study.max_retries=-1 is not valid"):
        composed("study.max_retries=-1")


def _silence(url: str, trials: Sequence[optuna.trial.FrozenTrial | optuna.Trial]) -> None:
    """The last heartbeats of `trials` (on SQLite at `url`) dated a minute back: their
    worker went silent, on another machine or hung (longer ago than the default grace)."""
    backdate = sqlalchemy.text(
        "UPDATE trial_heartbeats SET heartbeat = datetime('now', '-60 seconds') "
        "WHERE trial_id IN :ids"
    ).bindparams(sqlalchemy.bindparam("ids", expanding=True))
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.begin() as connection:
            done = connection.execute(backdate, {"ids": [trial_id(t) for t in trials]})
            assert done.rowcount == len(trials)  # each has beaten
    finally:
        engine.dispose()


def _left_running(leader: Leader) -> TrialOrder:
    """A trial `leader` asks and leaves running, silent (its worker stopped beating)."""
    order = leader.next_trial()
    assert order is not None and leader.heartbeat is not None
    leader.heartbeat.stop()
    return order


def test_each_ask_first_takes_over_the_trials_of_dead_peers(tmp_path: Path) -> None:
    """A worker, before each trial it asks, fails the trials of a peer that died (its pid
    gone) or went silent (its heartbeat a minute old), uncounted, and enqueues them again:
    its ask is one of them, with its architecture, not a new proposal."""
    settings = tiny_settings(tmp_path, "tracker=none", "study.enqueue_seeds=false")
    Path(settings.studies_dir).mkdir(parents=True)
    peer, live = Leader(settings, owner="peer:1"), Leader(settings, owner=storage.this_owner())
    try:
        left = [_left_running(peer), _left_running(peer)]
        records = StudyRecords(live.study)
        dead, silent = (records.trial_by_number(order.number) for order in left)
        records.set_trial_user_attr(dead, OWNER, _dead_owner())
        _silence(settings.storage_url, [silent])
        taken = _left_running(live)
    finally:
        for leader in (peer, live):
            leader.close()
    trials = live.study.get_trials()
    assert {trials[o.number].state for o in left} == {optuna.trial.TrialState.FAIL}
    assert not any(counted(trials[o.number]) for o in left)
    retries = {t.user_attrs["retry_of"]: t for t in trials if "retry_of" in t.user_attrs}
    assert sorted(retries) == [o.number for o in left]
    assert {t.state.name for t in retries.values()} == {"RUNNING", "WAITING"}
    retry_of = trials[taken.number].user_attrs["retry_of"]
    assert taken.architecture == next(o.architecture for o in left if o.number == retry_of)


@pytest.mark.parametrize("scheme", ["sqlite", "journal"])
def test_workers_checking_at_once_fail_and_ask_again_each_orphan_once(
    tmp_path: Path, scheme: str
) -> None:
    """Two workers (two storages on one file) run the check before an ask at the same
    moment, over trials whose owner died and, on SQLite, trials whose heartbeat went
    silent: each is failed once and enqueued again once."""
    url = _url(tmp_path, scheme)
    studies = [_study(url), _study(url)]
    space: dict[str, optuna.distributions.BaseDistribution] = {
        "x": optuna.distributions.FloatDistribution(0, 1)
    }
    orphans = [studies[0].ask(space) for _ in range(8)]
    dead, silent = _dead_owner(), scheme == "sqlite"  # half of them silent on SQLite
    for i, trial in enumerate(orphans):
        trial.set_user_attr(OWNER, "another-machine:1" if silent and i % 2 else dead)
    for trial in orphans[1::2] if silent else []:
        beat = storage.Heartbeat(studies[0], trial)
        beat.start()
        beat.stop()  # it beat once
    if silent:
        _silence(url, orphans[1::2])
    together = threading.Barrier(2)

    def check(study: optuna.Study) -> int:
        together.wait()
        return fail_running(study, "left running")

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(check, studies))
    trials = studies[1].get_trials()
    waiting = [t for t in trials if t.state == optuna.trial.TrialState.WAITING]
    assert sorted(t.user_attrs["retry_of"] for t in waiting) == [t.number for t in orphans]
    assert {trials[t.number].state for t in orphans} == {optuna.trial.TrialState.FAIL}


def test_workers_started_with_one_seed_do_not_propose_the_same_architecture(
    tmp_path: Path,
) -> None:
    """Two workers on one study with one `seed`: the second asks while the first trains,
    so its sampler is reseeded first and proposes another architecture; a worker alone
    proposes what its seed says, as the first did."""
    settings = tiny_settings(tmp_path, "tracker=none", "study.enqueue_seeds=false")
    alone = tiny_settings(tmp_path, "tracker=none", "study.enqueue_seeds=false", "study.name=a")
    Path(settings.studies_dir).mkdir(parents=True)
    orders = []
    for config, owner in ((settings, "peer:1"), (settings, storage.this_owner()), (alone, None)):
        leader = Leader(config, owner=owner or storage.this_owner())
        try:
            orders.append(_left_running(leader))
        finally:
            leader.close()
    first, second, by_itself = (order.architecture for order in orders)
    assert second != first and by_itself == first


def test_an_architecture_a_peer_trains_now_is_a_duplicate_not_trained_twice(
    tmp_path: Path,
) -> None:
    """As when two workers that created the study at once both enqueued the seeds: a copy
    of the architecture a peer trains, asked while it trains, is failed as its duplicate,
    uncounted, and the worker asks another."""
    settings = tiny_settings(tmp_path, "tracker=none", "study.enqueue_seeds=false")
    Path(settings.studies_dir).mkdir(parents=True)
    peer, live = Leader(settings, owner="peer:1"), Leader(settings, owner=storage.this_owner())
    try:
        training = _left_running(peer)
        live.study.enqueue_trial(live.study.trials[training.number].params)  # the second copy
        taken = _left_running(live)
    finally:
        for leader in (peer, live):
            leader.close()
    trials = live.study.get_trials()
    copies = [t for t in trials if t.user_attrs.get(DUPLICATE_OF) == training.number]
    assert len(copies) == 1 and not counted(copies[0])
    assert copies[0].user_attrs["fail_reason"] == (
        f"Duplicate: trial {training.number} trains this architecture"
    )
    assert taken.architecture != training.architecture and taken.number > copies[0].number
