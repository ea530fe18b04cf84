"""The throw-away PostgreSQL server and the `python -m nas` workers of `study_scaling.py`.

Why it exists: starting and stopping the server, reading its counters with this script's
own (counted) connections, and starting W workers as a user does, each with the storage
probe on its PYTHONPATH, then ending them, are one concern, apart from what is measured
(`study_scaling_storage.py`) and the entry point (`study_scaling.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import sqlalchemy
from study_scaling_storage import CALLS_ENV, PROBE

from nas.storage.url import without_password

SERVER = [sys.executable, "-m", "nas.storage.server", "postgres"]
APP = "study_scaling-bench"  # this script's own connections (PGAPPNAME), told from workers'
TAIL = 3000  # characters of a failed worker's stderr reported


def start_server(folder: Path) -> str:
    done = subprocess.run(
        [*SERVER, "--dir", str(folder), "--no-fsync", "--detach"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0:
        raise SystemExit(f"the throw-away PostgreSQL did not start: {done.stderr.strip()}")
    return done.stdout.strip()


def stop_server(folder: Path) -> None:
    subprocess.run(
        [*SERVER, "--dir", str(folder), "--stop"], capture_output=True, text=True, timeout=180
    )


_queries = 0  # this script's own transactions on the server (each `query` is one)


def queries_made() -> int:
    """How many transactions this script has made on the server so far (`query`)."""
    return _queries


def query(url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
    """The rows of `sql` in a connection of its own (one transaction, counted)."""
    global _queries
    _queries += 1
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        with engine.connect() as connection:
            rows = connection.execute(sqlalchemy.text(sql), params).mappings().all()
            return [dict(row) for row in rows]
    finally:
        engine.dispose()


def server_counters(url: str) -> dict[str, float | None]:
    """The database's cumulative statistics now (active_time: PostgreSQL 14 and later)."""
    row = query(url, "SELECT * FROM pg_stat_database WHERE datname = current_database()")[0]
    keys = ("xact_commit", "xact_rollback", "active_time", "tup_returned", "tup_inserted")
    return {k: None if row.get(k) is None else float(row[k]) for k in keys}


def quiet(url: str, timeout_s: float = 60.0) -> int:
    """End this script's own idle connections (the storages it read through),
    then wait until no other client is connected: a backend's statistics reach
    pg_stat_database for sure when it ends. How many were still connected at the timeout."""
    query(
        url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = :me AND pid <> pg_backend_pid()",
        me=APP,
    )
    sql = (
        "SELECT count(*) AS n FROM pg_stat_activity "
        "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    )
    deadline = time.monotonic() + timeout_s
    while (left := int(query(url, sql)[0]["n"])) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # PostgreSQL before 15 sends statistics with a delay
    return left


# -- the workers -------------------------------------------------------------------------------
@dataclass
class Worker:
    index: int
    run_dir: Path
    process: subprocess.Popen[bytes]
    files: tuple[IO[bytes], IO[bytes]]
    exit_s: float | None = None

    def tail(self) -> str:
        err = (self.run_dir / "worker.err").read_text(errors="replace")
        out = (self.run_dir / "worker.out").read_text(errors="replace")
        return (err.strip() or out.strip())[-TAIL:]


def launch(index: int, run_dir: Path, url: str, overrides: list[str], calls: Path) -> Worker:
    """`python -m nas` as a user starts a worker (the password in PGPASSWORD), with the probe
    (`PROBE`) on its PYTHONPATH writing its processes' storage calls to `calls`; its own
    session, so that it and its stage processes can be ended together."""
    run_dir.mkdir(parents=True)
    probe = calls.parent / "probe"
    probe.mkdir(exist_ok=True)
    (probe / "sitecustomize.py").write_text(PROBE)
    password = sqlalchemy.engine.make_url(url).password
    env = {k: v for k, v in os.environ.items() if k != "PGAPPNAME"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(probe), env.get("PYTHONPATH")]))
    env[CALLS_ENV] = str(calls)
    if password:
        env["PGPASSWORD"] = password
    command = [
        *(sys.executable, "-m", "nas", *overrides),
        f"study.storage={without_password(url)}",
        f"hydra.run.dir={run_dir}",
        f"studies_dir={run_dir / 'studies'}",
    ]
    out, err = (run_dir / "worker.out").open("wb"), (run_dir / "worker.err").open("wb")
    process = subprocess.Popen(
        command, cwd=run_dir.parent, env=env, stdout=out, stderr=err, start_new_session=True
    )
    return Worker(index, run_dir, process, (out, err))


def end(workers: list[Worker]) -> None:
    """End the workers still running (each its own process group: it and its stages)."""
    for w in workers:
        if w.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.process.pid, signal.SIGKILL)
            w.process.wait()
        for f in w.files:
            f.close()


def run_workers(
    folder: Path, url: str, overrides: list[str], n: int, timeout_s: float, calls: Path
) -> tuple[float, list[Worker], list[dict[str, Any]]]:
    """Start `n` workers at once; (seconds until the last exited, the workers, failures)."""
    workers: list[Worker] = []
    started = time.perf_counter()
    try:
        for i in range(n):
            workers.append(launch(i, folder / f"worker-{i}", url, overrides, calls))
        while any(w.exit_s is None for w in workers):
            now = time.perf_counter() - started
            for w in workers:
                if w.exit_s is None and w.process.poll() is not None:
                    w.exit_s = now
            if now > timeout_s:
                break
            time.sleep(0.1)
        wall = time.perf_counter() - started
    finally:
        end(workers)
    failures = [
        {
            "worker": w.index,
            "returncode": w.process.returncode,
            "timed_out": w.exit_s is None,
            "run_dir": str(w.run_dir),
            "stderr_tail": w.tail(),
        }
        for w in workers
        if w.exit_s is None or w.process.returncode != 0
    ]
    return wall, workers, failures
