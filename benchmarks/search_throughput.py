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

Run it alone on an idle machine: the JSON records the load average before and after.

    python benchmarks/search_throughput.py [--steps 300] [--large-steps 40] [--slice-min 30]
        [--skip-slices] [--models evolved_transformer transformer large_evolved_transformer]
    # the slices alone, auto's from a stored study, the rest of the JSON kept
    python benchmarks/search_throughput.py --keep --models --slice-modes old_default \
        --auto-slice-study sqlite:///out/studies/search_2h.db search_2h 2026-11-27T10:37:39
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from common import experiment_settings

OUT = Path(__file__).parent / "results" / "search_throughput.json"
OLD_DEFAULT = (1, 2, 1, 4)  # workers, stages, threads per stage, micro-batches
TABLE_SHAPES = [OLD_DEFAULT, (1, 2, 1, 2), (1, 1, 2, 4), (1, 1, 1, 1)]
MODELS = ("evolved_transformer", "transformer", "large_evolved_transformer")


def architecture(name: str) -> Any:
    from nas.study import trials
    from search_spaces.evolved_transformer import evolved_transformer

    if name == "large_evolved_transformer":
        return evolved_transformer(128, n_heads=4, n_enc=3, n_dec=3)
    return trials.seed_architectures(experiment_settings("search_2h", []))[name]


