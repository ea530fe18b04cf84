"""The inherited estimates of `fidelity.py`: one worker process per training seed, pinned
to a core of its own (at most one per core at a time), trains each parent (a seed model) to
the full budget, then its control and each of its children k steps from its weights.

Why it exists: `fidelity.py` is the entry point (the truth, the rungs, the agreement); the
inherited runs run in processes of their own (`fidelity.py --inherited-worker FOLDER SEED`)
and are their own concern.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import pickle
import queue
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from _run import usable_cores

from nas.retrain.stage import Model
from nas.settings import NasSettings
from search_spaces.architecture import from_json
from search_spaces.edited import edited_tensors

ENTRY = Path(__file__).with_name("fidelity.py")  # whose --inherited-worker runs a seed
CONTINUATION_SEED = 1000  # the inherited runs' batches: seed + this, an order no run saw


def inherited(
    settings: NasSettings,
    parents: dict[str, Model],
    drawn: list[Any],
    ks: list[int],
    folder: Path,
) -> tuple[dict[str, dict[str, float]], list[dict[str, dict[str, float]]], dict[str, float]]:
    """The inherited estimates (the mean over seeds, and each seed's: child - its parent's
    control), one worker process per training seed on a core of its own, and the core-seconds
    each estimate took per seed; a seed whose figures `folder` holds is not run again.
    `drawn`: `fidelity.Drawn`s (a model, its parent's name, its edits)."""
    folder.mkdir(parents=True, exist_ok=True)
    one = replace(settings.pipeline, n_stages=1, threads_per_stage=1, n_microbatches=1)
    job = {
        "settings": replace(settings, pipeline=one),  # one stage process on one core
        "parents": parents,
        "children": [(d.model, d.parent, [(e.name, e.old, e.new) for e in d.edits]) for d in drawn],
        "ks": ks,
    }
    (folder / "job.pkl").write_bytes(pickle.dumps(job))
    left = [s for s in settings.retrain.seeds if not (folder / f"seed-{s}.json").exists()]
    _run_seeds(folder, left, usable_cores())
    per_seed = [
        json.loads((folder / f"seed-{seed}.json").read_text()) for seed in settings.retrain.seeds
    ]
    labels = [f"{variant}@{k}" for variant in ("inherited", "inherited-all") for k in ks]
    seeds: list[dict[str, dict[str, float]]] = [
        {
            f"{variant}@{k}": {
                d.model.name: s[variant][str(k)][d.model.name] - s["control"][str(k)][d.parent]
                for d in drawn
            }
            for variant in ("inherited", "inherited-all")
            for k in ks
        }
        for s in per_seed
    ]
    estimates = {
        label: {name: statistics.fmean(seed[label][name] for seed in seeds) for name in rows}
        for label, rows in seeds[0].items()
    }
    seconds = {label: statistics.fmean(s["seconds"][label] for s in per_seed) for label in labels}
    return estimates, seeds, seconds


def _run_seeds(folder: Path, seeds: list[int], cores: list[int]) -> None:
    """A worker process per seed, each pinned to a core no other worker runs on: at most one
    per core at a time (a seed waits for a free core), so each seed's seconds are one
    core's. SystemExit if a worker failed."""
    free: queue.Queue[int] = queue.Queue()
    for core in cores:
        free.put(core)

    def run(seed: int) -> int:
        core = free.get()
        try:
            command = [sys.executable, str(ENTRY), "--inherited-worker", str(folder), str(seed)]
            return subprocess.run(command, env=dict(os.environ, FIDELITY_CORE=str(core))).returncode
        finally:
            free.put(core)

    with ThreadPoolExecutor(len(cores)) as pool:
        if any(pool.map(run, seeds)):
            raise SystemExit("an inherited worker failed (its traceback is above)")


def inherited_worker(folder: Path, seed: int) -> None:
    """One seed's inherited runs in one stage process (`--inherited-worker`)."""
    import pipeline

    core = os.environ.get("FIDELITY_CORE")
    if core and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, [int(core)])
    job = pickle.loads((folder / "job.pkl").read_bytes())
    result = pipeline.launch(
        functools.partial(_continue, job=job, seed=seed), 1, threads_per_stage=1, timeout_s=600
    )[0]
    (folder / f"seed-{seed}.json").write_text(json.dumps(result))


