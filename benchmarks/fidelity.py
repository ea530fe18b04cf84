"""Which cheap estimate ranks the Evolved Transformer's one-edit mutants as full training does?

Why it exists (issue 42): a search judges many candidates cheaply and trusts that the cheap
figure orders them as the full budget would. Near the ET, the PDH rungs of `search_2h` did
not (Kendall tau 0.10 at 100 steps). Before a search is built on an estimate, it is measured:

* **the truth**: the ET and `--mutants` one-edit mutants of it inside the experiment's
  parameter window (`nas.search.edits`; half of them edits of an activation, an input or a
  combiner, half of a layer, a width, a norm or a skip), each trained from scratch to the
  full budget with training seeds `--seeds` shared by every model (a seed fixes the
  initialisation and the data order), through the harness's retraining
  (`nas.retrain.stage.retrain_models`, on the machine's shape: one run per core); each mutant's
  paired difference from the ET in whole-split validation loss (`nas.paired`);
* **from-scratch rungs** (`--rungs`, steps): the validation loss (`train.eval_batches`) of the
  same runs at that step (on the full schedule, as PDH's rungs are), minus the ET's;
  **extrapolated**: a learning curve `a + b t^-c` fitted to the evaluations up to the last
  rung, read at the full budget, minus the ET's;
* **inherited** (`--inherit-steps` k): the child starts from the ET trained to the full
  budget on that seed, tensor by tensor where names and shapes match, its edited branch
  afresh (`search_spaces.edited`, `WeightSnapshot.without`), trains k steps (a k-step
  schedule) on batches no run trained on, and is scored on `train.eval_batches`, minus the
  ET continued the same k steps from the same weights on the same batches (the control,
  once per parent); **inherited-all**: the same with nothing left afresh.

Each estimate is read against the truth by `nas.search.agreement.agreement`: Kendall tau with
a bootstrap interval, sign accuracy on the mutants whose truth is beyond 2 paired standard
errors, top-1 and top-3 agreement, and its cost as a share of a full trial. The noise
ceiling is the tau between the truth measured on one seed and on another. The inherited
runs of each seed are one worker process pinned to a core, side by side.

Run it alone on an idle machine: the JSON records the load average before and after. The
inherited runs are in `fidelity_inherited.py`.

    python benchmarks/fidelity.py [--mutants 12] [--seeds 1 2] [--inherit-steps 50 200]
        [--rungs 100 300 500] [--experiment search_2h] [overrides ...]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from _run import RESULTS, Clock, first_paragraph, write_json
from common import experiment_settings
from fidelity_inherited import inherited, inherited_worker

from nas.paired import REFERENCE, PairedDifference, paired_difference
from nas.retrain.stage import Model, RetrainRun, retrain_models
from nas.search.agreement import agreement, noise_ceiling
from nas.search.edits import Mutant, mutants
from nas.settings import NasSettings
from nas.study.space import configured_space
from search_spaces.architecture import to_json

OUT = RESULTS / "fidelity.json"
KEEPS_SHAPES = ("activation", "input", "combiner")  # the edits drawn as "keeping shapes"


def draw(settings: NasSettings, count: int, seed: int) -> tuple[Model, list[tuple[Model, Mutant]]]:
    """The ET and `count` distinct one-edit mutants of it, half of each kind (module doc)."""
    space = configured_space(settings)
    et = space.seeds()["evolved_transformer"]
    params = space.seed_params(et)

    def kind(keeps: bool) -> Any:
        return lambda name: (name.rsplit(".", 1)[-1] in KEEPS_SHAPES) == keeps

    half = count // 2
    drawn = mutants(params, space, half, names=kind(True), seed=seed)
    drawn += mutants(params, space, 2 * (count - half), names=kind(False), seed=seed)
    unique = {to_json(m.architecture): m for m in drawn}  # the two draws may meet
    chosen = list(unique.values())[:count]
    reference = Model(REFERENCE, None, dict(params), to_json(et))
    named = [
        (Model(f"m{i:02d} {m.edit}", None, dict(m.params), to_json(m.architecture)), m)
        for i, m in enumerate(chosen)
    ]
    return reference, named


def truth_and_rungs(
    settings: NasSettings, reference: Model, named: list[tuple[Model, Mutant]], rungs: list[int]
) -> tuple[
    list[RetrainRun],
    dict[str, PairedDifference],
    dict[str, dict[str, float]],
    list[dict[str, dict[str, float]]],
]:
    """Every model trained to the full budget per seed; each mutant's paired difference from
    the ET; and each rung's estimate (the mean over seeds of mutant - ET at that step, and
    each seed's)."""
    models = [reference, *(model for model, _ in named)]
    runs = list(retrain_models(settings, models).runs)
    by = {(r.model, r.seed): r for r in runs if r.error is None}
    seeds = settings.retrain.seeds

    def final(name: str) -> dict[int, float]:
        return {s: by[name, s].metrics["validation_loss"] for s in seeds if (name, s) in by}

    def at(name: str, seed: int, step: int) -> float | None:
        run = by.get((name, seed))
        rows = [h for h in run.history if h["step"] == step] if run else []
        return rows[0].get("validation_loss") if rows else None

    def curve(name: str, seed: int, upto: int) -> float | None:
        """The loss at the full budget, extrapolated from the evaluations up to `upto`."""
        run = by.get((name, seed))
        if run is None:
            return None
        points = [
            (int(h["step"]), float(h["validation_loss"]))
            for h in run.history
            if "validation_loss" in h and h["step"] <= upto
        ]
        return extrapolate(points, full)

    full = settings.retrain.steps or settings.train.steps
    truth: dict[str, PairedDifference] = {}
    estimates: dict[str, dict[str, float]] = {f"rung@{r}": {} for r in rungs}
    estimates[f"extrapolated@{max(rungs)}"] = {}
    per_seed: list[dict[str, dict[str, float]]] = [
        {label: {} for label in estimates} for _ in seeds
    ]
    for model, _ in named:
        truth[model.name] = paired_difference(final(model.name), final(REFERENCE))
        looks = [(f"rung@{r}", functools.partial(at, step=r)) for r in rungs]
        looks.append((f"extrapolated@{max(rungs)}", functools.partial(curve, upto=max(rungs))))
        for label, look in looks:
            diffs = []
            for i, s in enumerate(seeds):
                mine, theirs = look(model.name, s), look(REFERENCE, s)
                if mine is not None and theirs is not None:
                    diffs.append(mine - theirs)
                    per_seed[i][label][model.name] = mine - theirs
            if diffs:
                estimates[label][model.name] = statistics.fmean(diffs)
    return runs, truth, estimates, per_seed


