"""Trials per hour with 1, 2 and 4 workers on one PostgreSQL study, and the storage's share
of a trial's wall time.

A throw-away PostgreSQL server (`python -m nas.storage.server postgres --no-fsync
--detach`, stopped at the end) holds the studies. For each worker count W (`--workers`), in
interleaved rounds (`--rounds`), a fresh study gets W `python -m nas` workers started at once
as the README's shell loop starts them (each its own `hydra.run.dir`, the password in
PGPASSWORD), each with 2 stage processes (`pipeline.n_stages=2`, CPU gloo, 1 thread each),
on a small fixed task (the character LM, d_model 32, one cell, `--steps` steps a trial,
an evaluation every third of them) with the default sampler (regularized evolution from
the two seeds), no tracker, and `study.n_trials=--trials` (the study counts across workers:
each worker stops once that many are finished, so W workers may overshoot by up to W - 1).

Measured per run:

* wall seconds from the first launch to the last worker's exit; trials per hour = counted
  trials / wall x 3600 (start-up included, as a user sees it), the same per usable core,
  and from the first trial's start to the last trial's end (start-up excluded);
* per counted trial (read back from the study): wall (`datetime_complete -
  datetime_start`) and the time spent building and training it (the `seconds` user attr);
* the storage (`STORAGE_METHOD`): every storage call each worker's processes make, timed
  where it is made by a probe on the workers' PYTHONPATH (no production file changed);
  per counted trial, the time its worker spent in storage calls within the trial's wall
  (the heartbeat thread's apart), and its share of that wall; checked against the server's
  own counters over the run (`pg_stat_database`: transactions and the time it spent
  executing them) and a trial's time outside building and training (an upper bound).

On a machine with fewer cores than 2 W stage processes the workers share the cores: then
more workers cannot add trials per hour; the figures say what sharing costs.

    python benchmarks/study_scaling.py [--workers 1 2 4] [--rounds 2] [--trials 8]
        [--steps 60] [--quick] [--out PATH]

Writes benchmarks/results/study_scaling.json (--quick, a smoke run of about 2 minutes:
1 round, 1 and 2 workers, 2 trials of 2 steps: <temp dir>/study_scaling_quick.json).
A worker that fails (exits non-zero) ends the measurement: its stderr's end is printed,
its run folder kept, and the script exits 1.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import optuna
import sqlalchemy
from optuna.trial import FrozenTrial
from rich.console import Console
from rich.table import Table

from nas.storage.opening import make_storage
from nas.storage.url import masked, without_password
from nas.study.trials import OWNER, counted

SERVER = [sys.executable, "-m", "nas.storage.server", "postgres"]
STAGES = 2
APP = "study_scaling-bench"  # this script's own connections (PGAPPNAME), told from workers'
TAIL = 3000  # characters of a failed worker's stderr reported
CALLS_ENV = "STUDY_SCALING_CALLS"  # where the probe writes (a folder per run)
HEARTBEAT = "heartbeat"  # the thread name of rank 0's heartbeats (nas.storage.opening.Heartbeat)
# The probe: a sitecustomize.py put first on the workers' PYTHONPATH (never installed, no
# production file changed). In every process of a worker (the harness and its stage
# processes) it wraps `nas.storage.retrying.RetryingStorage._call` once that module is imported:
# the one door through which every call to a database server's storage passes (rank 0's
# decisions, the samplers, the pruner, the heartbeat thread, the harness between launches).
# Each call appends a line to <CALLS_ENV>/<worker pid>-<pid>.tsv: its start (time.time()),
# seconds, the storage method and the calling thread's name. A machine's own
# sitecustomize, if one exists further on the path, still runs after it.
PROBE = '''"""study_scaling.py's probe: times every call through RetryingStorage._call."""
import importlib.abc
import importlib.util
import os
import runpy
import sys
import threading
import time

_FOLDER = os.environ.get("STUDY_SCALING_CALLS")  # CALLS_ENV
_LOCK = threading.Lock()
_OUT = []
_DEPTH = threading.local()


