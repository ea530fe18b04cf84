"""How much of the machine a search uses: the harness's shapes beside a plain PyTorch loop.

Why it exists (issue 41): a NAS harness is judged by what it learns per hour of machine. The
candidates of `search_2h` are small (the Evolved Transformer at d_model 64, batch 32), and a
pipeline pays its bubble and per-micro-batch overheads for nothing on them; `auto` shapes the
machine from the profile (`nas.study.shape`): workers x stages x threads x micro-batches.

Per model (the `search_2h` seeds, the ET and the Transformer; and a larger candidate, the ET
at `paper_like`'s widest d_model 128 with 3 cells per side), samples per second of training
(no evaluation), each the median step time over `--steps` steps after `--warmup`:

* plain PyTorch: the same layers in one process, one loop (forward, loss, backward, the
  same optimizer), on 1 thread, on 2 threads, and one 1-thread loop per core run at the
  same time (summed: what the cores give a loop each, the yardstick of the goal);
* the harness, a trial's pipeline exactly (`nas.study.training.build`, the machine's cost cache):
  the shapes of issue 41's table (2 stages x 1 thread at 4 and 2 micro-batches, 1 stage x
  2 threads at 4, 1 stage x 1 thread at 1) and the shape `auto` chooses, each with W
  workers run at the same time, pinned to their cores (summed), and `auto`'s prediction;
* for the large candidate also `auto` under a memory budget one stage cannot hold.

Then a slice of the `search_2h` study (`--slice-min` minutes of wall time, search only, a
fresh SQLite study each) with the old default (2 stages x 1 thread, 4 micro-batches, one
worker) and with `auto`, one after the other: candidates finished per hour (complete and
pruned), full-budget candidates per hour and training steps per hour.

Auto's slice may instead be read from the first `--slice-min` minutes of a stored `search_2h`
study that ran on the default shape from scratch (`--auto-slice-study`: the headline study of
`search_quality.py`), the trials finished by then per hour of those minutes.

Run it alone on an idle machine: the JSON records the load average before and after. One
process's measurement is in `search_throughput_runs.py`, the slices in
`search_throughput_slices.py`.

    python benchmarks/search_throughput.py [--steps 300] [--large-steps 40] [--slice-min 30]
        [--skip-slices] [--models evolved_transformer transformer large_evolved_transformer]
    # the slices alone, auto's from a stored study, the rest of the JSON kept
    python benchmarks/search_throughput.py --keep --models --slice-modes old_default \
        --auto-slice-study sqlite:///out/studies/search_2h.db search_2h 2026-11-27T10:37:39
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from _run import RESULTS, Clock, first_line, usable_cores, write_json
from common import experiment_settings
from search_throughput_runs import architecture, harness, plain
from search_throughput_slices import search_slices

OUT = RESULTS / "search_throughput.json"
OLD_DEFAULT = (1, 2, 1, 4)  # workers, stages, threads per stage, micro-batches
TABLE_SHAPES = [OLD_DEFAULT, (1, 2, 1, 2), (1, 1, 2, 4), (1, 1, 1, 1)]
MODELS = ("evolved_transformer", "transformer", "large_evolved_transformer")


def _one(args: argparse.Namespace) -> None:
    """`--one plain|harness`: print one process's samples/s as JSON."""
    if args.one == "plain":
        rate = plain(args.model, args.threads, args.steps, args.warmup)
    else:
        shape = (1, args.stages, args.threads, args.microbatches)
        rate = harness(args.model, shape, args.steps, args.warmup)
    print(json.dumps({"samples_per_s": rate}))


