"""NAS trials per hour: warm `reconfigure` between trials vs a process restart per trial.

The same 8-trial study (translation task, regularized evolution seeded with the Transformer
and the Evolved Transformer, 2 stages, CPU gloo, 1 thread each) runs twice:

* warm: one `run_study`: the stage processes live for the whole study and every candidate
  is a `reconfigure` (planned from the cost cache);
* cold: the study is grown one trial at a time, each step a fresh `run_study` (new stage
  processes, new process group, new pipeline, empty cost cache), as a harness without
  elasticity would run it.

Both use the same sampler and seed (a cold run's sampler restarts with each launch, so its
later proposals may differ; the two seeds are the same in both).

Reported: wall seconds, trials per hour and their ratio; the best trial's
validation loss and parameters beside the two seeds' (trained with the same budget, they
are the study's first two trials); and the same evolution study with and without
`study.inherit_weights` (the best validation loss over time, and the best each reached by
the time the shorter run ended).

    python benchmarks/nas_study.py [--trials 8] [--steps 30]   # JSON in benchmarks/results/

(Not `benchmarks/nas.py`: run as a script, it would shadow the `nas` package.)
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna

from nas.settings import (
    NasSettings,
    SamplerSettings,
    SearchSpaceSettings,
    StudySettings,
    TrackerSettings,
    TrainSettings,
)
from nas.study.run import run_study
from nas.study.trials import counted


def settings(root: Path, name: str, trials: int, steps: int, inherit: bool) -> NasSettings:
    return NasSettings(
        study=StudySettings(name=name, n_trials=trials, inherit_weights=inherit),
        train=TrainSettings(steps=steps, batch_size=16, eval_every=steps, eval_batches=2),
        search_space=SearchSpaceSettings(d_model=(32,), max_cells=1),
        sampler=SamplerSettings(
            name="evolution",  # as conf/sampler/evolution.yaml
            options={"population_size": 4, "sample_size": 2, "warmup": "mutate"},
        ),
        tracker=TrackerSettings(name="none"),
        output_dir=str(root / name),
        studies_dir=str(root / "studies"),
    )


def summarise(s: NasSettings, seconds: float) -> dict[str, Any]:
    study = optuna.load_study(study_name=s.study.name, storage=s.storage_url)
    done = [t for t in study.trials if counted(t)]
    complete = [t for t in done if t.state == optuna.trial.TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.values[0])
    elapsed = [
        (t.datetime_complete - study.trials[0].datetime_start).total_seconds()
        for t in complete
        if t.datetime_complete and study.trials[0].datetime_start
    ]
    best_at = elapsed[complete.index(best)] if elapsed else None
    curve, running = [], math.inf  # (seconds into the study, best validation loss so far)
    for t, at in sorted(zip(complete, elapsed, strict=True), key=lambda pair: pair[1]):
        running = min(running, t.values[0])
        curve.append([at, running])
    return {
        "seconds": seconds,
        "trials": len(done),
        "trials_per_hour": 3600 * len(done) / seconds,
        "best": {
            "trial": best.number,
            "validation_loss": best.values[0],
            "parameters": best.user_attrs.get("parameters"),
            "architecture": best.user_attrs.get("architecture"),
            "reached_after_s": best_at,
        },
        "best_so_far": curve,
        "seeds": [
            {
                "trial": t.number,
                "validation_loss": t.values[0] if t.values else None,
                "parameters": t.user_attrs.get("parameters"),
            }
            for t in study.trials[:2]
        ],
    }


def warm(root: Path, name: str, trials: int, steps: int, inherit: bool = False) -> dict[str, Any]:
    s = settings(root, name, trials, steps, inherit)
    start = time.perf_counter()
    run_study(s)
    return summarise(s, time.perf_counter() - start)


def cold(root: Path, trials: int, steps: int) -> dict[str, Any]:
    s = settings(root, "cold", trials, steps, False)
    start = time.perf_counter()
    for k in range(1, trials + 1):  # fresh processes for every trial
        run_study(replace(s, study=replace(s.study, n_trials=k)))
    return summarise(s, time.perf_counter() - start)


def compare_inheritance(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """The same evolution study without and with inherited weights: the best validation
    loss each had reached by the time the shorter of the two ended (per hour of study)."""
    horizon = min(off["seconds"], on["seconds"])

    def by(curve: list[list[float]]) -> float | None:
        reached = [best for at, best in curve if at <= horizon]
        return reached[-1] if reached else None

    return {
        "off": off["best"],
        "on": on["best"],
        "horizon_s": horizon,
        "best_by_horizon": {"off": by(off["best_so_far"]), "on": by(on["best_so_far"])},
        "best_so_far": {"off": off["best_so_far"], "on": on["best_so_far"]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "nas_study.json"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        out = {
            "config": vars(args) | {"out": str(args.out)},
            "warm": warm(root, "warm", args.trials, args.steps),
            "cold": cold(root, args.trials, args.steps),
        }
        out["warm_vs_cold_trials_per_hour"] = (
            out["warm"]["trials_per_hour"] / out["cold"]["trials_per_hour"]
        )
        inherit = warm(root, "inherit", args.trials, args.steps, inherit=True)
        out["inherit_weights"] = compare_inheritance(out["warm"], inherit)
    text = json.dumps(out, indent=2, default=str)
    print(text)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
