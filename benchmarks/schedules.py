"""Every pipeline schedule we have against every one torch.distributed.pipelining runs on 2 ranks.

Why it exists: this runtime's schedules (whatever
`pipeline.pure.schedule.SCHEDULES` holds when it runs: gpipe and 1f1b, and zbh1, 2bw,
pipemare, bipartition and the rest) should beat torch's best schedule on the throughput
stack, and this keeps a record of where each wins and what costs the time where one loses.
It measures them all side by side in one run, on the stack of `benchmarks/throughput.py`
(8 Transformer layers, d_model 256, sequence 64, batch 32, 2 ranks, CPU gloo, 1 thread per
rank), at M=4 and M=8 micro-batches:

* ours: one `ElasticPipeline` per registered schedule (partition "auto"); a schedule that
  raises is recorded with its error and left out;
* torch: ScheduleGPipe and Schedule1F1B (one stage per rank), ScheduleInterleaved1F1B and
  ScheduleInterleavedZeroBubble (the 8 layers in 4 chunks of 2, rank r holds chunks r and
  r+2), ScheduleZBVZeroBubble (V layout: rank 0 holds chunks 0 and 3, rank 1 holds 1 and 2).
  Each is checked before it is timed: one step with dropout off (eval mode) must give the
  single process's loss (within 1e-5) and its gradients;
* one process: the whole stack on rank 0, gradient accumulation over the M micro-batches
  (rank 1 waits at the barrier meanwhile);
* the perfect split, a bound rather than a schedule: both ranks train their half of the
  stack at the same time with no messages and no bubble (`perfect_split`). No schedule that
  does the same compute on two ranks beats it, so a target above it cannot be met here.

All runs live in the same two processes and are timed in interleaved rounds (`timed_rounds`),
so drift of the machine hits them alike; figures are medians over rounds, raw per-round step
times are kept. Beside the measured samples/s: the ratio to one process and to torch's best
correct schedule at that M, the flush bound S*M/(M+S-1) x one process, ours' simulated
throughput (the plan's predicted iteration: `pipeline.pure.simulate` on the profiled costs,
and a replay of the schedule on the measured per-stage costs), ours' per-stage time breakdown
(compute, waits, the rest), and per-stage peak memory. Writes
benchmarks/results/schedules.json and prints a summary table. The runs are built in
`schedules_runs.py` (torch's, checked, by `_torch_peer.py`).

    python benchmarks/schedules.py [--rounds 12] [--steps 1] [--quick] [--timelines DIR]
"""

from __future__ import annotations

import argparse
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from _run import RESULTS, Clock, fastest, first_line, git, median_rate, samples_per_s, write_json
from common import on_ranks, timed_rounds
from schedules_runs import (
    EXACT,
    GRAD_TOLERANCE,
    LOSS_TOLERANCE,
    TORCH_SCHEDULES,
    TorchRun,
    ours_record,
    ours_run,
    perfect_split,
    reference_loss_with_dropout,
    single_process,
    torch_reference,
    torch_run,
)
from throughput import BATCH, STAGES, stack_config

from pipeline import CostCache, ElasticPipeline, StageContext
from pipeline.pure.schedule import SCHEDULES

MICROBATCHES = (4, 8)
TARGETS = {"ours_best_exact_vs_torch_best": 1.05, "ours_best_vs_perfect_split": 0.95}

MEMORY_METHOD = (
    "ours: ElasticPipeline.stats() per stage: state_bytes (parameters, gradients, optimizer "
    "state) + activation_peak_bytes (tensors autograd saves plus held boundary tensors, per "
    "storage, parameters excluded, peak over a measured step); allocator_peak_bytes is GPU "
    "only (None on CPU). torch and one process: the same kind of count, not RSS: a "
    "saved_tensors_hooks counter of the live storages autograd saves (parameters excluded, "
    "deduplicated by storage, released when autograd frees them), peak over one untimed step "
    "after the timing, plus parameter + gradient + optimizer-state bytes. Process-wide "
    "ru_maxrss per rank (all runs together, so not per schedule) is given for scale."
)


def _error(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:2000]


@dataclass
class Runs:
    """Every run built in this process: its step, its record, and what it measures after
    the rounds (ours: its pipeline; torch's and one process: their memory)."""

    steps: dict[str, Callable[[], None]] = field(default_factory=dict)
    records: dict[str, dict[str, Any]] = field(default_factory=dict)
    pipes: dict[str, tuple[str, ElasticPipeline, float, float]] = field(default_factory=dict)
    torch_runs: dict[str, TorchRun] = field(default_factory=dict)
    singles: dict[str, Callable[[], Any]] = field(default_factory=dict)


