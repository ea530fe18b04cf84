"""How much of a trial's wall time goes to the storage, as `study_scaling.py` measures it.

Why it exists: the measurement needs a probe in every worker process (a sitecustomize.py
put first on the workers' PYTHONPATH, never installed, no production file changed) and the
arithmetic that clips each recorded storage call to the trial it fell in and sets it
against the server's own counters; both are apart from running the workers
(`study_scaling_workers.py`) and the entry point (`study_scaling.py`).
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from nas.study.trials import OWNER, counted

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


def trial_seconds(t: FrozenTrial) -> float | None:
    """A trial's wall seconds, start to completion (None before it completed)."""
    if t.datetime_start is None or t.datetime_complete is None:
        return None
    return (t.datetime_complete - t.datetime_start).total_seconds()


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


def _per_trial(trials: list[FrozenTrial], calls: list[Call]) -> list[dict[str, Any]]:
    """Per counted trial: its wall, its worker's storage calls within it (the heartbeat
    thread's apart) and their share of the wall."""
    by_worker: dict[int, list[Call]] = collections.defaultdict(list)
    for call in calls:  # a worker's calls: its own and its stage processes'
        by_worker[call.pid].append(call)
        if call.parent != call.pid:
            by_worker[call.parent].append(call)
    per_trial = []
    for t in trials:
        wall, owner = trial_seconds(t), str(t.user_attrs.get(OWNER, ""))
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
    return per_trial


def _server(
    counters: tuple[dict[str, float | None], dict[str, float | None]], own: int
) -> tuple[int, float | None, float | None]:
    """The server's transactions over the run less this script's own `own`, its active
    milliseconds, and the rows it inserted."""
    before, after = counters

    def delta(key: str) -> float | None:
        a, b = after.get(key), before.get(key)
        return None if a is None or b is None else a - b

    both = (delta("xact_commit") or 0) + (delta("xact_rollback") or 0)
    return max(0, int(both) - own), delta("active_time"), delta("tup_inserted")


def storage_figures(
    trials: list[FrozenTrial],
    calls: list[Call],
    figures: dict[str, Any],
    counters: tuple[dict[str, float | None], dict[str, float | None]],
    own: int,
) -> dict[str, Any]:
    """The storage's cost per counted trial and its share of the trial's wall time
    (STORAGE_METHOD)."""
    per_trial = _per_trial(trials, calls)
    methods: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
    for call in calls:
        methods[call.method][0] += 1
        methods[call.method][1] += call.seconds
    on_path = sum(c.seconds for c in calls if c.thread != HEARTBEAT)
    done = max(1, figures["trials_counted"])
    transactions, active, inserted = _server(counters, own)
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
        "server_rows_inserted": inserted,
        "median_outside_build_and_train_s": statistics.median(outside) if outside else None,
        "outside_build_and_train_share_of_trial_wall": (
            statistics.median(outside) / wall if outside and wall else None
        ),
    }
