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
its run folder kept, and the script exits 1. The server and the workers are in
`study_scaling_workers.py`, the probe and the storage's share in `study_scaling_storage.py`,
the summary and the table in `study_scaling_report.py`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from _run import RESULTS, Clock, first_line, usable_cores, write_json
from rich.console import Console
from study_scaling_report import num, pct, print_table, study_figures, summarise
from study_scaling_storage import STORAGE_METHOD, read_calls, storage_figures
from study_scaling_workers import (
    APP,
    queries_made,
    query,
    quiet,
    run_workers,
    server_counters,
    start_server,
    stop_server,
)

from nas.storage.opening import make_storage
from nas.storage.url import masked

STAGES = 2


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


# -- one run, the whole measurement -------------------------------------------------------------
def one_run(
    root: Path, url: str, args: argparse.Namespace, n: int, round_: int, cores: int
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    name = f"scaling-w{n}-r{round_}"
    overrides = [*task_overrides(args), f"study.name={name}", f"study.n_trials={args.trials}"]
    calls = root / name / "calls"
    calls.mkdir(parents=True)
    quiet(url)  # the last run's connections, ours included, are gone
    mine = queries_made()
    before = server_counters(url)
    load = os.getloadavg()
    wall, _, failures = run_workers(root / name, url, overrides, n, args.timeout_s, calls)
    still = quiet(url)
    own = queries_made() - mine  # the reading of `before` and the waits: in the window
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


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
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
    results = RESULTS / "study_scaling.json"
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
    return args


def _report(args: argparse.Namespace, cores: int) -> Report:
    """What the JSON says of the run and the machine before anything ran."""
    return Report(
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


def _measure(
    folder: Path, database: Path, args: argparse.Namespace, report: Report, console: Console
) -> None:
    """Every worker count in every round on one server, until a run fails."""
    cores = report.machine["usable_cores"]
    url = start_server(database)
    report.machine["postgres"] = query(url, "SELECT version() AS v")[0]["v"]
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
                f"{num(run['median_trial_wall_s'], 2)} s, storage {pct(share)} of it"
            )
            if failures:
                report.failures.extend(failures)
                return


def _print_failures(failures: list[dict[str, Any]]) -> None:
    for f in failures:
        how = "timed out" if f["timed_out"] else f"exited {f['returncode']}"
        who = "the probe" if f["worker"] is None else f"worker {f['worker']}"
        print(
            f"{who} of {f['study']} ({f['workers']} workers) {how}; "
            f"its run folder {f['run_dir']}; the end of its stderr:\n{f['stderr_tail']}",
            file=sys.stderr,
        )


def main() -> int:
    args = _arguments()
    os.environ["PGAPPNAME"] = APP  # this script's connections; the workers' env drops it
    console = Console(width=None if sys.stdout.isatty() else 160)
    report = _report(args, len(usable_cores()))
    folder = Path(tempfile.mkdtemp(prefix="study-scaling-"))  # the workers' run folders
    database = Path(tempfile.mkdtemp(prefix="study-scaling-db-"))  # made traversable by it
    clock = Clock()
    try:
        _measure(folder, database, args, report, console)
    finally:
        stop_server(database)
        shutil.rmtree(database, ignore_errors=True)
        if report.failures:  # the failed workers' run folders and job logs stay
            console.print(f"kept {folder} (the workers' run folders)")
        else:
            shutil.rmtree(folder, ignore_errors=True)
    summary = summarise(report.runs, args.workers)
    out = {
        "config": report.config | {"wall_s": clock.seconds()},
        "machine": report.machine,
        "storage_method": STORAGE_METHOD,
        "summary": summary,
        "runs": report.runs,
        "failures": report.failures,
    }
    write_json(args.out, out, newline=True)
    if report.runs:
        print_table(summary, args.workers, console)
    _print_failures(report.failures)
    console.print(f"JSON: {args.out}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
