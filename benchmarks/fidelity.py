"""Which cheap estimate ranks mutants of the best seed models as full training does?

Why it exists (issues 42, 52): a search judges many candidates cheaply and trusts that the
cheap figure orders them as the full budget would. Near the ET, the PDH rungs of `search_2h`
did not (Kendall tau 0.10 at 100 steps). Before a search is built on an estimate, it is
measured, with the power to choose between estimates:

* **the candidates**: `--mutants` mutants (24) shared among `--parents`, seed models the
  space names (the ET and the ET with Primer's edits); of each parent's, `--two-edit-share`
  two edits away (a mutant edited once more), the rest one edit away, half of those keeping
  shapes (an activation, an input, a combiner) and half changing them (a layer, a width, a
  norm, a skip), all inside the experiment's parameter window (`nas.search.edits`);
* **the truth**: every candidate and parent trained from scratch to the full budget with
  training seeds `--seeds` (three) shared by every model (a seed fixes the initialisation
  and the data order), through the harness's retraining (`nas.retrain.stage.retrain_models`,
  on the machine's shape: one run per core); each candidate's paired difference from its
  parent in whole-split validation loss (`nas.paired`);
* **from-scratch rungs** (`--rungs`, steps): the validation loss (`train.eval_batches`) of
  the same runs at that step (on the full schedule, as PDH's rungs are), minus the
  parent's; **extrapolated**: a learning curve `a + b t^-c` fitted to the evaluations up to
  the last rung, read at the full budget, minus the parent's;
* **inherited** (`--inherit-steps` k): the child starts from its parent trained to the full
  budget on that seed, tensor by tensor where names and shapes match, its edited branches
  afresh (`search_spaces.edited`, `WeightSnapshot.without`), trains k steps (a k-step
  schedule) on batches no run trained on, and is scored on `train.eval_batches`, minus the
  parent continued the same k steps from the same weights on the same batches (the
  control, once per parent): what a study at inherited fidelity promotes by
  (`nas.study.promotion`); **inherited-all**: the same with nothing left afresh.

Each estimate is read against the truth by `nas.search.agreement.agreement`: Kendall tau with
a bootstrap interval, sign accuracy on the candidates whose truth is beyond 2 paired
standard errors, top-1 and top-3 agreement; within each parent and each kind of mutant
(`agreement_by_kind`); and its cost, as a share of a full trial and in core-seconds per
candidate (`seconds_per_candidate`), so that the estimate ranking best per second of
compute can be chosen. The noise ceiling is the tau between the truth measured on one seed
and on another. The inherited runs of each seed are one worker process pinned to a core
that no other worker runs on at the same time.

Run it alone on an idle machine: the JSON records the load average before and after. The
inherited runs are in `fidelity_inherited.py`.

    python benchmarks/fidelity.py [--mutants 24] [--parents evolved_transformer
        evolved_transformer_primer] [--two-edit-share 0.25] [--seeds 1 2 3]
        [--inherit-steps 50 200] [--rungs 100 300 500] [--experiment search_2h]
        [overrides ...]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
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
from fidelity_mutants import Drawn, draw

from nas.paired import REFERENCE, PairedDifference, paired_difference
from nas.retrain.stage import Model, RetrainRun, retrain_models
from nas.search.agreement import agreement, kendall_tau, noise_ceiling
from nas.settings import NasSettings
from search_spaces.evolved_transformer_space import PRIMER_SEED

OUT = RESULTS / "fidelity.json"


def truth_and_rungs(
    settings: NasSettings, parents: dict[str, Model], drawn: list[Drawn], rungs: list[int]
) -> tuple[
    list[RetrainRun],
    dict[str, PairedDifference],
    dict[str, dict[str, float]],
    list[dict[str, dict[str, float]]],
]:
    """Every model trained to the full budget per seed; each mutant's paired difference from
    its parent; and each rung's estimate (the mean over seeds of mutant - parent at that
    step, and each seed's)."""
    models = [*parents.values(), *(d.model for d in drawn)]
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
    for candidate in drawn:
        name, parent = candidate.model.name, candidate.parent
        truth[name] = paired_difference(final(name), final(parent))
        looks = [(f"rung@{r}", functools.partial(at, step=r)) for r in rungs]
        looks.append((f"extrapolated@{max(rungs)}", functools.partial(curve, upto=max(rungs))))
        for label, look in looks:
            diffs = []
            for i, s in enumerate(seeds):
                mine, theirs = look(name, s), look(parent, s)
                if mine is not None and theirs is not None:
                    diffs.append(mine - theirs)
                    per_seed[i][label][name] = mine - theirs
            if diffs:
                estimates[label][name] = statistics.fmean(diffs)
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
    drawn: list[Drawn],
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
            d.model.name: paired_difference(
                _on(final, d.model.name, others), _on(final, d.parent, others)
            )
            for d in drawn
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
    parser.add_argument("--mutants", type=int, default=24)
    parser.add_argument("--mutant-seed", type=int, default=0)
    parser.add_argument(
        "--parents",
        nargs="+",
        default=[REFERENCE, PRIMER_SEED],
        help="the seed models the mutants are drawn from (the space's named seeds)",
    )
    parser.add_argument(
        "--two-edit-share",
        type=float,
        default=0.25,
        help="of each parent's mutants, the share two edits away",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
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


def _costs(args: argparse.Namespace, full: int, mutants: int, parents: int) -> dict[str, float]:
    """Each estimate's cost as a share of a full trial (an inherited one shares its
    parent's control with the parent's other children)."""
    return (
        {f"rung@{r}": r / full for r in args.rungs}
        | {f"extrapolated@{max(args.rungs)}": max(args.rungs) / full}
        | {
            f"{v}@{k}": k / full * (1 + parents / mutants)
            for v in ("inherited", "inherited-all")
            for k in args.inherit_steps
        }
    )


def _mutants(
    drawn: list[Drawn],
    runs: list[RetrainRun],
    truth: dict[str, PairedDifference],
    estimates: dict[str, dict[str, float]],
) -> list[dict[str, Any]]:
    """The JSON's `mutants`: each one's parent, edits, size, truth and estimates."""
    return [
        {
            "name": d.model.name,
            "parent": d.parent,
            "edits": [str(e) for e in d.edits],
            "kind": d.kind,
            "params": next((r.parameters for r in runs if r.model == d.model.name), None),
            "truth": truth[d.model.name].to_dict(),
            "estimates": {label: values.get(d.model.name) for label, values in estimates.items()},
        }
        for d in drawn
    ]


def _by_kind(
    drawn: list[Drawn], truth: dict[str, PairedDifference], estimates: dict[str, dict[str, float]]
) -> dict[str, dict[str, Any]]:
    """Each estimate's Kendall tau within each parent and each kind of mutant."""
    groups: dict[str, list[str]] = {}
    for d in drawn:
        groups.setdefault(f"parent {d.parent}", []).append(d.model.name)
        groups.setdefault(d.kind, []).append(d.model.name)
    return {
        group: {
            label: kendall_tau(
                [values[n] for n in names if n in values],
                [truth[n].mean for n in names if n in values],
            )
            for label, values in estimates.items()
        }
        | {"mutants": len(names)}
        for group, names in groups.items()
    }


def _seconds_per_candidate(
    costs: dict[str, float],
    run_seconds: list[float],
    inherited: dict[str, float],
    candidates: int,
) -> dict[str, float]:
    """Seconds of one core per candidate for each estimate: a rung or an extrapolation as
    its share of a full run (the median of the truth's runs as each measured itself, one
    core each: a run read back from an earlier start of this benchmark, or resumed from its
    checkpoint, counts as it was measured); an inherited estimate as its workers measured
    it (its parents' controls shared out)."""
    full_run_s = statistics.median(run_seconds) if run_seconds else math.nan
    rows = {label: share * full_run_s for label, share in costs.items() if "@" in label}
    rows |= {label: spent / max(1, candidates) for label, spent in inherited.items()}
    rows["full budget"] = full_run_s
    return rows


def main() -> None:
    args = _arguments()
    if args.inherited_worker:
        inherited_worker(Path(args.inherited_worker[0]), int(args.inherited_worker[1]))
        return
    os.environ.setdefault("WANDB_MODE", "offline")
    clock = Clock()
    root = args.work or Path(tempfile.mkdtemp(prefix="fidelity_"))
    settings = _settings(args, root)
    parents, drawn = draw(
        settings, args.mutants, args.mutant_seed, args.parents, args.two_edit_share
    )
    print(f"{len(drawn)} mutants: " + "; ".join(d.model.name for d in drawn), flush=True)
    truth_started = time.perf_counter()
    runs, truth, estimates, per_seed = truth_and_rungs(settings, parents, drawn, args.rungs)
    truth_s = time.perf_counter() - truth_started
    inherited_started = time.perf_counter()
    means, seeds, seconds = inherited(
        settings, parents, drawn, args.inherit_steps, root / "inherited"
    )
    inherited_s = time.perf_counter() - inherited_started
    estimates |= means
    per_seed = [rungs | inheriting for rungs, inheriting in zip(per_seed, seeds, strict=True)]
    full = settings.retrain.steps or settings.train.steps
    costs = _costs(args, full, len(drawn), len(parents))
    final = {(r.model, r.seed): r.metrics["validation_loss"] for r in runs if r.error is None}
    truth_by_seed = [
        {
            d.model.name: final[d.model.name, s] - final[d.parent, s]
            for d in drawn
            if (d.model.name, s) in final and (d.parent, s) in final
        }
        for s in args.seeds
    ]
    document = {
        "experiment": args.experiment,
        "overrides": args.overrides,
        "seeds": args.seeds,
        "parents": list(parents),
        "two_edit_share": args.two_edit_share,
        "full_budget_steps": full,
        "truth_seconds": truth_s,
        "inherited_seconds": inherited_s,
        # what each estimate costs per candidate, in seconds of one core (the inherited
        # ones as their workers measured them; a rung as its share of a full run's)
        "seconds_per_candidate": _seconds_per_candidate(
            costs, [r.seconds for r in runs if r.error is None and r.seconds], seconds, len(drawn)
        ),
        "noise_ceiling_tau": noise_ceiling(*truth_by_seed[:2]) if len(truth_by_seed) >= 2 else None,
        "noise_ceiling_tau_pairs": [
            noise_ceiling(a, b) for a, b in itertools.combinations(truth_by_seed, 2)
        ],
        "agreement": report(truth, estimates, costs),
        # what a study sees: an estimate from one training seed, against the truth measured
        # on the other seeds (a rung and the truth of one seed share that seed's noise)
        "agreement_held_out": held_out(final, drawn, args.seeds, per_seed, costs),
        "agreement_by_kind": _by_kind(drawn, truth, estimates),
        "mutants": _mutants(drawn, runs, truth, estimates),
        "parents_validation_loss": {
            name: [r.metrics.get("validation_loss") for r in runs if r.model == name]
            for name in parents
        },
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