def _starter():
    """The process that started this one: a stage forked by its worker's forkserver
    names the worker (the forkserver's parent), as a spawned stage names its parent."""
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/cmdline", "rb") as cmdline:
            if b"multiprocessing.forkserver" not in cmdline.read():
                return parent
        with open(f"/proc/{parent}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return parent


def _log(method, began, seconds):
    with _LOCK:
        if not _OUT:
            name = f"{_starter()}-{os.getpid()}.tsv"
            _OUT.append(open(os.path.join(_FOLDER, name), "a", buffering=1))
        thread = threading.current_thread().name.replace("\\t", " ")
        _OUT[0].write(f"{began:.6f}\\t{seconds:.6f}\\t{method}\\t{thread}\\n")


def _patch(module):
    inner = module.RetryingStorage._call

    def _call(self, method, *args, **kwargs):
        if getattr(_DEPTH, "n", 0):  # a call inside a call: counted once, by the outer
            return inner(self, method, *args, **kwargs)
        _DEPTH.n = 1
        began, t0 = time.time(), time.perf_counter()
        try:
            return inner(self, method, *args, **kwargs)
        finally:
            _DEPTH.n = 0
            _log(method, began, time.perf_counter() - t0)

    module.RetryingStorage._call = _call


class _Finder(importlib.abc.MetaPathFinder):
    busy = False

    def find_spec(self, fullname, path, target=None):
        if fullname != "nas.storage.retrying" or self.busy:
            return None
        self.busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy = False
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if _FOLDER:
    sys.meta_path.insert(0, _Finder())
_HERE = os.path.dirname(os.path.abspath(__file__))
for _entry in sys.path:  # a sitecustomize this one shadows
    _other = os.path.join(os.path.abspath(_entry or "."), "sitecustomize.py")
    if os.path.dirname(_other) != _HERE and os.path.exists(_other):
        runpy.run_path(_other)
        break
'''
STORAGE_METHOD = (
    "probe (the reported share): every storage call of every worker process, timed where it "
    "is made: a sitecustomize.py on the workers' PYTHONPATH (no production file changed) "
    "wraps nas.storage.retrying.RetryingStorage._call, the one door of a server storage's calls "
    "(the harness's, rank 0's decisions, sampler, pruner and heartbeat thread), and logs "
    "each call's start, seconds, method and thread. For a counted trial, storage_s is the "
    "time its worker's processes spent inside storage calls, other than the heartbeat "
    "thread's, within the trial's wall (datetime_start to datetime_complete, calls clipped "
    "to it); share = storage_s / wall; share_of_trial_wall and storage_s_per_trial are "
    "the medians over the run's counted trials. heartbeat_s: the heartbeat thread's calls "
    "in the same window (in the background, beside training: not on the trial's path, "
    "though they take a core's time). share_of_worker_time: every call outside the "
    "heartbeat thread, trials and the gaps between them and start-up alike, over W x the "
    "run's wall. The probe's own cost: one line written per call (microseconds; calls take "
    "milliseconds). Cross-checks: server = PostgreSQL's pg_stat_database over the run "
    "(read after every connection of the last run had ended and again once the workers' "
    "connections had ended): xact_commit + xact_rollback less this script's own reads "
    "(about two per call that reaches the database: SQLAlchemy's pool_pre_ping runs its "
    "liveness check in a transaction of its own on psycopg2, then Optuna's RDB storage "
    "commits the call's; a call answered from Optuna's cache makes none; opening a storage "
    "makes several) and active_time, the seconds the "
    "server spent executing statements, a lower bound of the storage's cost. "
    "outside_build_and_train: a trial's wall less its `seconds` user attr (building and "
    "training): asking, sampling, compiling the model, the writes at its end and the "
    "broadcasts between stages, an upper bound of the storage's time in a trial except "
    "the report at each evaluation, which falls inside training."
)


def task_overrides(args: argparse.Namespace) -> list[str]:
    """The fixed task every worker trains (the tests' CHEAP study, scaled by --steps)."""
    return [
        "stages=[search]",
        "task=charlm",
        f"task.options.seq_len={args.seq_len}",
        f"train.steps={args.steps}",
        f"train.eval_every={args.steps // 3 or args.steps}",
        f"train.eval_batches={args.eval_batches}",
        "train.batch_size=16",
        "search_space.d_model=[32]",
        "search_space.max_cells=1",
        f"pipeline.n_stages={STAGES}",
        "tracker=none",
    ]


# -- the server --------------------------------------------------------------------------------
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


_queries = 0  # this script's own transactions on the server (each `_query` is one)


def _query(url: str, sql: str, **params: Any) -> list[dict[str, Any]]:
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
    row = _query(url, "SELECT * FROM pg_stat_database WHERE datname = current_database()")[0]
    keys = ("xact_commit", "xact_rollback", "active_time", "tup_returned", "tup_inserted")
    return {k: None if row.get(k) is None else float(row[k]) for k in keys}


def quiet(url: str, timeout_s: float = 60.0) -> int:
    """End this script's own idle connections (the storages it read through),
    then wait until no other client is connected: a backend's statistics reach
    pg_stat_database for sure when it ends. How many were still connected at the timeout."""
    _query(
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
    while (left := int(_query(url, sql)[0]["n"])) and time.monotonic() < deadline:
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


# -- what the study recorded ------------------------------------------------------------------
def _seconds(t: FrozenTrial) -> float | None:
    if t.datetime_start is None or t.datetime_complete is None:
        return None
    return (t.datetime_complete - t.datetime_start).total_seconds()


def study_figures(trials: list[FrozenTrial], wall: float, n: int, cores: int) -> dict[str, Any]:
    done = [t for t in trials if counted(t)]
    walls = [s for t in done if (s := _seconds(t)) is not None]
    trained = [
        (s, float(t.user_attrs["seconds"]))
        for t in done
        if (s := _seconds(t)) is not None and "seconds" in t.user_attrs
    ]
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    span = (max(ends) - min(starts)).total_seconds() if starts and ends else None
    per_hour = 3600 * len(done) / wall
    return {
        "workers": n,
        "wall_s": wall,
        "trials_stored": len(trials),
        "trials_counted": len(done),
        "states": dict(collections.Counter(t.state.name for t in trials)),
        "trials_per_worker": sorted(
            collections.Counter(str(t.user_attrs.get(OWNER)) for t in done).values()
        ),
        "trials_per_hour": per_hour,
        "trials_per_hour_per_core": per_hour / cores,
        "first_start_to_last_end_s": span,
        "trials_per_hour_first_start_to_last_end": 3600 * len(done) / span if span else None,
        "trial_wall_s": walls,
        "trial_build_and_train_s": [b for _, b in trained],
        "trial_outside_build_and_train_s": [s - b for s, b in trained],
        "median_trial_wall_s": statistics.median(walls) if walls else None,
    }


# -- the storage's cost ------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One storage call a worker's process made (the probe's record)."""

    parent: int  # the process that started this one (a stage's: its worker)
    pid: int
    began: float  # time.time()
    seconds: float
    method: str
    thread: str


def read_calls(folder: Path) -> list[Call]:
    calls = []
    for path in folder.glob("*.tsv"):
        parent, pid = (int(p) for p in path.stem.split("-"))
        for line in path.read_text().splitlines():
            fields = line.split("\t")
            if len(fields) == 4:  # a process killed mid-line leaves a partial one
                began, seconds, method, thread = fields
                calls.append(Call(parent, pid, float(began), float(seconds), method, thread))
    return calls


def _overlap(call: Call, start: float, stop: float) -> float:
    return max(0.0, min(stop, call.began + call.seconds) - max(start, call.began))


def storage_figures(
    trials: list[FrozenTrial],
    calls: list[Call],
    figures: dict[str, Any],
    counters: tuple[dict[str, float | None], dict[str, float | None]],
    own: int,
) -> dict[str, Any]:
    """The storage's cost per counted trial and its share of the trial's wall time
    (STORAGE_METHOD)."""
    by_worker: dict[int, list[Call]] = collections.defaultdict(list)
    for call in calls:  # a worker's calls: its own and its stage processes'
        by_worker[call.pid].append(call)
        if call.parent != call.pid:
            by_worker[call.parent].append(call)
    per_trial = []
    for t in trials:
        wall, owner = _seconds(t), str(t.user_attrs.get(OWNER, ""))
        if not counted(t) or wall is None or not wall > 0 or not owner.rpartition(":")[2]:
            continue
        assert t.datetime_start is not None
        start = t.datetime_start.timestamp()  # naive local time, as time.time() is
        mine = by_worker.get(int(owner.rpartition(":")[2]), [])
        blocking = sum(_overlap(c, start, start + wall) for c in mine if c.thread != HEARTBEAT)
        beats = sum(_overlap(c, start, start + wall) for c in mine if c.thread == HEARTBEAT)
        per_trial.append(
            {
                "trial": t.number,
                "wall_s": wall,
                "storage_s": blocking,
                "heartbeat_s": beats,
                "share": blocking / wall,
            }
        )
    methods: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for call in calls:
        methods[call.method][0] += 1
        methods[call.method][1] += call.seconds
    on_path = sum(c.seconds for c in calls if c.thread != HEARTBEAT)
    done = max(1, figures["trials_counted"])
    before, after = counters

    def delta(key: str) -> float | None:
        a, b = after.get(key), before.get(key)
        return None if a is None or b is None else a - b

    both = (delta("xact_commit") or 0) + (delta("xact_rollback") or 0)
    transactions = max(0, int(both) - own)  # less this script's own reads of the counters
    active = delta("active_time")
    outside = figures["trial_outside_build_and_train_s"]
    wall = figures["median_trial_wall_s"]

    def median(key: str) -> float | None:
        return statistics.median(p[key] for p in per_trial) if per_trial else None

    return {
        "share_of_trial_wall": median("share"),
        "storage_s_per_trial": median("storage_s"),
        "heartbeat_s_per_trial": median("heartbeat_s"),
        "per_trial": per_trial,
        "calls": len(calls),
        "calls_per_trial": len(calls) / done,
        "storage_s_all_calls": sum(c.seconds for c in calls),
        "share_of_worker_time": on_path / (figures["workers"] * figures["wall_s"]),
        "by_method": {
            m: {"calls": int(n), "seconds": s}
            for m, (n, s) in sorted(methods.items(), key=lambda kv: -kv[1][1])
        },
        "server_transactions": transactions,
        "server_transactions_per_trial": transactions / done,
        "server_active_s_per_trial": None if active is None else active / 1000 / done,
        "server_active_share_of_trial_wall": (
            active / 1000 / done / wall if active is not None and wall else None
        ),
        "server_rows_inserted": delta("tup_inserted"),
        "median_outside_build_and_train_s": statistics.median(outside) if outside else None,
        "outside_build_and_train_share_of_trial_wall": (
            statistics.median(outside) / wall if outside and wall else None
        ),
    }


# -- one run, the summary, the table -----------------------------------------------------------
def one_run(
    root: Path, url: str, args: argparse.Namespace, n: int, round_: int, cores: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    name = f"scaling-w{n}-r{round_}"
    overrides = [*task_overrides(args), f"study.name={name}", f"study.n_trials={args.trials}"]
    calls = root / name / "calls"
    calls.mkdir(parents=True)
    quiet(url)  # the last run's connections, ours included, are gone
    mine = _queries
    before = server_counters(url)
    load = os.getloadavg()
    wall, _, failures = run_workers(root / name, url, overrides, n, args.timeout_s, calls)
    still = quiet(url)
    own = _queries - mine  # the reading of `before` and the waits: in the window
    after = server_counters(url)
    try:
        study = optuna.load_study(study_name=name, storage=make_storage(url))
        trials = study.get_trials(deepcopy=False)
    except KeyError:  # no worker got as far as creating the study (they failed)
        trials = []
    figures = study_figures(trials, wall, n, cores)
    figures |= {"round": round_, "study": name, "load_average_1_5_15_before": load}
    recorded = read_calls(calls)
    if not recorded and not failures:  # the probe did not hook: no share to report
        failures = [
            {
                "worker": None,
                "returncode": 0,
                "timed_out": False,
                "run_dir": str(calls),
                "stderr_tail": "the probe recorded no storage call (its hook failed)",
            }
        ]
    storage = storage_figures(trials, recorded, figures, (before, after), own)
    figures["storage"] = storage | {"connections_left_at_counter_read": still}
    return figures, [f | {"study": name, "workers": n} for f in failures]


def _spread(values: list[float]) -> dict[str, float | list[float] | None]:
    return {
        "median": statistics.median(values) if values else None,
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "rounds": values,
    }


def summarise(runs: list[dict[str, Any]], counts: list[int]) -> dict[str, Any]:
    def pick(n: int, get: Callable[[dict[str, Any]], Any]) -> list[float]:
        return [float(v) for r in runs if r["workers"] == n and (v := get(r)) is not None]

    measures: dict[str, Callable[[dict[str, Any]], Any]] = {
        "trials_per_hour": lambda r: r["trials_per_hour"],
        "trials_per_hour_per_core": lambda r: r["trials_per_hour_per_core"],
        "trials_per_hour_first_start_to_last_end": lambda r: r[
            "trials_per_hour_first_start_to_last_end"
        ],
        "trials_counted": lambda r: r["trials_counted"],
        "median_trial_wall_s": lambda r: r["median_trial_wall_s"],
        "storage_s_per_trial": lambda r: r["storage"].get("storage_s_per_trial"),
        "storage_share_of_trial_wall": lambda r: r["storage"].get("share_of_trial_wall"),
        "storage_share_of_worker_time": lambda r: r["storage"].get("share_of_worker_time"),
        "heartbeat_s_per_trial": lambda r: r["storage"].get("heartbeat_s_per_trial"),
        "calls_per_trial": lambda r: r["storage"].get("calls_per_trial"),
        "server_transactions_per_trial": lambda r: r["storage"]["server_transactions_per_trial"],
        "server_active_share_of_trial_wall": lambda r: r["storage"][
            "server_active_share_of_trial_wall"
        ],
        "outside_build_and_train_share_of_trial_wall": lambda r: r["storage"][
            "outside_build_and_train_share_of_trial_wall"
        ],
    }
    summary: dict[str, Any] = {
        str(n): {k: _spread(pick(n, get)) for k, get in measures.items()} for n in counts
    }
    base = summary.get(str(counts[0]), {})
    for n in counts:
        ratios = {}
        for k in ("trials_per_hour", "trials_per_hour_first_start_to_last_end"):
            mine, ref = summary[str(n)][k]["median"], base.get(k, {}).get("median")
            ratios[k] = mine / ref if mine is not None and ref else None
        summary[str(n)][f"vs_{counts[0]}_worker"] = ratios
    return summary


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | None, digits: int = 0) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def print_table(summary: dict[str, Any], counts: list[int], console: Console) -> None:
    table = Table(title="one PostgreSQL study, W workers x 2 stages (medians over rounds)")
    for column in (
        "W",
        "trials/h",
        "per core",
        "first start-last end",
        f"vs W={counts[0]}",
        "trial wall s",
        "storage/trial",
        "share of trial",
        "server active",
        "outside train",
    ):
        table.add_column(column, justify="right")
    for n in counts:
        s = summary[str(n)]
        table.add_row(
            str(n),
            _num(s["trials_per_hour"]["median"]),
            _num(s["trials_per_hour_per_core"]["median"]),
            _num(s["trials_per_hour_first_start_to_last_end"]["median"]),
            _num(s[f"vs_{counts[0]}_worker"]["trials_per_hour"], 2),
            _num(s["median_trial_wall_s"]["median"], 2),
            "-"
            if s["storage_s_per_trial"]["median"] is None
            else f"{1000 * s['storage_s_per_trial']['median']:.0f} ms",
            _pct(s["storage_share_of_trial_wall"]["median"]),
            _pct(s["server_active_share_of_trial_wall"]["median"]),
            _pct(s["outside_build_and_train_share_of_trial_wall"]["median"]),
        )
    console.print(table)


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass
class Report:
    config: dict[str, Any]
    machine: dict[str, Any]
    runs: list[dict[str, Any]] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--trials", type=int, default=8, help="study.n_trials of each study")
    parser.add_argument("--steps", type=int, default=60, help="train.steps of each trial")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--eval-batches", type=int, default=2)
    parser.add_argument("--timeout-s", type=float, default=3600.0, help="per run")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 1 round, workers 1 2, 2 trials of 2 steps"
    )
    results = Path(__file__).parent / "results" / "study_scaling.json"
    parser.add_argument(
        "--out", type=Path, default=None, help=f"default {results} (--quick: in the temp dir)"
    )
    args = parser.parse_args()
    if args.quick:
        args.workers, args.rounds, args.trials = [1, 2], 1, 2
        args.steps, args.seq_len, args.eval_batches = 2, 16, 1
    if args.out is None:  # a smoke run never replaces the measured figures
        args.out = (
            Path(tempfile.gettempdir()) / "study_scaling_quick.json" if args.quick else results
        )
    os.environ["PGAPPNAME"] = APP  # this script's connections; the workers' env drops it
    console = Console(width=None if sys.stdout.isatty() else 160)
    cores = usable_cores()
    report = Report(
        config={
            "workers": args.workers,
            "rounds": args.rounds,
            "study_n_trials": args.trials,
            "stages_per_worker": STAGES,
            "threads_per_stage": 1,
            "worker_overrides": task_overrides(args),
            "sampler": "evolution (conf/config.yaml's default)",
            "quick": args.quick,
            "order": "rounds interleaved: each round runs every worker count once",
        },
        machine={
            "cpu_count": os.cpu_count(),
            "usable_cores": cores,
            "torch": _version("torch"),
            "optuna": _version("optuna"),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    )
    folder = Path(tempfile.mkdtemp(prefix="study-scaling-"))  # the workers' run folders
    database = Path(tempfile.mkdtemp(prefix="study-scaling-db-"))  # made traversable by it
    started = time.perf_counter()
    try:
        url = start_server(database)
        report.machine["postgres"] = _query(url, "SELECT version() AS v")[0]["v"]
        make_storage(url)  # Optuna's tables, made once: not by W workers racing on them
        report.config["storage"] = masked(url)
        console.print(f"PostgreSQL at {masked(url)}; {cores} usable cores")
        for round_ in range(args.rounds):
            for n in args.workers:
                run, failures = one_run(folder, url, args, n, round_, cores)
                report.runs.append(run)
                share = run["storage"].get("share_of_trial_wall")
                console.print(
                    f"round {round_ + 1}/{args.rounds}, {n} worker(s): "
                    f"{run['trials_counted']} trials in {run['wall_s']:.1f} s: "
                    f"{run['trials_per_hour']:.0f} trials/h "
                    f"({run['trials_per_hour_per_core']:.0f} per core), trial "
                    f"{_num(run['median_trial_wall_s'], 2)} s, storage {_pct(share)} of it"
                )
                if failures:
                    report.failures.extend(failures)
                    break
            if report.failures:
                break
    finally:
        stop_server(database)
        shutil.rmtree(database, ignore_errors=True)
        if report.failures:  # the failed workers' run folders and job logs stay
            console.print(f"kept {folder} (the workers' run folders)")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    summary = summarise(report.runs, args.workers)
    out = {
        "config": report.config | {"wall_s": time.perf_counter() - started},
        "machine": report.machine,
        "storage_method": STORAGE_METHOD,
        "summary": summary,
        "runs": report.runs,
        "failures": report.failures,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
    if report.runs:
        print_table(summary, args.workers, console)
    for f in report.failures:
        how = "timed out" if f["timed_out"] else f"exited {f['returncode']}"
        who = "the probe" if f["worker"] is None else f"worker {f['worker']}"
        print(
            f"{who} of {f['study']} ({f['workers']} workers) {how}; "
            f"its run folder {f['run_dir']}; the end of its stderr:\n{f['stderr_tail']}",
            file=sys.stderr,
        )
    console.print(f"JSON: {args.out}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
