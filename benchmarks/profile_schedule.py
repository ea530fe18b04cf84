"""Where a schedule's time goes: cProfile of every stage on the throughput stack.

Why it exists: where a throughput target is missed, a profile says what costs the
time. `benchmarks/schedules.py` reports each stage's compute, waits and the
rest; this shows the functions under them: autograd engine calls (a split backward makes
about seven per layer where a fused one makes one), layer kernels, waits on messages, the
runtime's own Python. It trains `--steps` steps of one schedule of ours on the stack of
`benchmarks/throughput.py` (2 stages, CPU gloo, 1 thread each), as one `pipe.train`
stream, after a warm-up, with cProfile on in every stage process, and writes the top
functions by own time per stage, and the runtime's own Python (own time in the lines of the
`pipeline` package, less its blocking waits: dispatch, bookkeeping, messages' Python side)
per step and as a share of the time, with its top functions, to
benchmarks/results/profile_<schedule>_M<m>.json.

    python benchmarks/profile_schedule.py zbh1 --microbatches 8 --steps 6
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import itertools
import pstats
import time
from pathlib import Path
from typing import Any

import torch.nn.functional as F
from _run import RESULTS, first_line, write_json
from throughput import BATCH, OPTIMIZER, STAGES, batch, specs

import pipeline
from pipeline import SCHEDULES, ElasticPipeline, StageContext


def profile(ctx: StageContext, schedule: str, m: int, steps: int, top: int) -> dict[str, Any]:
    pipe = ElasticPipeline(
        specs(), optimizer=OPTIMIZER, loss_fn=F.mse_loss, schedule=schedule, n_microbatches=m
    )
    x, y = batch()
    for _ in pipe.train(itertools.repeat((x, y), 2)):  # plan, warm up
        pass
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    for _ in pipe.train(itertools.repeat((x, y), steps)):
        pass
    profiler.disable()
    seconds = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    table = stats.stats  # type: ignore[attr-defined]
    rows = sorted(table.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    functions = [
        {"function": f"{path}:{line}({name})", "calls": nc, "own_s": tt, "cumulative_s": ct}
        for (path, line, name), (_, nc, tt, ct, _) in rows
    ]
    # the runtime's own Python: time spent in the lines of the `pipeline` package itself,
    # less its `wait` functions, whose own time is a peer's message or reduce (cProfile books
    # the C call `Work.wait` to its Python caller)
    package = str(Path(pipeline.__file__).parent)
    ours = {key: row for key, row in table.items() if key[0].startswith(package)}
    runtime_s = sum(tt for (_, _, name), (_, _, tt, _, _) in ours.items() if name != "wait")
    runtime_top = sorted(ours.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    pipe.close()
    return {
        "stage": ctx.rank,
        "seconds": seconds,
        "samples_per_s": BATCH * steps / seconds,
        "runtime_python_s_per_step": runtime_s / steps,
        "runtime_python_share": runtime_s / seconds,
        "runtime_top_by_own_time": [
            {"function": f"{Path(path).name}:{line}({name})", "calls": nc, "own_s": tt}
            for (path, line, name), (_, nc, tt, _, _) in runtime_top
        ],
        "top_by_own_time": functions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("schedule", choices=sorted(SCHEDULES))
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    run = functools.partial(
        profile, schedule=args.schedule, m=args.microbatches, steps=args.steps, top=args.top
    )
    stages = pipeline.launch(run, STAGES, threads_per_stage=1, timeout_s=1200)
    out = RESULTS / f"profile_{args.schedule}_M{args.microbatches}.json"
    write_json(out, {"config": vars(args), "stages": stages}, indent=1)
    for stage in stages:
        print(
            f"stage {stage['stage']}: {stage['samples_per_s']:.1f} samples/s, the runtime's "
            f"own Python {stage['runtime_python_share']:.1%} of the time"
        )
        for row in stage["top_by_own_time"][:8]:
            print(f"  {row['own_s']:7.3f} s own  {row['calls']:6d} calls  {row['function']}")


if __name__ == "__main__":
    main()
