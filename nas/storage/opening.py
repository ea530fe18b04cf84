"""Where a study lives, and how a trial whose worker died is told apart from a running one.

Several harness workers (each with its own stage processes, on one machine or many) may
share one study. A trial left RUNNING is then either being trained by another worker or
orphaned by a crash, and failing every RUNNING trial at start (the single-worker shortcut)
would destroy the other workers' trials. Two signals tell them apart, numbered:

    1. the owner: every trial records `owner` = "<host>:<pid of the harness that asked
       it>"; a RUNNING trial whose owner is on this host and no longer alive is orphaned
       (a killed harness is found at once, on any storage);
    2. the heartbeat (RDB storages: SQLite, PostgreSQL, MySQL): rank 0 records one every
       `heartbeat_every(grace)` seconds (`HEARTBEAT_S`) while a trial trains; a trial
       silent for `study.heartbeat_grace_s` seconds (`GRACE_S`) is failed by
       `optuna.storages.fail_stale_trials` (a worker on another machine that died or hung).

Every worker looks for such trials when it opens the study and again before each trial it
asks (`nas.study.orphans.fail_running`), so a live worker takes over a dead peer's trial while the
study runs. Two workers looking at once fail a trial once: a database server's row lock (and
a journal file's order) lets the first failure through and refuses the second
(`UpdateFinishedTrialError`: that worker skips the trial); SQLite, which has no row lock,
takes turns (`nas.storage.sqlite`: a lock file beside the database, and in the gRPC proxy
serving it, one state change at a time). Only the worker whose failure went through asks
the trial again.

Journal files (`study.storage=journal:///path/study.log`, for several machines on a shared
file system) and Optuna's gRPC storage proxy (`grpc://host:port`, whose protocol carries no
heartbeat) have none: there only the owner check runs, so a trial orphaned on another
machine stays RUNNING (it does not count toward `study.n_trials`).

The storage of a database server or of the gRPC proxy is wrapped so that its calls wait
out an outage of up to `study.storage_wait_s` seconds (`nas.storage.retrying`); one that
cannot be reached at all when a worker starts is a one-line `StorageError`.

A trial failed either way is asked again (`retry`), at most `study.max_retries` times per
architecture: one that kills its worker every time ends failed, and the study goes on. A
trial failed by the heartbeat check is closed by Optuna before anyone can write why: its
cause is kept on the study instead, under `stale_cause_key(number)` (`STALE`, and at the
cap, that it is not retried again).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
import sqlalchemy
import sqlalchemy.exc
from optuna.storages import (
    BaseStorage,
    GrpcStorageProxy,
    JournalStorage,
    RDBStorage,
    get_storage,
)
from optuna.storages.journal import JournalFileBackend

from nas.errors import HeartbeatError, describe
from nas.search.records import StudyRecords, trial_id
from nas.storage import url as storage_url
from nas.storage.retrying import RetryingStorage, StorageError, root_cause
from nas.storage.sqlite import SQLITE_BUSY_S, SQLiteStorage
from nas.storage.url import JOURNAL, StorageKind
from pipeline.distributed import procfs

__all__ = [
    "CONNECT_S",
    "GRACE_S",
    "HEARTBEAT_S",
    "STALE",
    "STORAGE_WAIT_S",
    "Heartbeat",
    "StorageError",
    "dashboard_target",
    "fail_stale",
    "first_attempt",
    "heartbeat_every",
    "make_storage",
    "on_wait",
    "owner_alive",
    "retried_enough",
    "retry",
    "stale_cause_key",
    "this_owner",
]

HEARTBEAT_S = 5  # seconds between a trial's heartbeats (fewer for a short grace)
GRACE_S = 30  # `study.heartbeat_grace_s`'s default: a trial silent this long is failed
STORAGE_WAIT_S = 60.0  # `study.storage_wait_s`'s default: a server's outage waited out
CONNECT_S = 10  # a database server or gRPC proxy that does not answer by then is unreachable
KEEPALIVE_S = 30  # a PostgreSQL server that vanished mid-query is noticed within about this
MAX_RETRIES = 2  # `study.max_retries`'s default
ATTEMPT = "attempt"  # a retried trial's user attr: which retry of its architecture it is
RETRY_OF = "retry_of"  # a retried trial's user attr: the number of the trial it repeats
STALE = "its worker stopped beating"  # the recorded cause of a trial the heartbeat failed

logger = logging.getLogger(__name__)


def make_storage(
    url: str,
    *,
    heartbeat_s: int | None = None,
    grace_s: int = GRACE_S,
    max_retries: int = MAX_RETRIES,
    wait_s: float = STORAGE_WAIT_S,
) -> BaseStorage:
    """The storage at `url` (`nas.storage.url`: an SQLite file, a journal file, a database
    server's SQLAlchemy URL, or `grpc://host:port`), with heartbeats on where the storage
    has them: a trial whose heartbeat was silent for `grace_s` seconds is failed and asked
    again up to `max_retries` times (`retry`); it beats every `heartbeat_s` seconds (None:
    `heartbeat_every(grace_s)`).

    A server's storage (or the gRPC proxy's) is reached at once: unreachable, refusing the
    credentials or without its driver, `StorageError` says so in one line naming it
    (password masked) within `CONNECT_S`. Its calls then wait out an outage of up to
    `wait_s` seconds (`nas.storage.retrying`).
    """
    kind = storage_url.kind(url)
    if kind == StorageKind.JOURNAL:
        return _journal(url)
    if kind == StorageKind.GRPC:
        return _retrying(_grpc_proxy(url), url, wait_s)
    every = heartbeat_every(grace_s) if heartbeat_s is None else heartbeat_s
    rdb = _connect(_with_driver(url), storage_url.masked(url), every, grace_s, max_retries)
    if kind == StorageKind.SQLITE:
        return rdb
    # Optuna's in-process cache of finished trials (what a URL given to Optuna gets)
    return _retrying(get_storage(rdb), url, wait_s)


def _journal(url: str) -> JournalStorage:
    """The journal file at `url`; StorageError naming it when it cannot be opened."""
    try:
        return JournalStorage(JournalFileBackend(url[len(JOURNAL) :]))
    except OSError as error:
        raise StorageError(
            f"storage {url} could not be opened ({root_cause(error)}); a journal file's "
            "folder must exist and be writable"
        ) from None


def _retrying(inner: BaseStorage, url: str, wait_s: float) -> RetryingStorage:
    """`inner`, the storage at `url`, its calls waiting out an outage of `wait_s` seconds."""
    # mypy sees the class before its class decorator gives it the abstract methods
    return RetryingStorage(inner, storage_url.masked(url), wait_s)  # type: ignore[abstract]


def heartbeat_every(grace_s: int) -> int:
    """Seconds between a trial's heartbeats for a grace of `grace_s`: `HEARTBEAT_S`, or a
    sixth of a shorter grace, at least 1 s, so a live worker beats several times in it."""
    return max(1, min(HEARTBEAT_S, grace_s // 6))


def _connect(url: str, name: str, heartbeat_s: int, grace_s: int, max_retries: int) -> RDBStorage:
    """Optuna's RDB storage at `url`, its tables created; StorageError naming it `name`
    when it cannot be reached, refuses us, or its driver is missing.

    Two processes opening a new database at once (a worker and the gRPC proxy, say) both
    create Optuna's tables, and the database refuses the second (PostgreSQL: a duplicate
    key in its catalog; SQLite: the table already exists): opened again, the tables are
    there and nothing is created."""
    for attempt in range(_CREATE_TRIES):
        try:
            return _opened(url, name, heartbeat_s, grace_s, max_retries)
        except StorageError as error:
            if attempt == _CREATE_TRIES - 1 or not any(s in str(error) for s in _RACED):
                raise
            logger.debug("storage %s: its tables made by another process meanwhile", name)
            time.sleep(0.1 * (attempt + 1))
    raise AssertionError("unreachable")  # pragma: no cover


_CREATE_TRIES = 3
_RACED = ("already exists", "duplicate key", "UNIQUE constraint failed")  # made meanwhile


def _opened(url: str, name: str, heartbeat_s: int, grace_s: int, max_retries: int) -> RDBStorage:
    with warnings.catch_warnings():  # heartbeats are "experimental" in Optuna 5
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            return (SQLiteStorage if url.startswith("sqlite") else RDBStorage)(
                url,
                engine_kwargs=_engine_options(url),
                heartbeat_interval=heartbeat_s,
                grace_period=grace_s,
                heartbeat_stale_trial_callback=functools.partial(
                    _ask_again, max_retries=max_retries
                ),
            )
        except ImportError as error:
            raise StorageError(
                f"storage {name}: its database driver is not installed "
                f"({root_cause(error)}); for PostgreSQL: pip install 'elastic-nas[postgres]'"
            ) from None
        except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError) as error:
            raise StorageError(f"storage {name} could not be opened: {root_cause(error)}") from None


def _with_driver(url: str) -> str:
    """`url`, a PostgreSQL URL without a driver naming psycopg2 when that is the one
    installed (SQLAlchemy 2.1 takes psycopg 3 for `postgresql://`, 2.0 psycopg2)."""
    if url.startswith("postgresql://"):
        missing = importlib.util.find_spec("psycopg") is None
        if missing and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len("postgresql://") :]
    return url


def _engine_options(url: str) -> dict[str, Any] | None:
    """SQLAlchemy engine options: a SQLite writer waits SQLITE_BUSY_S for a lock (a
    `?timeout=` in the URL wins); a server's connections are checked before use (the
    server may have restarted since), connect within CONNECT_S and, on PostgreSQL, find
    out within about KEEPALIVE_S that a server vanished mid-query (TCP keepalives)."""
    if url.startswith("sqlite"):
        return None if "timeout=" in url else {"connect_args": {"timeout": SQLITE_BUSY_S}}
    options: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith(("postgresql://", "postgresql+psycopg2://", "postgresql+psycopg://")):
        options["connect_args"] = {
            "connect_timeout": CONNECT_S,
            "keepalives": 1,
            "keepalives_idle": KEEPALIVE_S // 2,
            "keepalives_interval": KEEPALIVE_S // 6,
            "keepalives_count": 3,
        }
    return options


def _grpc_proxy(url: str) -> BaseStorage:
    """The client of the gRPC storage proxy at `url`, once it answers (StorageError when it
    does not within CONNECT_S). It has no heartbeats: Optuna's proxy does not carry them."""
    host, port = storage_url.grpc_address(url)
    name = storage_url.masked(url)
    try:
        with warnings.catch_warnings():  # "experimental" in Optuna 5
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            proxy = GrpcStorageProxy(host=host, port=port)
    except ImportError as error:
        raise StorageError(
            f"storage {name}: grpcio is not installed ({root_cause(error)}); "
            "pip install 'elastic-nas[postgres]'"
        ) from None
    try:
        proxy.wait_server_ready(timeout=CONNECT_S)
    except ConnectionError:
        proxy.close()
        raise StorageError(
            f"storage {name}: no gRPC storage proxy answers there within {CONNECT_S} s "
            "(start one: python -m nas.storage.server serve --storage <url> --port <port>)"
        ) from None
    return proxy