# -- the driver ---------------------------------------------------------------------------------
def concurrently(commands: list[list[str]], cores_each: int) -> list[float]:
    """Run the commands at once, command k pinned to cores [k*c, (k+1)*c); their rates."""
    cores = usable_cores()
    procs = []
    for k, command in enumerate(commands):
        mine = cores[k * cores_each : (k + 1) * cores_each] or cores
        procs.append(
            subprocess.Popen(
                ["taskset", "-c", ",".join(map(str, mine)), *command],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    rates: list[float] = []
    for proc in procs:
        out, _ = proc.communicate(timeout=3600)
        if proc.returncode:
            raise RuntimeError(f"{commands[len(rates)]} failed with {proc.returncode}")
        rates.append(json.loads(out.strip().splitlines()[-1])["samples_per_s"])
    return rates


def _key(row: dict[str, Any]) -> tuple[int, int, int, int]:
    return (row["workers"], row["n_stages"], row["threads_per_stage"], row["n_microbatches"])


def me(*extra: str, args: argparse.Namespace) -> list[str]:
    """This script measuring one thing; the large candidate takes `--large-steps` steps."""
    large = "large_evolved_transformer" in extra
    steps, warmup = (args.large_steps, args.warmup // 4) if large else (args.steps, args.warmup)
    return [sys.executable, __file__, *extra, f"--steps={steps}", f"--warmup={warmup}"]


def _plain(model: str, args: argparse.Namespace, n_cores: int) -> dict[str, Any]:
    """The plain loop on 1 thread, on 2 threads, and one 1-thread loop per core at once."""
    out: dict[str, Any] = {}
    one_plain = me("--one", "plain", "--model", model, "--threads", "1", args=args)
    out["plain_1_thread"] = concurrently([one_plain], 1)[0]
    out["plain_2_threads"] = concurrently(
        [me("--one", "plain", "--model", model, "--threads", "2", args=args)], 2
    )[0]
    per_core = concurrently([one_plain] * n_cores, 1)
    out["plain_per_core_at_once"] = {"each": per_core, "sum": sum(per_core)}
    return out


def _harness_rows(
    model: str, args: argparse.Namespace, choice: Any, auto_key: tuple[int, int, int, int]
) -> dict[str, dict[str, Any]]:
    """The harness in each of the table's shapes and `auto`'s, W workers at once."""
    harness_rows: dict[str, dict[str, Any]] = {}
    for w, s, t, m in [*TABLE_SHAPES, auto_key]:
        name = f"{w}x{s}x{t}@{m}"
        if name in harness_rows:
            harness_rows[name]["is_auto"] = True
            continue
        command = me(
            "--one",
            "harness",
            "--model",
            model,
            "--stages",
            str(s),
            "--threads",
            str(t),
            "--microbatches",
            str(m),
            args=args,
        )
        rates = concurrently([command] * w, s * t)
        predicted = next(
            (row["predicted_samples_per_s"] for row in choice.tried if _key(row) == (w, s, t, m)),
            None,
        )
        harness_rows[name] = {
            "workers": w,
            "stages": s,
            "threads_per_stage": t,
            "microbatches": m,
            "each": rates,
            "samples_per_s": sum(rates),
            "predicted_samples_per_s": predicted,
            "is_auto": (w, s, t, m) == auto_key,
        }
        print(f"  {model} {name}: {sum(rates):.0f} samples/s (predicted {predicted})", flush=True)
    return harness_rows


def measure_model(model: str, args: argparse.Namespace, n_cores: int) -> dict[str, Any]:
    from nas.study import shape

    out = _plain(model, args, n_cores)
    settings = experiment_settings("search_2h", [])
    _, choice = shape.resolve(settings, architectures=[architecture(model)])
    assert choice is not None
    auto = choice.shape
    auto_key = (auto.workers, auto.n_stages, auto.threads_per_stage, auto.n_microbatches)
    harness_rows = _harness_rows(model, args, choice, auto_key)
    out["harness"] = harness_rows
    out["auto"] = {"shape": str(auto), **choice.to_dict()}
    out["auto"].pop("tried")
    w, s, t, m = auto_key
    auto_rate = float(harness_rows[f"{w}x{s}x{t}@{m}"]["samples_per_s"])
    old = float(harness_rows["{}x{}x{}@{}".format(*OLD_DEFAULT)]["samples_per_s"])
    plain_1 = float(out["plain_1_thread"])
    per_core = out["plain_per_core_at_once"]["sum"]
    out["ratios"] = {
        "auto_over_plain_per_core_sum": auto_rate / per_core,
        "auto_over_ideal_plain_1_thread_x_cores": auto_rate / (n_cores * plain_1),
        "auto_over_old_default": auto_rate / old,
    }
    return out


def large_under_budget(model: str) -> dict[str, Any]:
    """`auto` for the large candidate when one stage may hold 60% of its single-stage peak."""
    from nas.study import shape

    arch = [architecture(model)]
    one = experiment_settings(
        "search_2h", ["pipeline.n_stages=1", "study.workers=1", "pipeline.n_microbatches=1"]
    )
    _, alone = shape.resolve(one, architectures=arch)
    assert alone is not None
    peak = int(alone.tried[0]["predicted_peak_bytes"])
    for fraction in (0.6, 0.45, 0.35, 0.25, 0.18):
        budget = int(fraction * peak)
        settings = experiment_settings("search_2h", [f"pipeline.memory_budget={budget}"])
        _, choice = shape.resolve(settings, architectures=arch)
        assert choice is not None
        if all(row["reason"] for row in choice.tried if row["n_stages"] == 1):
            return {
                "single_stage_peak_bytes": peak,
                "memory_budget": budget,
                "chosen": str(choice.shape),
                "chosen_peak_bytes": choice.predicted_peak_bytes,
                "predicted_samples_per_s": choice.predicted_samples_per_s,
            }
    return {"single_stage_peak_bytes": peak, "chosen": None, "note": "one stage fit every budget"}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--large-steps", type=int, default=40, help="the large candidate's")
    parser.add_argument("--slice-min", type=float, default=30.0)
    parser.add_argument("--skip-slices", action="store_true")
    parser.add_argument("--slice-modes", nargs="*", default=["old_default", "auto"])
    parser.add_argument(
        "--slice-overrides", nargs="*", default=[], help="Hydra overrides of every slice"
    )
    parser.add_argument(
        "--auto-slice-study",
        nargs=3,
        metavar=("STORAGE", "NAME", "STARTED"),
        help="take auto's slice from the first --slice-min minutes of a stored search_2h study "
        "started (its command) at STARTED, ISO time, instead of running one",
    )
    parser.add_argument(
        "--keep", action="store_true", help="update --out: keep what this run does not measure"
    )
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--one", choices=["plain", "harness"])
    parser.add_argument("--model", default="evolved_transformer")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stages", type=int, default=1)
    parser.add_argument("--microbatches", type=int, default=1)
    args = parser.parse_args()
    return args


def main() -> None:
    args = _arguments()
    if args.one:
        _one(args)
        return
    from nas.study import shape

    clock = Clock()
    n_cores = shape.cores()
    kept = json.loads(args.out.read_text()) if args.keep and args.out.exists() else {}
    results: dict[str, Any] = {**kept, "by_model": kept.get("by_model", {})}
    for model in args.models:
        print(f"{model}:", flush=True)
        results["by_model"][model] = measure_model(model, args, n_cores)
    if "large_evolved_transformer" in args.models:
        results["large_under_memory_budget"] = large_under_budget("large_evolved_transformer")
    if not args.skip_slices:
        results["search_2h_slices"] = search_slices(args)
    results["config" if not kept else "config_of_the_update"] = {
        "command": "python " + " ".join(sys.argv),
        "cores": n_cores,
        "steps": args.steps,
        "warmup": args.warmup,
        "large_candidate_steps": args.large_steps,
        "large_candidate": "the ET at d_model 128 with 3 cells per side (paper_like's widest)",
        "slice_min": args.slice_min,
        "slice_overrides": args.slice_overrides,
        "batch": 32,
        "task": "translation (English->German names), search_2h's settings",
        "torch": torch.__version__,
        "wall_s": clock.seconds(),
        **clock.load_average(),
    }
    write_json(args.out, results, indent=1, newline=True)
    print(json.dumps({m: r["ratios"] for m, r in results["by_model"].items()}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