# -- the run, in both processes -----------------------------------------------------------------
def _build_m(ctx: StageContext, m: int, cache: CostCache, steps: int, built: Runs) -> None:
    """Every run at M = m: ours per registered schedule, torch's, one process, the bound."""
    reference = torch_reference(m, ctx.device)
    ref_dropout = reference_loss_with_dropout(m)
    for name in sorted(SCHEDULES):
        key = f"ours_{name}_M{m}"
        built.records[key] = {"kind": "ours", "schedule": name, "exact": name in EXACT}
        try:
            step, pipe, first_loss = ours_run(name, m, cache, steps)
        except Exception as error:  # raised on every rank by the runtime
            built.records[key]["error"] = _error(error)
            continue
        built.steps[key] = step
        built.pipes[key] = (name, pipe, first_loss, ref_dropout)
    for name, (cls, layout) in TORCH_SCHEDULES.items():
        key = f"torch_{name}_M{m}"
        try:
            run = torch_run(ctx, cls, layout, m, reference)
        except Exception as error:
            built.records[key] = {"kind": "torch", "schedule": cls.__name__, "error": _error(error)}
            continue
        built.steps[key], built.torch_runs[key] = run.step, run
        built.records[key] = {
            "kind": "torch",
            "schedule": cls.__name__,
            "layout": layout,
            "check": run.check,
        }
    key = f"single_process_M{m}"
    built.steps[key], built.singles[key] = single_process(ctx, m)
    built.records[key] = {"kind": "single_process"}
    built.steps[f"perfect_split_M{m}"] = perfect_split(ctx, m)
    built.records[f"perfect_split_M{m}"] = {"kind": "bound"}


def _warm_up(built: Runs, warmup: int) -> None:
    """`warmup` steps of every run (allocator, shape inference, connections); a run that
    fails is recorded with its error and left out."""
    failed = []
    for key, step in built.steps.items():
        # ours' first step (the plan) and torch's check step were the first warm-up step
        extra = warmup if key.startswith(("single_process", "perfect_split")) else warmup - 1
        try:
            for _ in range(extra):
                step()
        except Exception as error:
            failed.append(key)
            built.records[key]["error"] = _error(error)
    for key in failed:
        del built.steps[key]
        built.pipes.pop(key, None)
        built.torch_runs.pop(key, None)


def run_all(
    ctx: StageContext, rounds: int, steps: int, warmup: int, timelines: Path | None
) -> dict[str, Any]:
    cache = CostCache()
    built = Runs()
    for m in MICROBATCHES:
        _build_m(ctx, m, cache, steps, built)
    _warm_up(built, warmup)
    seconds = timed_rounds(built.steps, rounds, steps)
    records = built.records
    memory: dict[str, Any] = {}
    for key, (name, pipe, first_loss, ref_loss) in built.pipes.items():
        records[key].update(ours_record(name, pipe, first_loss, ref_loss, timelines))
    for key, run in built.torch_runs.items():
        memory[key] = run.measure()
    for key, measure in built.singles.items():
        memory[key] = measure()
    gathered: list[Any] = [None] * ctx.world_size
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    dist.all_gather_object(gathered, (memory, rss))
    for key in memory:
        records[key]["memory_per_rank"] = [g[0].get(key) for g in gathered]
    for key, times in seconds.items():
        records[key]["per_round_step_s"] = times
    return {
        "records": records,
        "registry": sorted(SCHEDULES),
        "process_maxrss_bytes": [g[1] for g in gathered],
    }


# -- the report ---------------------------------------------------------------------------------
def _best(
    runs: dict[str, dict[str, Any]], kind: str, ok: Callable[[Mapping[str, Any]], bool]
) -> tuple[str | None, float]:
    """The fastest measured run of `kind` that passes `ok`: (name, samples/s)."""
    name = fastest(runs, lambda v: v.get("kind") == kind and ok(v))
    return name, samples_per_s(runs, name)


