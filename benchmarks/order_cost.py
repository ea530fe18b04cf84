"""Does a change to the runtime cost throughput? Two source trees, our schedules, one run.

Why it exists: a change to how messages are posted (tag-free, in order, grouped so that
NCCL cannot deadlock, say) must leave `benchmarks/schedules.py`'s figures unchanged
within noise, measured before and after in the same run. The two runtimes cannot share a
process (both are the package `pipeline`), so this runs each tree's runtime in processes of
its own, alternating the trees round by round (before, after; then after, before) so that
drift of the machine hits both alike:

    round 1:  [before: every schedule x M]  [after: every schedule x M]
    round 2:  [after: ...]                  [before: ...]
    ...

Each round is one `pipeline.launch` of 2 ranks (CPU gloo, 1 thread each) on the stack of
`benchmarks/throughput.py` (8 Transformer layers, d256, sequence 64, batch 32), the same
fixed partition [4, 4] for every tree (the planner's choice is not what is compared), and
uses only the public API both trees have. Flushed schedules time `train_step`; stream
schedules (2bw, pipemare) time a stream of `--steps` steps per round through `pipe.train`.
Figures: samples/s from the median step time per tree, and the after/before ratio with the
spread of the per-round ratios. Writes benchmarks/results/order_cost.json.

    git worktree add /tmp/before <commit>
    python benchmarks/order_cost.py --before /tmp/before [--after .] [--rounds 6]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _run import first_line, git, write_json

HERE = Path(__file__).resolve().parent
SCHEDULES = ("gpipe", "1f1b", "zbh1", "2bw", "pipemare")
MICROBATCHES = (4, 8)
PARTITION = [4, 4]


def child(steps: int, warmup: int, out: Path) -> None:
    """One round in this tree (imported from PYTHONPATH): per-step seconds per config."""
    import pipeline

    result = pipeline.launch(
        functools.partial(_time_all, steps=steps, warmup=warmup),
        2,
        threads_per_stage=1,
        timeout_s=600.0,
    )[0]
    out.write_text(json.dumps(result))


def _time_all(ctx: Any, steps: int, warmup: int) -> dict[str, float]:
    from throughput import batch, ours_pipeline

    from pipeline import PlanOptions

    x, y = batch()
    seconds: dict[str, float] = {}
    for name, m in itertools.product(SCHEDULES, MICROBATCHES):
        pipe = ours_pipeline(name, m, PlanOptions(partition=PARTITION))
        _train(pipe, name, x, y, warmup)
        started = time.perf_counter()
        _train(pipe, name, x, y, steps)
        seconds[f"{name}_M{m}"] = (time.perf_counter() - started) / steps
    return seconds


def _train(pipe: Any, name: str, x: Any, y: Any, steps: int) -> None:
    """`steps` steps: one stream through `pipe.train` (2bw, pipemare) or `train_step`s."""
    if name in ("2bw", "pipemare"):
        for _ in pipe.train(itertools.repeat((x, y), steps)):
            pass
    else:
        for _ in range(steps):
            pipe.train_step(x, y)


def run_round(tree: Path, steps: int, warmup: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "round.json"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)])}
        subprocess.run(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                str(out),
                "--steps",
                str(steps),
                "--warmup",
                str(warmup),
            ],
            env=env,
            check=True,
            cwd=tmp,
        )
        result: dict[str, float] = json.loads(out.read_text())
        return result


def _commit(tree: Path) -> str:
    dirty = git(tree, "status", "--porcelain", "--", "pipeline")
    return git(tree, "rev-parse", "HEAD") + (
        " (+ uncommitted changes in pipeline/)" if dirty else ""
    )


def summarize(rounds: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    from throughput import BATCH

    table: dict[str, Any] = {}
    for key in rounds["before"][0]:
        before = [r[key] for r in rounds["before"]]
        after = [r[key] for r in rounds["after"]]
        ratios = [b / a for b, a in zip(before, after, strict=True)]  # > 1: after is faster
        table[key] = {
            "samples_per_s_before": BATCH / statistics.median(before),
            "samples_per_s_after": BATCH / statistics.median(after),
            "ratio_after_over_before": statistics.median(before) / statistics.median(after),
            "per_round_ratio_min_max": [min(ratios), max(ratios)],
            "step_s_before": before,
            "step_s_after": after,
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--before", type=Path, help="the tree before the change")
    parser.add_argument("--after", type=Path, default=HERE.parent)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "order_cost.json")
    args = parser.parse_args()
    if args.child is not None:
        child(args.steps, args.warmup, args.child)
        return
    if args.before is None:
        parser.error("--before TREE is required (a checkout of the commit before the change)")
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    rounds: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    started = time.perf_counter()
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for label in order:
            rounds[label].append(run_round(trees[label], args.steps, args.warmup))
            print(f"round {r + 1}/{args.rounds}: {label} done", flush=True)
    table = summarize(rounds)
    report = {
        "config": {
            "trees": {k: {"path": str(v), "commit": _commit(v)} for k, v in trees.items()},
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "warmup": args.warmup,
            "partition": PARTITION,
            "stages": 2,
            "threads_per_stage": 1,
            "wall_s": time.perf_counter() - started,
            "load_average": os.getloadavg(),
        },
        "by_config": table,
    }
    write_json(args.out, report)
    print(f"{'config':<14}{'before':>10}{'after':>10}{'ratio':>8}  per-round ratio range")
    for key, row in table.items():
        lo, hi = row["per_round_ratio_min_max"]
        print(
            f"{key:<14}{row['samples_per_s_before']:>10.1f}{row['samples_per_s_after']:>10.1f}"
            f"{row['ratio_after_over_before']:>8.3f}  [{lo:.3f}, {hi:.3f}]"
        )


if __name__ == "__main__":
    main()
