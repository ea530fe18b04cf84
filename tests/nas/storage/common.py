"""What the storage tests share: one running storage of each kind (`started`), a worker
that died (`dead_owner`), a worker gone silent (`silence`), and a study opened as the
harness opens it (`open_study`).

No conftest: the test modules import these by name, and each starts its storages once
(module-scoped fixtures).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
import sqlalchemy

from nas import storage
from nas.search.records import trial_id
from nas.storage.opening import GRACE_S
from nas.storage.postgres import Postgres, PostgresError, free_port
from nas.storage.url import StorageKind

SECRET = "s3cret-Pa55"  # the password of a URL that must never be shown
SPACE: dict[str, optuna.distributions.BaseDistribution] = {
    "x": optuna.distributions.FloatDistribution(0, 1)
}
PROXY_START_S = 120  # the gRPC proxy's start: an interpreter importing Optuna and grpc


@dataclass(frozen=True)
class Backend:
    """A running storage of one kind: `url` is what `study.storage=` takes; `unopenable`,
    URLs of this kind that hold `SECRET` as their password and cannot be used, each with
    what its error says (none for a journal file, whose URL is a path); `password`, the
    one in `url`, if any."""

    kind: StorageKind
    url: str
    unopenable: tuple[tuple[str, str], ...] = ()
    password: str | None = None

    @property
    def has_heartbeats(self) -> bool:
        """Whether trials on it beat (RDB storages: `nas.storage.opening`)."""
        return self.kind in (StorageKind.SQLITE, StorageKind.SERVER)


@contextlib.contextmanager
def started(kind: StorageKind, folder: Path) -> Iterator[Backend]:
    """A storage of `kind` whose files live in `folder`, until the block ends; PostgreSQL is
    a throw-away server (the test is skipped, saying why, only where none can start)."""
    if kind == StorageKind.SQLITE:
        invalid = (f"sqlite://nas:{SECRET}@/s.db", "Invalid SQLite URL")
        yield Backend(kind, f"sqlite:///{folder / 's.db'}", (invalid,))
    elif kind == StorageKind.JOURNAL:
        yield Backend(kind, f"journal://{folder / 's.log'}")
    elif kind == StorageKind.SERVER:
        with _postgres() as server:
            unopenable = (
                (server.url.replace(server.record.password, SECRET), "authentication failed"),
                (f"nosuchdb://nas:{SECRET}@127.0.0.1/x", "NoSuchModuleError"),
            )
            yield Backend(kind, server.url, unopenable, server.record.password)
    else:
        with _proxy(f"sqlite:///{folder / 'proxied.db'}", folder / "proxy.log") as url:
            no_port = (f"grpc://nas:{SECRET}@127.0.0.1", "use grpc://host:port")
            yield Backend(kind, url, (no_port,))


@contextlib.contextmanager
def _postgres() -> Iterator[Postgres]:
    """A throw-away PostgreSQL server (`nas.storage.postgres`), without fsync, in a folder
    of /tmp (one the account that runs it can reach)."""
    folder = Path(tempfile.mkdtemp(prefix="nas-pg-"))
    try:
        try:
            server = Postgres(folder, durable=False).start()
        except PostgresError as error:
            pytest.skip(f"no PostgreSQL server can start on this machine: {error}")
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def _proxy(database: str, log: Path) -> Iterator[str]:
    """Optuna's gRPC proxy serving `database`, started as a user starts it
    (`python -m nas.storage.server serve`); yields the URL it prints once it answers."""
    command = [sys.executable, "-m", "nas.storage.server", "serve", "--storage", database]
    command += ["--host", "127.0.0.1", "--port", str(free_port())]
    with log.open("w") as errors:
        proxy = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, text=True)
        try:
            assert proxy.stdout is not None
            url = proxy.stdout.readline().strip()  # "" if it exited
            assert url.startswith("grpc://"), f"the proxy did not start: {log.read_text()}"
            yield url
        finally:
            proxy.terminate()
            proxy.communicate(timeout=PROXY_START_S)


def open_study(
    url: str,
    name: str,
    *,
    heartbeat_s: int | None = None,
    grace_s: int = GRACE_S,
    max_retries: int = storage.MAX_RETRIES,
) -> optuna.Study:
    """The study `name` at `url`, created or loaded through `make_storage`, as a worker
    opens it (its heartbeat, grace and retries as `make_storage` takes them)."""
    opened = storage.make_storage(
        url, heartbeat_s=heartbeat_s, grace_s=grace_s, max_retries=max_retries
    )
    return optuna.create_study(study_name=name, storage=opened, load_if_exists=True)


def dead_owner() -> str:
    """The owner tag of a worker on this host that has exited (its pid is free)."""
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return f"{socket.gethostname()}:{child.stdout.strip()}"


# a heartbeat a minute older, in each database's own words
_BACKDATED = {
    "sqlite": "datetime(heartbeat, '-60 seconds')",
    "postgresql": "heartbeat - interval '60 seconds'",
}


def silence(url: str, trials: Sequence[optuna.trial.FrozenTrial | optuna.Trial]) -> None:
    """The last heartbeats of `trials` (on the RDB storage at `url`) dated a minute back:
    their worker went silent, on another machine or hung (longer ago than the default
    grace)."""
    engine = sqlalchemy.create_engine(url)
    try:
        backdate = sqlalchemy.text(
            f"UPDATE trial_heartbeats SET heartbeat = {_BACKDATED[engine.dialect.name]} "
            "WHERE trial_id IN :ids"
        ).bindparams(sqlalchemy.bindparam("ids", expanding=True))
        with engine.begin() as connection:
            done = connection.execute(backdate, {"ids": [trial_id(t) for t in trials]})
            assert done.rowcount == len(trials)  # each has beaten
    finally:
        engine.dispose()