def on_wait(study: optuna.Study, listener: Callable[[str | None], None]) -> None:
    """Have `listener` hear when the study's storage is unreachable (a message) and when it
    answers again (None); nothing for storages that do not wait (`nas.storage.retrying`)."""
    store = StudyRecords(study).storage
    if isinstance(store, RetryingStorage):
        store.on_wait = listener


def dashboard_target(url: str) -> str:
    """What `optuna-dashboard` takes for the storage at `url`: a journal file's path, a
    server's URL without its password (the client reads it from `PGPASSWORD` or
    `~/.pgpass`), or for the gRPC proxy, the database it serves (the dashboard speaks SQL,
    not gRPC)."""
    kind = storage_url.kind(url)
    if kind == StorageKind.JOURNAL:
        return url[len(JOURNAL) :]
    if kind == StorageKind.GRPC:
        return f"<the --storage URL of the proxy at {storage_url.without_password(url)}>"
    return storage_url.without_password(_with_driver(url))


def fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose heartbeat stopped (RDB storages; see the module docstring)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def _ask_again(study: optuna.Study, trial: optuna.trial.FrozenTrial, max_retries: int) -> None:
    """A stale trial is failed by Optuna (it does not count); its cause goes on the study
    (`stale_cause_key`) and its architecture is enqueued again so that the study still
    evaluates it, up to the cap.

    Not Optuna's `RetryHeartbeatStaleTrialCallback`: it copies the dead trial's user attrs
    (owner, model digest) and counts retries apart from `retry`'s `attempt`/`retry_of`."""
    retried = retry(study, trial, max_retries)
    cause = STALE if retried else f"{STALE} (retried {max_retries} times: not again)"
    study.set_user_attr(stale_cause_key(trial.number), cause)
    if not retried:
        logger.warning("trial %d: %s", trial.number, cause)