# -- one measurement, in a process of its own (pinned to its cores) ---------------------------
def plain(model: str, threads: int, steps: int, warmup: int) -> float:
    from nas.study import training
    from nas.tasks import get_task
    from pipeline.local.spec import build_layer

    torch.set_num_threads(threads)
    settings = experiment_settings("search_2h", [])
    task = get_task("translation")
    specs, _ = training.compile_model(architecture(model), task, settings.train.dropout)
    layers = [build_layer(spec, 0, torch.device("cpu")) for spec in specs]
    params = [p for layer in layers for p in layer.parameters()]
    optimizer = training.rates(settings.train).optimizer()([{"params": params}])
    source = training.batches(task, settings.train.batch_size, 0)
    times = []
    for step in range(warmup + steps):
        x, y = next(source)
        started = time.perf_counter()
        out = x
        for layer in layers:
            out = layer(out)
        loss = task.loss_fn(out, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= warmup:
            times.append(time.perf_counter() - started)
    return settings.train.batch_size / statistics.median(times)


def _harness_stage(ctx: Any, model: str, settings: Any, steps: int, warmup: int) -> float:
    from nas.study import shape, training
    from nas.tasks import get_task

    task = get_task("translation")
    specs, _ = training.compile_model(architecture(model), task, settings.train.dropout)
    schedule = training.rates(settings.train)
    pipe = training.build(settings, task, specs, schedule, seed=0, cost_cache=shape.load_cache())
    source = training.batches(task, settings.train.batch_size, 0)
    times = []
    for step in range(warmup + steps):
        x, y = next(source)
        started = time.perf_counter()
        pipe.train_step(x, y)
        if step >= warmup:
            times.append(time.perf_counter() - started)
    pipe.close()
    return settings.train.batch_size / statistics.median(times)


def harness(model: str, shape: tuple[int, int, int, int], steps: int, warmup: int) -> float:
    import functools

    import pipeline

    _, stages, threads, microbatches = shape
    settings = experiment_settings(
        "search_2h",
        [
            f"pipeline.n_stages={stages}",
            f"pipeline.threads_per_stage={threads}",
            f"pipeline.n_microbatches={microbatches}",
            "study.workers=1",
        ],
    )
    run = functools.partial(
        _harness_stage, model=model, settings=settings, steps=steps, warmup=warmup
    )
    return float(pipeline.launch(run, stages, threads_per_stage=threads, timeout_s=900)[0])


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
    cores = sorted(os.sched_getaffinity(0))
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


def measure_model(model: str, args: argparse.Namespace, n_cores: int) -> dict[str, Any]:
    from nas.study import shape

    out: dict[str, Any] = {}
    one_plain = me("--one", "plain", "--model", model, "--threads", "1", args=args)
    out["plain_1_thread"] = concurrently([one_plain], 1)[0]
    out["plain_2_threads"] = concurrently(
        [me("--one", "plain", "--model", model, "--threads", "2", args=args)], 2
    )[0]
    per_core = concurrently([one_plain] * n_cores, 1)
    out["plain_per_core_at_once"] = {"each": per_core, "sum": sum(per_core)}
    settings = experiment_settings("search_2h", [])
    _, choice = shape.resolve(settings, architectures=[architecture(model)])
    assert choice is not None
    auto = choice.shape
    auto_key = (auto.workers, auto.n_stages, auto.threads_per_stage, auto.n_microbatches)
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
            (
                row["predicted_samples_per_s"]
                for row in choice.tried
                if (
                    row["workers"],
                    row["n_stages"],
                    row["threads_per_stage"],
                    row["n_microbatches"],
                )
                == (w, s, t, m)
            ),
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
    out["harness"] = harness_rows
    out["auto"] = {"shape": str(auto), **choice.to_dict()}
    out["auto"].pop("tried")
    w, s, t, m = auto_key
    auto_rate = float(harness_rows[f"{w}x{s}x{t}@{m}"]["samples_per_s"])
    old = float(harness_rows["{}x{}x{}@{}".format(*OLD_DEFAULT)]["samples_per_s"])
    plain_1 = float(out["plain_1_thread"])
    out["ratios"] = {
        "auto_over_plain_per_core_sum": auto_rate / sum(per_core),
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


def search_slice(
    mode: str, minutes: float, folder: Path, overrides: list[str] | None = None
) -> dict[str, Any]:
    """`search_2h` for `minutes` of wall time (search only, a fresh study), old or auto,
    with Hydra `overrides` after the experiment's."""
    import optuna

    from nas.study.trials import counted

    name = f"slice-{mode}"
    shape_args = ["pipeline=cpu_2_stages", "study.workers=1"] if mode == "old_default" else []
    command = [
        sys.executable,
        "-m",
        "nas",
        "experiment=search_2h",
        "stages=[search]",
        "tracker=none",
        f"study.name={name}",
        f"study.timeout_s={minutes * 60}",
        "study.time_budget_s=null",
        f"studies_dir={folder / 'studies'}",
        f"hydra.run.dir={folder / name}",
        *shape_args,
        *(overrides or []),
    ]
    started = time.perf_counter()
    subprocess.run(command, check=True, cwd=folder, stdout=subprocess.DEVNULL)
    wall_s = time.perf_counter() - started
    study = optuna.load_study(
        study_name=name, storage=f"sqlite:///{folder / 'studies' / f'{name}.db'}"
    )
    return _slice_figures([t for t in study.trials if counted(t)], wall_s)


def stored_slice(storage: str, name: str, started: str, minutes: float) -> dict[str, Any]:
    """The first `minutes` of a stored `search_2h` study started (its command) at `started`
    (ISO time): the trials finished by then, per hour of those minutes."""
    import optuna

    from nas.study.trials import counted

    end = datetime.fromisoformat(started).timestamp() + 60 * minutes
    study = optuna.load_study(study_name=name, storage=storage)
    done = [
        t
        for t in study.trials
        if counted(t) and t.datetime_complete and t.datetime_complete.timestamp() <= end
    ]
    return {**_slice_figures(done, 60 * minutes), "from_study": f"{storage} {name}"}


def _slice_figures(done: list[Any], wall_s: float) -> dict[str, Any]:
    """Candidates, full-budget candidates and steps per hour of `done` (counted trials)."""
    import optuna

    complete = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    inherited = [t for t in complete if t.user_attrs.get("fidelity") == "inherited"]
    full = [t for t in complete if t not in inherited]
    # each parent's control (study.fidelity=inherited) trains as many steps as a child, once
    controls = {t.user_attrs["inherited_from"]: int(t.user_attrs["steps"]) for t in inherited}
    steps = sum(int(t.user_attrs.get("steps", 0)) for t in done) + sum(controls.values())
    hours = wall_s / 3600
    return {
        "wall_s": wall_s,
        "shape": done[0].user_attrs.get("shape") if done else None,
        "finished": len(done),
        "complete_full_budget": len(full),
        "complete_inherited": len(inherited),
        "controls": len(controls),
        "pruned": sum(t.state == optuna.trial.TrialState.PRUNED for t in done),
        "steps_trained": steps,
        "candidates_per_h": len(done) / hours,
        "full_budget_candidates_per_h": len(full) / hours,
        "steps_per_h": steps / hours,
        "best_validation_loss": min((t.values[0] for t in full), default=None),
        "best_estimate": min((t.values[0] for t in inherited), default=None),
    }


def _slices(args: argparse.Namespace) -> dict[str, Any]:
    """The `search_2h` slices, old default and auto, and auto's ratios over the old."""
    slices: dict[str, Any] = {}
    if args.auto_slice_study:
        storage, name, started = args.auto_slice_study
        slices["auto"] = stored_slice(storage, name, started, args.slice_min)
    with tempfile.TemporaryDirectory() as tmp:
        for mode in args.slice_modes:
            if mode not in slices:
                slices[mode] = search_slice(mode, args.slice_min, Path(tmp), args.slice_overrides)
    if {"auto", "old_default"} <= slices.keys():
        slices["auto_over_old_default"] = {
            key: slices["auto"][key] / max(slices["old_default"][key], 1e-9)
            for key in ("candidates_per_h", "full_budget_candidates_per_h", "steps_per_h")
        }
    return slices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
    if args.one:
        _one(args)
        return
    from nas.study import shape

    load_before, started = os.getloadavg(), time.perf_counter()
    n_cores = shape.cores()
    kept = json.loads(args.out.read_text()) if args.keep and args.out.exists() else {}
    results: dict[str, Any] = {**kept, "by_model": kept.get("by_model", {})}
    for model in args.models:
        print(f"{model}:", flush=True)
        results["by_model"][model] = measure_model(model, args, n_cores)
    if "large_evolved_transformer" in args.models:
        results["large_under_memory_budget"] = large_under_budget("large_evolved_transformer")
    if not args.skip_slices:
        results["search_2h_slices"] = _slices(args)
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
        "wall_s": time.perf_counter() - started,
        "load_average_1_5_15_before": load_before,
        "load_average_1_5_15_after": os.getloadavg(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({m: r["ratios"] for m, r in results["by_model"].items()}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