def summarize(records: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per M: samples/s, ratios, the bests and the `TARGETS`."""
    out: dict[str, Any] = {}
    for m in MICROBATCHES:
        mine = {k[: -len(f"_M{m}")]: v for k, v in records.items() if k.endswith(f"_M{m}")}
        for rec in mine.values():
            times = rec.get("per_round_step_s")
            if times:
                rec |= median_rate(times, BATCH)
                # the least disturbed round: a second view when the machine is shared
                rec["best_round_samples_per_s"] = BATCH / min(times)
        single = mine["single_process"]["samples_per_s"]
        bound = mine["perfect_split"]["samples_per_s"]
        flush = STAGES * m / (m + STAGES - 1)

        torch_best, torch_sps = _best(mine, "torch", lambda v: v["check"]["correct"])
        ours_best, ours_sps = _best(mine, "ours", lambda v: True)
        exact_best, exact_sps = _best(mine, "ours", lambda v: v["exact"])
        for rec in mine.values():
            if "samples_per_s" in rec:
                rec["vs_single_process"] = rec["samples_per_s"] / single
                rec["vs_torch_best"] = rec["samples_per_s"] / torch_sps
                rec["vs_flush_ideal"] = rec["samples_per_s"] / (single * flush)
            if rec.get("simulated_samples_per_s"):
                rec["simulated_vs_single_process"] = rec["simulated_samples_per_s"] / single
        out[f"M{m}"] = {
            "single_process_samples_per_s": single,
            "flush_ideal_factor": flush,
            "flush_ideal_samples_per_s": single * flush,
            "torch_best": torch_best,
            "torch_best_samples_per_s": torch_sps,
            "ours_best": ours_best,
            "ours_best_samples_per_s": ours_sps,
            "ours_best_exact": exact_best,
            "ours_best_exact_samples_per_s": exact_sps,
            "ours_best_vs_torch_best": ours_sps / torch_sps,
            "ours_best_exact_vs_torch_best": exact_sps / torch_sps,
            "perfect_split_samples_per_s": bound,
            "perfect_split_vs_torch_best": bound / torch_sps,
            "ours_best_vs_perfect_split": ours_sps / bound,
            "torch_best_vs_perfect_split": torch_sps / bound,
            "targets": TARGETS,
            "runs": mine,
        }
    return out


def print_table(by_m: dict[str, Any]) -> None:
    for label, res in by_m.items():
        print(
            f"\n{label}: one process {res['single_process_samples_per_s']:.2f} samples/s, "
            f"flush bound x{res['flush_ideal_factor']:.3f}"
        )
        print(
            f"  {'run':<24}{'samples/s':>10}{'best rnd':>10}{'x 1 proc':>10}"
            f"{'x torch best':>14}{'sim':>8}"
        )
        for name, rec in res["runs"].items():
            if "samples_per_s" not in rec:
                print(f"  {name:<24}  error: {rec.get('error', '?')[:60]}")
                continue
            sim = rec.get("simulated_samples_per_s")
            flag = "" if rec.get("check", {}).get("correct", True) else "  (INCORRECT)"
            sim_text = "" if sim is None else f"{sim:8.2f}"
            print(
                f"  {name:<24}{rec['samples_per_s']:>10.2f}"
                f"{rec['best_round_samples_per_s']:>10.2f}{rec['vs_single_process']:>10.3f}"
                f"{rec['vs_torch_best']:>14.3f}{sim_text}{flag}"
            )
        for ratio, (ours, peer) in {
            "ours_best_exact_vs_torch_best": ("ours_best_exact", "torch_best"),
            "ours_best_vs_perfect_split": ("ours_best", "perfect split"),
        }.items():
            print(
                f"  {res[ours]} / {res.get(peer, peer)}: {res[ratio]:.3f} (goal {TARGETS[ratio]})"
            )
        print(
            f"  perfect split (no messages, no bubble) / torch best: "
            f"{res['perfect_split_vs_torch_best']:.3f}"
        )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=1, help="steps per run per round")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 rounds of 1 step")
    parser.add_argument(
        "--timelines",
        type=Path,
        default=None,
        help="write ours' Chrome-trace timelines (last step) there",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "schedules.json")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup = 2, 1, 1
    if args.timelines is not None:
        args.timelines.mkdir(parents=True, exist_ok=True)
    return args


def main() -> None:
    args = _arguments()
    here = Path(__file__).parent
    commit = git(here, "rev-parse", "HEAD")
    dirty = bool(git(here, "status", "--porcelain", "--", "pipeline"))
    clock = Clock()

    result = on_ranks(
        run_all,
        STAGES,
        timeout_s=600.0,
        rounds=args.rounds,
        steps=args.steps,
        warmup=args.warmup,
        timelines=args.timelines,
    )
    by_m = summarize(result["records"])
    report = {
        "config": {
            **stack_config(list(MICROBATCHES), args),
            "warmup_steps": args.warmup,
            "quick": args.quick,
            "torch": torch.__version__,
            "git_commit": commit,
            "pipeline_dir_has_uncommitted_changes": dirty,
            "our_schedules_registered": result["registry"],
            "exact_schedules": list(EXACT),
            "check_tolerances": {"loss_abs": LOSS_TOLERANCE, "grad_rel": GRAD_TOLERANCE},
            "single_process": "rank 0 alone (rank 1 idle at the barrier), timed in the rounds",
            "wall_s": clock.seconds(),
            **clock.load_average(),
        },
        "memory_method": MEMORY_METHOD,
        "process_maxrss_bytes_per_rank": result["process_maxrss_bytes"],
        "summary": {
            label: {k: v for k, v in res.items() if k != "runs"} for label, res in by_m.items()
        },
        "by_microbatches": by_m,
    }
    write_json(args.out, report)
    print_table(by_m)


if __name__ == "__main__":
    main()