def stale_cause_key(number: int) -> str:
    """The study's user attribute holding why the heartbeat check failed trial `number`
    (the trial itself is closed to writes by then: module doc)."""
    return f"fail_reason:{number}"


def retry(study: optuna.Study, trial: optuna.trial.FrozenTrial, max_retries: int) -> bool:
    """Enqueue `trial`'s parameters again, unless it is its architecture's attempt number
    `max_retries` + 1 already; True if enqueued. The retry carries `retry_of` (the trial it
    repeats) and `attempt` (1 for the first retry)."""
    if retried_enough(trial, max_retries):
        return False
    attempt = int(trial.user_attrs.get(ATTEMPT, 0)) + 1
    study.enqueue_trial(trial.params, user_attrs={RETRY_OF: trial.number, ATTEMPT: attempt})
    return True


def first_attempt(
    trials: Sequence[optuna.trial.FrozenTrial], number: int
) -> optuna.trial.FrozenTrial:
    """The trial that trial `number` repeats, through every retry (itself when it is not a
    retry); `trials` are the study's, numbers as indices. A retry is enqueued with its
    parameters alone: what its sampler recorded of the first attempt (an evolution
    parent, the edit) is read there."""
    trial = trials[number]
    while (repeated := trial.user_attrs.get(RETRY_OF)) is not None:
        trial = trials[int(repeated)]
    return trial


