"""What an SQLite file needs to hold one study for several processes at once.

SQLite has no server: the workers on one machine open the file itself, and SQLite lets one
of them write at a time. Three things make that work, numbered:

    1. wait   a write waits `SQLITE_BUSY_S` for another process's lock (sqlite3: 5 s);
    2. WAL    the file in write-ahead mode, synced at checkpoints (`write_ahead`);
    3. turns  SQLite has no row lock: two processes checking a trial's state, then changing
              it, could both change it (two workers failing one orphan would both ask it
              again; two popping one enqueued trial would both train it). The workers on
              the file take turns through a lock file beside it (`one_check_at_a_time`);
              the threads of one process, the gRPC proxy's that serve workers who cannot
              reach that lock file among them, change one trial state at a time
              (`SQLiteStorage`).

A database server or a journal file refuses the second change itself: none of this there.
"""

from __future__ import annotations

import contextlib
import fcntl
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from nas.search.records import StudyRecords

__all__ = ["SQLITE_BUSY_S", "SQLiteStorage", "one_check_at_a_time", "write_ahead"]

SQLITE_BUSY_S = 20.0  # how long a write waits for another process's lock (sqlite3: 5 s)
_CHANGING = threading.Lock()  # one trial state change at a time in this process (3.)


class SQLiteStorage(RDBStorage):
    """Optuna's RDB storage of an SQLite file, in write-ahead mode (2.), changing one trial
    state at a time in this process (3.)."""

    def __init__(self, url: str, **options: Any) -> None:
        super().__init__(url, **options)
        sqlalchemy.event.listen(self.engine, "connect", write_ahead)
        self.engine.dispose()  # the connections made so far reopen with it

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        with _CHANGING:
            return super().set_trial_state_values(trial_id, state, values)


def write_ahead(connection: Any, _: Any) -> None:
    """SQLite in write-ahead mode, synced at checkpoints: a sampled architecture writes
    about 140 parameters, one commit each, about 5x faster so (safe for processes on one
    machine; for several machines use a server database or a journal file).

    Switching the journal mode needs the database to itself and does not wait on SQLite's
    busy handler, so two harnesses opening a new study at once retry (the mode, once set,
    stays in the file: later connections find it set and skip the switch)."""
    cursor = connection.cursor()
    try:
        deadline = time.monotonic() + SQLITE_BUSY_S
        while cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            try:
                cursor.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError as error:
                if "locked" not in str(error) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


@contextlib.contextmanager
def one_check_at_a_time(study: optuna.Study) -> Iterator[None]:
    """On SQLite, hold a lock file beside the database (`<file>-orphans.lock`) while the
    caller fails orphaned trials and asks them again, or asks for a trial (3.); elsewhere,
    nothing."""
    database = StudyRecords(study).sqlite_file()
    if database is None:
        yield
        return
    with open(f"{database}-orphans.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield
