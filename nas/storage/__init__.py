"""Where a study lives: storage URLs, opening them, retrying them, serving them.

Owned here, below the study and the retrain stage that keep their records in it:

    url        what a `--storage` URL names (`StorageKind`: SQLite, journal file,
               PostgreSQL or another RDB server, Optuna's gRPC proxy) and its masked form
    opening    `make_storage` (one storage of every kind, wrapped to retry), who owns a
               RUNNING trial (its owner and heartbeat), failing and retrying a dead worker's
    retrying   `RetryingStorage`: a storage call that waits out a server gone for a while
    sqlite     an SQLite file shared by several processes: write-ahead, waits, taking turns
    postgres   a throw-away PostgreSQL server from the `pgserver` wheel
    server     `python -m nas.storage.server`: that server, or Optuna's gRPC proxy

Every storage kind passes one contract test (`tests/nas/storage/test_contract.py`).
"""

from nas.storage.opening import (
    ATTEMPT,
    MAX_RETRIES,
    RETRY_OF,
    STALE,
    Heartbeat,
    StorageError,
    dashboard_target,
    fail_stale,
    first_attempt,
    heartbeat_every,
    make_storage,
    on_wait,
    owner_alive,
    retried_enough,
    retry,
    stale_cause_key,
    this_owner,
)
from nas.storage.sqlite import one_check_at_a_time
from nas.storage.url import JOURNAL, StorageKind

__all__ = [
    "ATTEMPT",
    "JOURNAL",
    "MAX_RETRIES",
    "RETRY_OF",
    "STALE",
    "Heartbeat",
    "StorageError",
    "StorageKind",
    "dashboard_target",
    "fail_stale",
    "first_attempt",
    "heartbeat_every",
    "make_storage",
    "on_wait",
    "one_check_at_a_time",
    "owner_alive",
    "retried_enough",
    "retry",
    "stale_cause_key",
    "this_owner",
]
