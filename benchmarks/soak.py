"""A study under a night of faults: a seeded schedule of them over a long two-worker study.

Why it exists (issue 53): each fault the harness handles was tried once, alone; users run
searches for hours on shared machines where faults come together and keep coming. This
runs `search_2h`'s study (inherited fidelity and promotion on) as a cluster would: two
worker commands (`python -m nas ... stages=[search,retrain]`, one core each) on one
PostgreSQL study (the project's throw-away server), their weights in the study's artifact
store, each started again with the same command whenever it dies (`soak_supervisor`),
while a nemesis injects a seeded schedule of faults, one every `--every` seconds
(`soak_faults`: workers and stage processes killed with SIGKILL, the database stopped and
restarted or killed, the store read-only or full, a parent's weights damaged), through the
search and the retraining after it. Then the storage and the files are audited
(`soak_accounting`): nothing lost, nothing done twice, nothing left running.

Side by side, in the same run: the same study without faults (`--arms clean faults`), its
search alone, for the candidates per hour a fault costs.

    python benchmarks/soak.py [--minutes 45] [--every 60 120] [--seed 0]
        [--arms clean faults] [--reuse] [--deadline-minutes 240] [--work DIR] [overrides ...]

Each arm's record is kept as `<work>/<arm>.json` once it ends; `--reuse` reads an arm
recorded there instead of running it again (the arm that ran before a soak was stopped).

Run it alone on an idle machine, as root (the store is a tmpfs it mounts and remounts):
the JSON (`results/soak.json`) holds the schedule, what each fault hit, the accounting
of each arm, the throughput of both and the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import optuna
from _run import RESULTS, Clock, first_paragraph, write_json
from soak_accounting import account, candidates_per_hour
from soak_faults import FaultKind, Nemesis, Store, schedule
from soak_supervisor import Command, Supervisor

from nas.storage.postgres import Postgres

OUT = RESULTS / "soak.json"
STUDY = "soak"
TICK_S = 0.5
logger = logging.getLogger("soak")


def worker_commands(arm: Path, url: str, args: argparse.Namespace, stages: str) -> list[Command]:
    """The two workers' commands (the same every time each is started), one core each."""
    commands = []
    for k in range(2):
        argv = [
            "taskset",
            "-c",
            str(k),
            sys.executable,
            "-m",
            "nas",
            f"experiment={args.experiment}",
            f"study.name={STUDY}",
            f"study.storage={url}",
            "study.workers=1",
            "pipeline.n_stages=1",
            "pipeline.threads_per_stage=1",
            "pipeline.n_microbatches=2",
            f"study.time_budget_s={args.minutes * 60:g}",
            f"studies_dir={arm / 'studies'}",
            f"retrain.models_dir={arm / 'models'}",
            f"hydra.run.dir={arm / f'worker-{k}'}",
            f"stages=[{stages}]",
            *args.overrides,
        ]
        commands.append(Command(f"worker-{k}", argv, arm / f"worker-{k}.out"))
    return commands


def run_arm(name: str, args: argparse.Namespace, faults: bool) -> dict[str, Any]:
    """One arm: its server, store and workers; the nemesis on `faults`; the audit."""
    arm = args.work / name
    shutil.rmtree(arm, ignore_errors=True)
    arm.mkdir(parents=True)
    database = Postgres(arm / "db").start()
    store = Store(arm / "studies" / "artifacts")
    commands = worker_commands(arm, database.url, args, "search,retrain" if faults else "search")
    supervisor = Supervisor(commands)
    end_s = args.deadline_minutes * 60
    plan = schedule(args.seed, 60.0, end_s, tuple(args.every), list(FaultKind)) if faults else []
    nemesis = Nemesis(plan, commands, database, store, args.seed)
    started = time.monotonic()
    try:
        supervisor.start()
        while supervisor.poll():
            now = time.monotonic() - started
            if now > end_s:
                break
            nemesis.tick(now)
            time.sleep(TICK_S)
    finally:  # whatever happened: the faults healed and every command ended
        nemesis.heal_all(time.monotonic() - started)
        hung = supervisor.stop()
    try:
        study = optuna.load_study(study_name=STUDY, storage=database.url)
        damaged = [f.detail for f in plan if f.kind == FaultKind.ARTIFACT_DAMAGED and f.injected_s]
        logs = [arm / f"worker-{k}" / "elastic-nas.log" for k in range(2)]
        audit = account(
            study, store.folder, logs, arm / "models" / STUDY if faults else None, damaged
        )
        rate = candidates_per_hour(study)
    finally:
        store.close()
        database.stop()
    injected = [f for f in plan if f.injected_s is not None]
    return {
        "wall_s": time.monotonic() - started,
        "throughput": rate,
        "restarts": supervisor.restarts,
        "exits": {c.name: c.exits for c in commands},
        "hung": hung,
        "faults_injected": len(injected),
        "faults_by_kind": {k.value: sum(f.kind == k for f in injected) for k in FaultKind},
        "schedule": [asdict(f) for f in plan],
        "accounting": audit,
        "violations": sum(len(check["violations"]) for check in audit.values()),
    }


def recorded_arm(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """The arm's record: read from `<work>/<name>.json` with `--reuse`, else run and kept."""
    kept = args.work / f"{name}.json"
    if args.reuse and kept.exists():
        logger.info("%s: the arm recorded in %s", name, kept)
        record: dict[str, Any] = json.loads(kept.read_text())
        return record
    record = run_arm(name, args, faults=name == "faults")
    kept.write_text(json.dumps(record, indent=1, default=str))
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--minutes", type=float, default=45.0, help="search budget of each arm")
    parser.add_argument("--every", type=float, nargs=2, default=[60.0, 120.0])
    parser.add_argument("--seed", type=int, default=0, help="the fault schedule's seed")
    parser.add_argument(
        "--arms", nargs="+", default=["clean", "faults"], choices=["clean", "faults"]
    )
    parser.add_argument(
        "--reuse", action="store_true", help="read arms recorded under --work, not run them"
    )
    parser.add_argument("--deadline-minutes", type=float, default=240.0)
    parser.add_argument("--experiment", default="search_2h")
    parser.add_argument("--work", type=Path, default=None, help="default: a temporary folder")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("overrides", nargs="*", help="settings for every worker (key=value)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.work = args.work or Path(tempfile.mkdtemp(prefix="soak-"))
    clock = Clock()
    arms = {name: recorded_arm(name, args) for name in args.arms}
    document: dict[str, Any] = {
        "what": first_paragraph(__doc__),
        "command": " ".join(sys.argv),
        "seed": args.seed,
        "minutes": args.minutes,
        "every_s": args.every,
        "arms": arms,
        **clock.load_average(),
        "wall_s": clock.seconds(),
    }
    if "clean" in arms and "faults" in arms:
        clean = arms["clean"]["throughput"]["per_hour"]
        document["throughput_ratio"] = (
            arms["faults"]["throughput"]["per_hour"] / clean if clean else None
        )
    write_json(args.out, document)
    print(json.dumps({k: v for k, v in document.items() if k != "arms"}, indent=2, default=str))


if __name__ == "__main__":
    main()