def _continue(ctx: Any, job: dict[str, Any], seed: int) -> dict[str, Any]:
    """(In the stage process) train each parent to the full budget with `seed`, then its
    control and each of its children k steps from its weights (module doc); their
    validation losses, and the seconds each estimate took (its parents' controls included;
    the parents' full runs are the truth's)."""
    from nas.study import training
    from nas.tasks import get_task

    settings: NasSettings = job["settings"]
    task = get_task(settings.task.name, **settings.task.options)
    out: dict[str, Any] = {"control": {}, "inherited": {}, "inherited-all": {}, "seconds": {}}
    for k in job["ks"]:
        for variant in ("control", "inherited", "inherited-all"):
            out[variant][str(k)] = {}
        out["seconds"] |= {f"inherited@{k}": 0.0, f"inherited-all@{k}": 0.0}
    for name, parent in job["parents"].items():
        trained = _build(settings, task, parent, seed, settings.train.steps)
        source = training.batches(task, settings.train.batch_size, seed)
        for _ in training.steps(trained, source, start=0, count=settings.train.steps):
            pass
        snapshot = trained.snapshot()
        trained.close()
        children = [c for c in job["children"] if c[1] == name]
        for k in job["ks"]:
            pipe = _build(settings, task, parent, seed, k)
            started = time.perf_counter()
            out["control"][str(k)][name] = _score(pipe, settings, task, parent, snapshot, seed, k)
            control_s = time.perf_counter() - started
            for variant in ("inherited", "inherited-all"):
                out["seconds"][f"{variant}@{k}"] += control_s
            for model, _, edits in children:
                fresh = _fresh(edits, from_json(model.architecture))
                for variant, weights in (
                    ("inherited", snapshot.without(fresh)),
                    ("inherited-all", snapshot),
                ):
                    started = time.perf_counter()
                    out[variant][str(k)][model.name] = _score(
                        pipe, settings, task, model, weights, seed, k
                    )
                    out["seconds"][f"{variant}@{k}"] += time.perf_counter() - started
            pipe.close()
    return out


def _fresh(edits: list[tuple[str, Any, Any]], child: Any) -> list[str]:
    """The tensors of `child` its edits touch (those start afresh); an edit whose parameter
    the child no longer asks (its second edit removed it) touches none."""
    fresh: list[str] = []
    for edit in edits:
        try:
            fresh += edited_tensors(*edit, child)
        except ValueError:
            continue
    return fresh


def _build(settings: NasSettings, task: Any, model: Model, seed: int, steps: int) -> Any:
    """A pipeline of `model` trained at a `steps`-step schedule (`nas.study.training.build`)."""
    from nas.study import training

    arch = from_json(model.architecture)
    specs = training.compile_model(arch, task, settings.train.dropout)[0]
    return training.build(settings, task, specs, training.rates(settings.train, steps), seed=seed)


def _score(
    pipe: Any, settings: NasSettings, task: Any, model: Model, source: Any, seed: int, k: int
) -> float:
    """`model` on `pipe` from the weights `source`, k steps on the continuation batches; its
    validation loss on `train.eval_batches`."""
    from nas.study import training

    train = settings.train
    specs = training.compile_model(from_json(model.architecture), task, train.dropout)[0]
    pipe.reconfigure(specs, inherit_from=source)
    batches = training.batches(task, train.batch_size, seed + CONTINUATION_SEED)
    for _ in training.steps(pipe, itertools.islice(batches, k), start=0, count=k):
        pass
    return float(training.evaluate(train, task, pipe, final=False)["validation_loss"])
