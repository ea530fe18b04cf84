"""The README's first command's job, timed beside an earlier tree's, in turns, as on a new machine.

Why it exists (issue 54): a user's first look at the project is `python -m nas
experiment=small_cpu` on a machine it has never run on, and its search and its retraining
each have a goal against the tree the issue was filed on. Their times swing by a third from
run to run on a 2-core machine (the candidates the two workers draw, a slow spell of the
machine), so the two trees run in turns (this, the other, this, ...) and the medians are
compared.

Each run: a new scratch folder as the working directory (the study, its run folder, the
exported model), an empty `XDG_CACHE_HOME` (no cost cache, no runtime overheads measured, no
matplotlib font cache: a new machine), W&B offline, and `PYTHONPATH=<tree>` so that the
installed `nas` is the tree's own; the search is timed from the process's start to the job
log's "search done" line, the retraining from there to the process's end (the report
included). The other tree is checked out as a detached git worktree of `--against` beside
this one and removed after.

Writes benchmarks/results/first_command.json: every run, the medians per tree, and the
faster share (1 - this tree's median / the other's) of the search, the retraining and the
whole job; the load average before and after.

    python benchmarks/first_command.py [--against 8bf955e] [--runs 4] [--out F]
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _run import RESULTS, Clock, first_paragraph, git, print_json, write_json

HERE = Path(__file__).resolve().parent.parent  # this tree
JOB = ("-m", "nas", "experiment=small_cpu")
SEARCH_DONE = "search done"


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--against", default="8bf955e", help="the other tree's git revision")
    parser.add_argument("--runs", type=int, default=4, help="runs of each tree, in turns")
    parser.add_argument("--out", type=Path, default=RESULTS / "first_command.json")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    clock = Clock()
    with tempfile.TemporaryDirectory(prefix="first-command-") as scratch:
        other = Path(scratch) / "other"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(other), args.against],
            cwd=HERE,
            check=True,
            capture_output=True,
        )
        try:
            trees = {"this": HERE, "other": other}
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
            for turn in range(args.runs):
                for name, tree in trees.items():
                    runs[name].append(timed_run(tree, Path(scratch) / f"{name}-{turn}"))
                    print(f"{name} {turn + 1}/{args.runs}: {runs[name][-1]}", flush=True)
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(other)], cwd=HERE, check=False
            )
    report = {
        "this_commit": git(HERE, "rev-parse", "HEAD"),
        "against": args.against,
        "runs_each": args.runs,
        "medians_s": {name: medians(each) for name, each in runs.items()},
        "faster_share": faster(medians(runs["this"]), medians(runs["other"])),
        "runs": runs,
        "wall_s": clock.seconds(),
        **clock.load_average(),
    }
    write_json(args.out, report)
    print_json(report, ["against", "medians_s", "faster_share"])


def timed_run(tree: Path, folder: Path) -> dict[str, Any]:
    """One run of the job on `tree` in `folder`, as on a new machine (module doc)."""
    folder.mkdir(parents=True)
    cache = folder / "cache"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "WANDB_MODE": "offline"}
    env["PYTHONPATH"] = str(tree)
    started = time.time()
    done = subprocess.run(
        [sys.executable, *JOB], cwd=folder, env=env, capture_output=True, text=True, check=False
    )
    ended = time.time()
    if done.returncode != 0:
        raise RuntimeError(f"the job on {tree} failed ({done.returncode}): {done.stderr[-2000:]}")
    searched = _logged_at(folder, SEARCH_DONE)
    return {
        "search_s": searched - started,
        "retrain_s": ended - searched,
        "total_s": ended - started,
    }


def _logged_at(folder: Path, text: str) -> float:
    """When the job log's first line holding `text` was written (seconds since the epoch)."""
    [log] = (folder / "outputs" / "runs").glob("*/*/elastic-nas.log")
    for line in log.read_text().splitlines():
        if text in line:
            stamp = line[1 : line.index("]")]  # "[2026-12-01 01:05:39,261][..."
            return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()
    raise RuntimeError(f"{log} has no line with {text!r}")


def medians(each: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each timed part over `each` run."""
    return {
        key: statistics.median(run[key] for run in each)
        for key in ("search_s", "retrain_s", "total_s")
    }


def faster(this: dict[str, float], other: dict[str, float]) -> dict[str, float]:
    """How much shorter this tree's median is than the other's, as a share of the other's."""
    return {key: 1 - this[key] / other[key] for key in this}


if __name__ == "__main__":
    main()