def retried_enough(trial: optuna.trial.FrozenTrial, max_retries: int) -> bool:
    """Whether `trial` is its architecture's last allowed attempt (`retry` asks no more)."""
    return int(trial.user_attrs.get(ATTEMPT, 0)) >= max_retries


def this_owner() -> str:
    """The owner tag of trials asked by this process: "<host>:<pid>"."""
    return f"{socket.gethostname()}:{os.getpid()}"


def owner_alive(owner: str | None) -> bool:
    """False only when `owner` ran on this host and its process is gone (unknown: alive)."""
    if not owner or ":" not in owner:
        return True
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process with that pid
        return True
    # exited but not reaped yet: a killed worker stays so until its parent polls it and
    # signal 0 still reaches it; without this its trial would look alive until then
    return not procfs.has_exited(int(pid))


class Heartbeat:
    """While a trial trains, record its heartbeat every `HEARTBEAT_S` s (RDB storages).

    Rank 0 starts it when it asks the trial and stops it when it tells the result; on
    storages without heartbeats it does nothing. If recording raises (the storage is gone,
    or locked past its busy timeout), the thread ends and keeps the error: `check()`, which
    rank 0 calls at every decision of the trial, raises it, so the trial fails with that
    cause instead of being failed later, silently, as stale.
    """

    def __init__(self, study: optuna.Study, trial: optuna.Trial) -> None:
        storage = StudyRecords(study).storage
        self._record = getattr(storage, "record_heartbeat", None)
        interval = getattr(storage, "get_heartbeat_interval", lambda: None)()
        self._interval = float(interval) if interval else None
        self._trial_id = trial_id(trial)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def start(self) -> None:
        if self._record is not None and self._interval is not None:
            self._thread = threading.Thread(target=self._beat, daemon=True, name="heartbeat")
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def check(self) -> None:
        """Raise `HeartbeatError` if the thread died (once: the error is then cleared)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise HeartbeatError(f"the trial's heartbeat stopped: {describe(error)}") from error

    def _beat(self) -> None:
        assert self._record is not None and self._interval is not None
        while True:
            try:
                self._record(self._trial_id)
            except Exception as error:
                self._error = error
                return
            if self._stop.wait(self._interval):
                return