def extrapolate(points: list[tuple[int, float]], step: int) -> float | None:
    """A learning curve `loss = a + b * step^-c` fitted to `points` (step, loss), read at
    `step`; None when fewer than 3 points or the fit fails."""
    import numpy as np
    from scipy.optimize import curve_fit

    if len(points) < 3:
        return None
    x, y = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)

    def law(t: Any, a: float, b: float, c: float) -> Any:
        return a + b * np.power(t, -c)

    try:
        (a, b, c), _ = curve_fit(law, x, y, p0=(y[-1], y[0] - y[-1], 0.5), maxfev=20000)
    except (RuntimeError, ValueError):
        return None
    value = float(law(step, a, b, c))
    return value if np.isfinite(value) else None


def held_out(
    final: dict[tuple[str, int], float],
    models: list[Model],
    seeds: list[int],
    per_seed: list[dict[str, dict[str, float]]],
    costs: dict[str, float],
) -> dict[str, dict[str, Any]]:
    """Each estimate from one seed against the truth paired over the other seeds: Kendall
    tau per held-out seed, and their mean."""
    taus: dict[str, list[float | None]] = {label: [] for label in per_seed[0]}
    for seed, estimates in zip(seeds, per_seed, strict=True):
        others = [s for s in seeds if s != seed]
        truth = {
            m.name: paired_difference(_on(final, m.name, others), _on(final, REFERENCE, others))
            for m in models
        }
        for label, values in estimates.items():
            taus[label].append(report(truth, {label: values}, costs)[label]["kendall_tau"])
    return {
        label: {
            "kendall_tau_per_seed": values,
            "kendall_tau_mean": statistics.fmean(v for v in values if v is not None)
            if any(v is not None for v in values)
            else None,
        }
        for label, values in sorted(
            taus.items(),
            key=lambda item: (
                -statistics.fmean(v for v in item[1] if v is not None)
                if any(v is not None for v in item[1])
                else 2.0
            ),
        )
    }


def _on(final: dict[tuple[str, int], float], name: str, seeds: list[int]) -> dict[int, float]:
    return {s: final[name, s] for s in seeds if (name, s) in final}


