"""Is there room next to the Evolved Transformer? Primer's primitives measured before searching.

A search can only find a better model than its seed if the space holds one. This benchmark
trains, at the full budget of an experiment (default `search_2h`: 1,000 steps) and with the
same training seeds for every model (a seed fixes the initialisation and the data order),
the Evolved Transformer seed and Primer's changes to it (`search_spaces.primer`):

* `evolved_transformer`                 the seed as the space builds it;
* `evolved_transformer+squared_relu`    every activation squared ReLU;
* `evolved_transformer+mdha`            every attention multi-DConv-head attention;
* `evolved_transformer+both`            both changes;
* `transformer+both`                    the Transformer seed with both changes;
* `transformer`                         the Transformer seed, for scale.

Each is retrained through the harness (`nas.retrain.stage.retrain_models`: the pipeline runtime,
whole validation and test splits, every pair decoded) and compared with the ET seed by
seed: the paired difference (mean, standard error, per-seed signs) on validation loss and
validation chrF (`nas.paired`). Test figures are reported once, never used to choose.

    python benchmarks/space_room.py [--experiment search_2h] [--seeds 1 2 3] [overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from _run import first_paragraph, write_json
from common import experiment_settings

from nas.paired import REFERENCE
from nas.retrain.stage import Model, RetrainRun, paired_metrics, retrain_models
from nas.study.space import configured_space
from search_spaces.architecture import Architecture, summary, to_json
from search_spaces.compile import parameter_count
from search_spaces.evolved_transformer import PRIMITIVES, Primitive, seed_params
from search_spaces.primer import with_primitives

ROOT = Path(__file__).resolve().parent.parent
VARIANTS: tuple[tuple[str, tuple[Primitive, ...]], ...] = (
    ("evolved_transformer", ()),
    ("evolved_transformer+squared_relu", ("squared_relu",)),
    ("evolved_transformer+mdha", ("mdha",)),
    ("evolved_transformer+both", PRIMITIVES),
    ("transformer+both", PRIMITIVES),
    ("transformer", ()),
)
METRICS = ("validation_loss", "validation_chrf")  # compared with the ET, seed by seed


def models(seeds: dict[str, Architecture]) -> list[Model]:
    """Every variant, replayable in a space that offers both primitives."""
    out = []
    for name, primitives in VARIANTS:
        arch = with_primitives(seeds[name.split("+")[0]], primitives)
        out.append(Model(name, None, seed_params(arch, primitives=PRIMITIVES), to_json(arch)))
    return out


def entry(model: Model, runs: list[RetrainRun], arch: Architecture) -> dict[str, Any]:
    mine = [r for r in runs if r.model == model.name]
    row: dict[str, Any] = {
        "name": model.name,
        "params": mine[0].parameters if mine else None,
        "body_params": parameter_count(arch),
        "architecture": summary(arch),
        "seeds": [r.seed for r in mine],
        "errors": [r.error for r in mine if r.error],
        "seconds_mean": statistics.fmean(r.seconds for r in mine) if mine else None,
    }
    for metric in ("validation_loss", "validation_chrf", "test_loss", "test_chrf"):
        values = [r.metrics.get(metric) for r in mine]
        row[metric] = values
        finite = [v for v in values if v is not None]
        row[f"{metric}_mean"] = statistics.fmean(finite) if finite else None
    paired = paired_metrics(runs, model.name, REFERENCE, METRICS)
    row["vs_" + REFERENCE] = {metric: pair.to_dict() for metric, pair in paired.items()}
    return row


def verdict(rows: list[dict[str, Any]]) -> dict[str, str]:
    """Per variant, in words: better / worse than the ET beyond 2 paired standard errors on
    validation loss, or within the noise."""
    out = {}
    for row in rows:
        if row["name"] == REFERENCE:
            continue
        d = row["vs_" + REFERENCE]["validation_loss"]
        if d["mean"] is None or d["stderr"] is None:
            out[row["name"]] = "not measured"
        elif d["mean"] < -2 * d["stderr"]:
            out[row["name"]] = "better than the ET (> 2 paired s.e.)"
        elif d["mean"] > 2 * d["stderr"]:
            out[row["name"]] = "worse than the ET (> 2 paired s.e.)"
        else:
            out[row["name"]] = "within 2 paired s.e. of the ET"
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--experiment", default="search_2h")
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="training seeds (default: its retrain.seeds)",
    )
    parser.add_argument("--only", nargs="*", default=None, help="variant names to train")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/space_room.json")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. retrain.steps=600")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    settings = experiment_settings(args.experiment, [*args.overrides, "tracker=none"])
    seeds = tuple(args.seeds) if args.seeds else settings.retrain.seeds
    chosen = [
        m
        for m in models(configured_space(settings).seeds())
        if args.only is None or m.name in args.only or m.name == REFERENCE
    ]
    retrain = replace(settings.retrain, seeds=seeds, models_dir=tempfile.mkdtemp(prefix="room_"))
    started = time.perf_counter()
    result = retrain_models(replace(settings, retrain=retrain), chosen)
    runs = list(result.runs)
    rows = [entry(m, runs, _arch(m)) for m in chosen]
    document = {
        "experiment": args.experiment,
        "overrides": args.overrides,
        "seeds": list(seeds),
        "steps": settings.retrain.steps or settings.train.steps,
        "train": settings.train.__dict__,
        "models": rows,
        "verdict": verdict(rows),
        "seconds": time.perf_counter() - started,
    }
    write_json(args.out, document, newline=True)
    for row in rows:
        d = row["vs_" + REFERENCE]
        print(
            f"{row['name']:34} {row['body_params']:>8,}  val loss "
            f"{row['validation_loss_mean']:.4f}  d {_pm(d['validation_loss'])}  chrF "
            f"{row['validation_chrf_mean']:.2f}  d {_pm(d['validation_chrf'])}"
        )
    print(json.dumps(document["verdict"], indent=2))


def _pm(d: dict[str, Any]) -> str:
    if d["mean"] is None:
        return "n/a"
    stderr = "n/a" if d["stderr"] is None else f"{d['stderr']:.4f}"
    return f"{d['mean']:+.4f} ± {stderr} ({d['wins']}/{d['n']} better)"


def _arch(model: Model) -> Architecture:
    from search_spaces.architecture import from_json

    return from_json(model.architecture)


if __name__ == "__main__":
    main()