def report(
    truth: dict[str, PairedDifference],
    estimates: dict[str, dict[str, float]],
    costs: dict[str, float],
) -> dict[str, Any]:
    """Every estimate's agreement with the truth, best tau first (an estimate with too few
    mutants to compare: its reason)."""
    rows: dict[str, Any] = {}
    for label, values in estimates.items():
        try:
            rows[label] = agreement(truth, values, cost_share=costs[label]).to_dict()
        except ValueError as error:
            rows[label] = {"kendall_tau": None, "error": str(error)}

    def tau(item: tuple[str, Any]) -> float:
        value = item[1]["kendall_tau"]
        return -2.0 if value is None else float(value)

    return dict(sorted(rows.items(), key=tau, reverse=True))


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--experiment", default="search_2h")
    parser.add_argument("--mutants", type=int, default=12)
    parser.add_argument("--mutant-seed", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rungs", type=int, nargs="+", default=[100, 300, 500])
    parser.add_argument("--inherit-steps", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="the runs' folder (default: a new temporary one); run again with the same "
        "folder, the recorded runs are read back, not trained again",
    )
    parser.add_argument("--inherited-worker", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. train.steps=600")
    args = parser.parse_args()
    if not args.inherited_worker and len(args.seeds) < 2:
        parser.error(f"--seeds {args.seeds}: the truth is paired over at least 2 seeds")
    return args


def _settings(args: argparse.Namespace, root: Path) -> NasSettings:
    """The experiment's, its runs under `root`, retrained with `--seeds`, no decoding."""
    settings = experiment_settings(
        args.experiment,
        [f"studies_dir={root / 'studies'}", f"output_dir={root / 'run'}", *args.overrides],
    )
    retrain = replace(
        settings.retrain,
        seeds=tuple(args.seeds),
        models_dir=str(root / "models"),
        decode_pairs=None,
    )
    return replace(settings, retrain=retrain)


def _costs(args: argparse.Namespace, full: int, mutants: int) -> dict[str, float]:
    """Each estimate's cost as a share of a full trial."""
    return (
        {f"rung@{r}": r / full for r in args.rungs}
        | {f"extrapolated@{max(args.rungs)}": max(args.rungs) / full}
        | {
            f"{v}@{k}": k / full * (1 + 1 / mutants)  # the control, once per parent, shared
            for v in ("inherited", "inherited-all")
            for k in args.inherit_steps
        }
    )


def _mutants(
    named: list[tuple[Model, Mutant]],
    runs: list[RetrainRun],
    truth: dict[str, PairedDifference],
    estimates: dict[str, dict[str, float]],
) -> list[dict[str, Any]]:
    """The JSON's `mutants`: each one's edit, size, truth and estimates."""
    return [
        {
            "name": model.name,
            "edit": str(m.edit),
            "kind": "keeps shapes"
            if m.edit.name.rsplit(".", 1)[-1] in KEEPS_SHAPES
            else "changes shapes",
            "params": next((r.parameters for r in runs if r.model == model.name), None),
            "truth": truth[model.name].to_dict(),
            "estimates": {label: values.get(model.name) for label, values in estimates.items()},
        }
        for model, m in named
    ]


def main() -> None:
    args = _arguments()
    if args.inherited_worker:
        inherited_worker(Path(args.inherited_worker[0]), int(args.inherited_worker[1]))
        return
    os.environ.setdefault("WANDB_MODE", "offline")
    clock = Clock()
    root = args.work or Path(tempfile.mkdtemp(prefix="fidelity_"))
    settings = _settings(args, root)
    reference, named = draw(settings, args.mutants, args.mutant_seed)
    print(f"{len(named)} mutants: " + "; ".join(model.name for model, _ in named), flush=True)
    truth_started = time.perf_counter()
    runs, truth, estimates, per_seed = truth_and_rungs(settings, reference, named, args.rungs)
    truth_s = time.perf_counter() - truth_started
    means, seeds = inherited(settings, reference, named, args.inherit_steps, root / "inherited")
    estimates |= means
    per_seed = [rungs | inheriting for rungs, inheriting in zip(per_seed, seeds, strict=True)]
    full = settings.retrain.steps or settings.train.steps
    costs = _costs(args, full, len(named))
    final = {(r.model, r.seed): r.metrics["validation_loss"] for r in runs if r.error is None}
    truth_by_seed = [
        {m.name: final[m.name, s] - final[REFERENCE, s] for m, _ in named if (m.name, s) in final}
        for s in args.seeds
        if (REFERENCE, s) in final
    ]
    document = {
        "experiment": args.experiment,
        "overrides": args.overrides,
        "seeds": args.seeds,
        "full_budget_steps": full,
        "truth_seconds": truth_s,
        "noise_ceiling_tau": noise_ceiling(*truth_by_seed[:2]) if len(truth_by_seed) >= 2 else None,
        "noise_ceiling_tau_pairs": [
            noise_ceiling(a, b) for a, b in itertools.combinations(truth_by_seed, 2)
        ],
        "agreement": report(truth, estimates, costs),
        # what a study sees: an estimate from one training seed, against the truth measured
        # on the other seeds (a rung and the truth of one seed share that seed's noise)
        "agreement_held_out": held_out(final, [m for m, _ in named], args.seeds, per_seed, costs),
        "mutants": _mutants(named, runs, truth, estimates),
        "reference_validation_loss": [
            r.metrics.get("validation_loss") for r in runs if r.model == REFERENCE
        ],
        "train": asdict(settings.train),
        "wall_s": clock.seconds(),
        **clock.load_average(),
    }
    write_json(args.out, document, indent=1, newline=True)
    print(
        json.dumps(
            {"noise_ceiling_tau": document["noise_ceiling_tau"], **document["agreement"]}, indent=1
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
