"""Does the search find anything better than its seeds, and which search settings find it?

Every study is the experiment's (`search_2h` by default: evolution over the space with
Primer's primitives, PDH rungs at 100 and 300 steps with the full 1,000-step budget as the
top rung, a window topped at the ET's size), run for a wall-clock budget with
`study.timeout_s`, from scratch, one after another on this machine. Parts (`--parts`):

* `samplers`  evolution, random and TPE at equal wall-clock (`--compare-minutes`), each with
              `--study-seeds` seeds: best-so-far against minutes, final best mean and sd;
* `pruning`   evolution with PDH (the experiment's hurdles, then the same rungs with the
              median as hurdle), with successive halving (`pruner=sha`, rungs at PDH's first
              budget times 3^k, the top third going on) and without pruning, same seeds and
              time: the steps each saved against training every trial to the top rung,
              trials per hour, and the best each reached (PDH's within 1 sd of none's?);
* `warm`      evolution with inherited weights (live `reconfigure`, warm weights) against
              cold restarts (a fresh `run_study`, new stage processes, per trial): trials
              per hour, and what each picks, judged after retraining from scratch;
* `best`      the headline: the evolution study of `--search-minutes` (default: the
              experiment's `study.time_budget_s`; or of
              `--search-trials` trials, whatever the time: what a loaded machine can
              still compare), its best retrained
              from scratch against both seeds with the experiment's `retrain.seeds`
              (or `--retrain-seeds`; `search_2h`'s are 1, 2, 3, seeds its study never
              trained with, so the pick carries no selection luck), `retrain.steps`,
              `nas.retrain.stage.retrain_models`: mean and sd of validation
              loss, accuracy, chrF, test loss, parameters and throughput, and each
              model's difference from the Evolved Transformer paired by training seed
              (every model sees the same data order for a seed): mean, standard error,
              seeds won; the goal is met when the best beats both seeds on validation loss
              and chrF with no more parameters than either seed. With the experiment's
              `retrain.selection_seeds` the best is chosen among the top-k on those
              seeds and only it is judged on the training seeds (`retrain.selection`);
              `--primer-reference` retrains the ET with both Primer edits beside the
              seeds (each model's `vs_evolved_transformer_both`).

The headline's `pruning.steps_saved` is 1 - (steps its trials trained) / (steps they would
have trained had every one gone to the top rung). `proxy_rank.json`'s Kendall tau (by rung)
is copied in when it was measured on the same experiment. A study whose settings equal
another's is run once (the headline is the evolution study of seed 0 when `--search-minutes`
equals `--compare-minutes`). Parts can be run separately: each run's results are merged
into `--out` over what earlier runs of other parts wrote there.

    python benchmarks/search_quality.py                       # the full figures, ~8 hours
    python benchmarks/search_quality.py --parts best          # the headline, ~2 hours
    # or in pieces that survive a stop: the harness's own (resumable) study, then the
    # benchmark reads it and retrains (finished runs are kept in retrain.models_dir)
    python -m nas experiment=search_2h 'stages=[search]' studies_dir=out/studies
    python benchmarks/search_quality.py --parts best --headline-study search_2h \\
        studies_dir=out/studies retrain.models_dir=out/models
    python benchmarks/search_quality.py --experiment search_1h --parts best \\
        --out benchmarks/results/search_quality_search_1h.json  # the earlier experiment
    python benchmarks/search_quality.py --parts samplers,pruning,warm --compare-minutes 4 \\
        --study-seeds 1                                       # reduced: ~30 minutes
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import optuna
from common import experiment_settings
from scipy.stats import kendalltau

from nas.paired import REFERENCE
from nas.retrain.stage import (
    Model,
    RetrainRun,
    identity,
    model_table,
    paired_metrics,
    retrain_models,
    select_models,
)
from nas.settings import NasSettings, PrunerSettings, SamplerSettings, lower_is_better
from nas.study.run import run_study
from nas.study.trials import (
    INVALID,
    counted,
    finished,
    open_study,
    seconds_searched,
    seed_architectures,
)
from search_spaces.architecture import summary, to_json
from search_spaces.evolved_transformer import PRIMITIVES, seed_params
from search_spaces.primer import with_primitives

ROOT = Path(__file__).resolve().parent.parent
PRIMER_BOTH = f"{REFERENCE}+both"  # the ET with both Primer edits (`--primer-reference`)
RESULTS = ROOT / "benchmarks" / "results"
PARTS = ("samplers", "pruning", "warm", "best")
# a study's variant: what it changes in the experiment's settings (typed: an override like
# `sampler=random` would keep the experiment's evolution options)
VARIANTS: dict[str, Callable[[NasSettings], NasSettings]] = {
    "evolution": lambda s: s,
    "random": lambda s: replace(s, sampler=SamplerSettings("random")),
    "tpe": lambda s: replace(s, sampler=SamplerSettings("tpe")),
    "evolution-no-pdh": lambda s: replace(s, pruner=PrunerSettings("none")),
    "evolution-sha": lambda s: replace(s, pruner=PrunerSettings("sha", _sha_options(s))),
    "evolution-pdh-median": lambda s: replace(s, pruner=_median_hurdles(s.pruner)),
    "evolution-inherit": lambda s: replace(s, study=replace(s.study, inherit_weights=True)),
    "evolution-cold": lambda s: s,  # one run_study (fresh stage processes) per trial
}


def main() -> None:
    args = _arguments()
    if args.replot:  # draw the picture again from `--out`, run nothing
        saved = json.loads(args.out.read_text())
        _plot(saved["studies"], args.out.with_suffix(".png"), saved["runs"][-1]["fitness"])
        return
    os.environ.setdefault("WANDB_MODE", "offline")
    root = Path(tempfile.mkdtemp(prefix="search_quality_"))
    base = experiment_settings(
        args.experiment,
        [f"studies_dir={root / 'studies'}", f"output_dir={root / 'run'}", *args.overrides],
    )
    if args.search_minutes is None:
        args.search_minutes = (base.study.time_budget_s or base.study.timeout_s or 3600) / 60
    started, load_before = time.perf_counter(), os.getloadavg()
    runs: dict[str, dict[str, Any]] = {}
    wanted = _variants(args.parts)
    for seed in range(args.study_seeds):  # seeds outermost: a slow stretch hits every variant
        for variant in wanted:
            minutes = args.compare_minutes
            runs[f"{variant}/{seed}"] = _study(base, variant, seed, minutes, None, args.reuse)
    picks: dict[str, str] = {}  # role -> the study whose pick is retrained
    if "best" in args.parts:
        key = "evolution/0"
        if args.headline_study:  # a study the harness ran (and may have resumed) before
            key = "headline"
            runs[key] = _stored(
                replace(base, study=replace(base.study, name=args.headline_study)), "evolution", 0
            )
        elif key not in runs or args.search_minutes != args.compare_minutes or args.search_trials:
            key = "headline"
            runs[key] = _study(
                base, "evolution", 0, args.search_minutes, args.search_trials, args.reuse
            )
        picks["best"] = key
    if "warm" in args.parts:
        for seed in range(args.study_seeds):
            picks |= {
                f"warm-{seed}": f"evolution-inherit/{seed}",
                f"cold-{seed}": f"evolution-cold/{seed}",
            }
    retrained = _retrain(base, runs, picks, "best" in args.parts, args) if picks else None
    run = {
        "parts": args.parts,
        "experiment": args.experiment,
        "overrides": args.overrides,
        "compare_minutes": args.compare_minutes,
        "search_minutes": args.search_minutes,
        "search_trials": args.search_trials,
        "study_seeds": args.study_seeds,
        "train": base.train.__dict__,
        "retrain_steps": base.retrain.steps,
        "fitness": base.study.fitness,
        "seconds": time.perf_counter() - started,
        "load_average_1_5_15_before": load_before,
        "load_average_1_5_15_after": os.getloadavg(),
        # a `--headline-study` ran outside this script: the load before it, as measured then
        "headline_study_load_average_1_5_15_before": args.headline_load_before,
    }
    summary = _summary(runs, wanted, args.study_seeds)
    if "headline" in runs:  # what the headline study judged per hour, and on which shape
        keys = ("trials", "trials_per_hour", "complete", "pruned", "refused", "shapes")
        summary["headline"] = {key: runs["headline"].get(key) for key in keys}
    result = _merge(args.out, run, runs, summary, retrained, args.experiment)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    _plot(result["studies"], args.out.with_suffix(".png"), base.study.fitness)
    print(
        json.dumps(
            {"summary": result["summary"], "retrain": _brief(result["retrain"])},
            indent=2,
            default=str,
        )
    )


def _merge(
    path: Path,
    run: dict[str, Any],
    studies: dict[str, Any],
    summary: dict[str, Any],
    retrained: dict[str, Any] | None,
    experiment: str,
) -> dict[str, Any]:
    """This run's parts over what an earlier run of other parts left in `path` (each part
    can be run, or re-run, on its own): studies and summaries by key, retrained models by
    the study they were picked from (the seeds with the headline)."""
    old = json.loads(path.read_text()) if path.exists() else {}
    models = old["retrained"] if isinstance(old.get("retrained"), list) else []  # else: v1
    retrain = old.get("retrain") or {}
    if retrained is not None:
        roles = set(retrained["picks"]) | ({None} if "goal" in retrained else set())
        models = [m for m in models if m.get("study") not in roles] + retrained["models"]
        table = {r["model"]: r for r in [*retrain.get("table", []), *retrained["table"]]}
        picks = {**retrain.get("picks", {}), **retrained["picks"]}
        retrain = {
            **retrain,
            **{k: v for k, v in retrained.items() if v is not None},
            "table": list(table.values()),
            "picks": picks,
        }
        retrain.pop("models", None)
    studies = {**old.get("studies", {}), **studies}
    return {
        "runs": [*old.get("runs", []), run],
        "studies": studies,
        "pruning": _pruning(studies.get("headline") or studies.get("evolution/0")),
        "summary": {**old.get("summary", {}), **summary},
        "retrained": models,  # the list: name, params, architecture, per-seed figures
        "retrain": retrain,  # the table (mean, sd), the goal, warm against cold
        "proxy": _proxy(experiment),
    }


def _pruning(headline: dict[str, Any] | None) -> dict[str, Any] | None:
    """The headline study's pruning: steps trained against every trial at the top rung."""
    if headline is None or "steps_if_all_top" not in headline:
        return None
    keys = ("steps_saved", "steps_trained", "steps_if_all_top", "pruned", "complete", "stopped_at")
    return {key: headline.get(key) for key in keys}


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="search_2h")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"comma-separated, of {', '.join(PARTS)}"
    )
    parser.add_argument("--compare-minutes", type=float, default=15.0)
    parser.add_argument(
        "--search-minutes",
        type=float,
        default=None,
        help="default: the experiment's study.time_budget_s",
    )
    parser.add_argument("--search-trials", type=int, default=None)
    parser.add_argument(
        "--headline-study",
        default=None,
        help="take this study in studies_dir as the headline instead of running one "
        "(e.g. one `python -m nas experiment=search_2h` ran and resumed)",
    )
    parser.add_argument(
        "--headline-load-before",
        type=float,
        nargs=3,
        default=None,
        help="the load average (1, 5, 15 min) before the --headline-study ran, for the JSON",
    )
    parser.add_argument(
        "--primer-reference",
        action="store_true",
        help="retrain the ET with both Primer edits beside the seeds (`evolved_transformer+both`)",
    )
    parser.add_argument("--study-seeds", type=int, default=2)
    parser.add_argument(
        "--retrain-seeds",
        type=int,
        nargs="+",
        default=None,
        help="training seeds; default: the experiment's retrain.seeds",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "search_quality.json",
        help="merged with what an earlier run of other parts wrote there",
    )
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from --out")
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="read studies already in studies_dir instead of running them",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. retrain.steps=400")
    args = parser.parse_args()
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts {unknown} is not valid; valid: {', '.join(PARTS)}")
    return args


def _sha_options(settings: NasSettings) -> dict[str, Any]:
    """Successive halving on the hurdles' scale: its first rung at PDH's first budget (or
    `train.eval_every`), every rung an evaluation step, a third going on."""
    budgets = settings.pruner.options.get("budgets") or [settings.train.eval_every]
    return {"min_resource": int(budgets[0]), "reduction_factor": 3}


def _median_hurdles(pruner: PrunerSettings) -> PrunerSettings:
    """The experiment's PDH rungs with the median of each rung's population as its hurdle
    (a stricter hurdle than the mean when a few bad models pull the mean up)."""
    options = {k: v for k, v in pruner.options.items() if k not in ("hurdle", "quantile")}
    return PrunerSettings("pdh", {**options, "hurdle": "quantile", "quantile": 0.5})


def _variants(parts: list[str]) -> list[str]:
    chosen = {
        "samplers": ["evolution", "random", "tpe"],
        "pruning": ["evolution", "evolution-pdh-median", "evolution-sha", "evolution-no-pdh"],
        "warm": ["evolution-inherit", "evolution-cold"],
    }
    return list(dict.fromkeys(v for part in parts for v in chosen.get(part, [])))


def _stored(settings: NasSettings, variant: str, seed: int) -> dict[str, Any]:
    """A study already in `studies_dir` (`settings.study.name`), read back; its time is the
    time it searched (`nas.study.trials.seconds_searched`), which a study resumed across runs or
    run by several workers also counts right."""
    name = settings.study.name
    if name not in optuna.get_all_study_names(settings.storage_url):
        raise SystemExit(f"no study {name!r} in {settings.storage_url}")
    study = optuna.load_study(study_name=name, storage=settings.storage_url)
    first = min(t.datetime_start for t in study.trials if t.datetime_start)
    print(f"study {name}: read from {settings.storage_url}", flush=True)
    return _read(study, settings, variant, seed, first, seconds_searched(study))


def _study(
    base: NasSettings,
    variant: str,
    seed: int,
    minutes: float,
    trials: int | None = None,
    reuse: bool = False,
) -> dict[str, Any]:
    """Run one study for `minutes` or `trials` (cold: one `run_study` per trial) and read
    it back. With `reuse`, a study of that name already in `studies_dir` is read instead,
    its time from its first trial's start to its last trial's end."""
    name = f"{variant}-{seed}-{f'{trials}t' if trials else f'{minutes:g}m'}"
    settings = VARIANTS[variant](
        replace(
            base,
            seed=seed,
            study=replace(base.study, name=name, n_trials=trials or 100000),
            output_dir=f"{base.output_dir}/{name}",
        )
    )
    if reuse and name in optuna.get_all_study_names(settings.storage_url):
        return _stored(settings, variant, seed)
    print(f"study {name}", flush=True)
    start, deadline = datetime.now(), time.time() + (math.inf if trials else 60 * minutes)
    cold = variant == "evolution-cold"  # a fresh run_study (new processes) per trial
    while time.time() < deadline:
        limit = finished(open_study(settings)) + 1 if cold else settings.study.n_trials
        run_study(
            replace(
                settings,
                study=replace(settings.study, n_trials=limit, timeout_s=deadline - time.time()),
            )
        )
        if not cold:
            break
    study = optuna.load_study(study_name=name, storage=settings.storage_url)
    return _read(study, settings, variant, seed, start, time.time() - start.timestamp())


def _read(
    study: optuna.Study,
    settings: NasSettings,
    variant: str,
    seed: int,
    start: datetime,
    seconds: float,
) -> dict[str, Any]:
    """What a study did: trials by state, steps trained, best-so-far against minutes."""
    fitness = settings.study.fitness
    ended = {
        t.number: t.datetime_complete
        for t in study.trials
        if counted(t) and t.datetime_complete is not None
    }
    done = sorted((t for t in study.trials if t.number in ended), key=lambda t: ended[t.number])
    curve: list[list[float]] = []
    best, best_key = None, math.inf  # the best fitness so far and its lower-is-better key
    for t in done:
        key = lower_is_better(fitness, t.values[0]) if t.values else math.inf
        if t.state == optuna.trial.TrialState.COMPLETE and key < best_key:
            best, best_key = t.values[0], key
            curve.append([(ended[t.number] - start).total_seconds() / 60, best])
    steps = [
        int(t.user_attrs.get("steps", settings.train.steps))
        if t.state == optuna.trial.TrialState.COMPLETE
        else max(t.intermediate_values, default=0)
        for t in done
    ]
    # study.fidelity=inherited: a parent's control trains `inherit_steps` once, for its children
    parents = {
        t.user_attrs["inherited_from"] for t in done if "control_validation_loss" in t.user_attrs
    }
    steps += [settings.study.inherit_steps] * len(parents)
    top = settings.train.steps * len(done)  # had every trial gone to the top rung
    states = [t.state.name.lower() for t in done]
    return {
        "variant": variant,
        "seed": seed,
        "seconds": seconds,
        "trials": len(done),
        "trials_per_hour": 3600 * len(done) / seconds,
        **{state: states.count(state) for state in ("complete", "pruned", "fail")},
        "fidelity": dict(
            collections.Counter(str(t.user_attrs.get("fidelity", "full")) for t in done)
        ),
        "controls": len(parents),
        "steps_trained": sum(steps),
        "steps_per_trial": sum(steps) / max(1, len(done)),
        "steps_if_all_top": top,
        "steps_saved": 1 - sum(steps) / top if top else None,
        "stopped_at": dict(
            sorted(
                collections.Counter(
                    str(max(t.intermediate_values, default=0))
                    for t in done
                    if t.state == optuna.trial.TrialState.PRUNED
                ).items()
            )
        ),
        "best": best,
        "curve": curve,
        "rank_by_step": _rank_by_step(done, settings.train.steps),
        "shapes": dict(collections.Counter(str(t.user_attrs.get("shape")) for t in done)),
        "refused": sum(bool(t.user_attrs.get(INVALID)) for t in study.trials),
        "storage": settings.storage_url,
        "study_name": study.study_name,
    }


def _rank_by_step(trials: Sequence[optuna.trial.FrozenTrial], top: int) -> dict[str, Any]:
    """How the study's own full-budget trials rank at each evaluation step against the top:
    Kendall tau of the fitness at step k with the fitness at `top` (k = 100 and 300 are the
    PDH rungs), over the trials that reached the top."""
    complete = [
        t
        for t in trials
        if t.state == optuna.trial.TrialState.COMPLETE and top in t.intermediate_values
    ]
    if len(complete) < 3:
        return {"trials": len(complete)}
    final = [t.intermediate_values[top] for t in complete]
    steps = sorted(set.intersection(*(set(t.intermediate_values) for t in complete)) - {top})
    taus = {}
    for k in steps:
        tau, p = kendalltau([t.intermediate_values[k] for t in complete], final)
        taus[str(k)] = {"tau": float(tau), "p": float(p)}
    return {"trials": len(complete), "top": top, "kendall_tau": taus}


def _summary(runs: dict[str, dict[str, Any]], variants: list[str], seeds: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for variant in variants:
        mine = [runs[f"{variant}/{s}"] for s in range(seeds)]
        bests = [r["best"] for r in mine if r["best"] is not None]
        out[variant] = {
            "best_mean": statistics.fmean(bests) if bests else None,
            "best_sd": statistics.stdev(bests) if len(bests) > 1 else 0.0,
            "bests": bests,
            "trials_per_hour": statistics.fmean(r["trials_per_hour"] for r in mine),
            "steps_per_trial": statistics.fmean(r["steps_per_trial"] for r in mine),
            "pruned": sum(r["pruned"] for r in mine),
            "trials": sum(r["trials"] for r in mine),
        }
    pruners = {
        "pdh": "evolution",
        "pdh-median": "evolution-pdh-median",
        "sha": "evolution-sha",
        "none": "evolution-no-pdh",
    }
    if {"evolution", "evolution-no-pdh"} & set(out):
        out["pruners_at_equal_wall_clock"] = {
            name: {
                "steps_saved": statistics.fmean(
                    runs[f"{v}/{s}"]["steps_saved"] for s in range(seeds)
                ),
                "best_mean": out[v]["best_mean"],
                "best_sd": out[v]["best_sd"],
                "trials_per_hour": out[v]["trials_per_hour"],
            }
            for name, v in pruners.items()
            if v in out
        }
    for pdh_name, key in (
        ("evolution", "pdh_vs_no_pruning"),
        ("evolution-pdh-median", "pdh_median_vs_no_pruning"),
    ):
        if {pdh_name, "evolution-no-pdh"} <= set(out):
            pdh, full = out[pdh_name], out["evolution-no-pdh"]
            sd = max(pdh["best_sd"], full["best_sd"])
            out[key] = {
                "steps_saved_per_trial": 1 - pdh["steps_per_trial"] / full["steps_per_trial"],
                "same_best_within_1sd": None
                if pdh["best_mean"] is None or full["best_mean"] is None
                else abs(pdh["best_mean"] - full["best_mean"]) <= sd,
            }
    if {"evolution-inherit", "evolution-cold"} <= set(out):
        out["warm_vs_cold_trials_per_hour"] = (
            out["evolution-inherit"]["trials_per_hour"] / out["evolution-cold"]["trials_per_hour"]
        )
    return out


def _retrain(
    base: NasSettings,
    runs: dict[str, dict[str, Any]],
    picks: dict[str, str],
    seed_models: bool,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Each pick (a role: "best", "warm-<seed>", "cold-<seed>", and the study in `runs` it
    picks from) retrained from scratch with the same training seeds, and both seeds when
    `seed_models`; "best" retrains the experiment's `retrain.top_k` best complete trials and
    its pick is the best of them retrained (validation only): on `retrain.selection_seeds`
    when the experiment has them (`_select`; then only the pick is judged on the training
    seeds), else on the training seeds themselves. A network two studies picked
    (`nas.retrain.stage.identity`) is trained once."""
    settings = replace(
        base,
        retrain=replace(
            base.retrain,
            top_k=1,
            seed_models=seed_models,
            seeds=tuple(args.retrain_seeds or base.retrain.seeds),
        ),
    )
    models: dict[str, Model] = {}  # retrained under this name, one per architecture
    # role -> the names its picks were retrained under (the role's `retrain.top_k` best
    # complete trials for "best", one otherwise); its pick: the best of them retrained
    candidates: dict[str, list[str]] = {}
    for role, key in picks.items():
        if key not in runs or runs[key]["best"] is None:
            continue
        study = optuna.load_study(study_name=runs[key]["study_name"], storage=runs[key]["storage"])
        own = (
            replace(settings, retrain=replace(settings.retrain, top_k=base.retrain.top_k))
            if role == "best"
            else replace(settings, retrain=replace(settings.retrain, seed_models=False))
        )
        for model in select_models(study, own):
            name = model.name if model.trial is None else f"{role}-{model.name}"
            same = next(
                (
                    n
                    for n, m in models.items()
                    if identity(m.architecture) == identity(model.architecture)
                ),
                None,
            )
            if model.trial is not None:
                candidates.setdefault(role, []).append(same or name)
            if same is None:
                models[name] = replace(model, name=name)
    if args.primer_reference and seed_models:  # the ET with both of Primer's edits
        primer = _primer_reference(settings)
        if all(identity(m.architecture) != identity(primer.architecture) for m in models.values()):
            models[primer.name] = primer
    selection = _select(base, models, candidates.get("best", []))
    if selection is not None:  # the best's other candidates played their part: not judged
        models = {n: m for n, m in models.items() if n not in selection["not_chosen"]}
    result = retrain_models(settings, list(models.values()))
    table = model_table(result.runs, settings.study.fitness)
    rows = {row["model"]: row for row in table}
    order = [row["model"] for row in table]  # best mean validation fitness first
    chosen = {
        role: min(names, key=lambda n: order.index(n) if n in order else len(order))
        for role, names in candidates.items()
        if role != "best" or selection is None
    }
    if selection is not None:
        chosen["best"] = selection["chosen"]
    out: dict[str, Any] = {
        "models": [_entry(n, m, result.runs) for n, m in models.items()],
        "picks": chosen,
        "table": table,
        "selected": result.selected,
        "selection": selection,  # None: the pick was chosen on the judging seeds themselves
        "judging_seeds": list(settings.retrain.seeds),
        "warm_vs_cold": _warm_vs_cold(rows, chosen),
    }
    if "best" in chosen:
        top = optuna.load_study(
            study_name=runs[picks["best"]]["study_name"], storage=runs[picks["best"]]["storage"]
        ).best_trial
        seeds = {summary(arch) for arch in seed_architectures(settings).values()}
        out["study_best"] = {
            "trial": top.number,
            "value": top.values[0],
            "is_a_seed": top.user_attrs.get("architecture") in seeds,
        }
        out["goal"] = _goal(rows, chosen["best"])
    return out


def _primer_reference(settings: NasSettings) -> Model:
    """The Evolved Transformer with squared ReLU and multi-DConv-head attention everywhere,
    as `space_room.py` builds it: what applying Primer's two edits by hand gives."""
    arch = with_primitives(seed_architectures(settings)[REFERENCE], PRIMITIVES)
    return Model(PRIMER_BOTH, None, seed_params(arch, primitives=PRIMITIVES), to_json(arch))


def _select(base: NasSettings, models: dict[str, Model], names: list[str]) -> dict[str, Any] | None:
    """With `retrain.selection_seeds` and more than one candidate: the candidates retrained
    on those seeds, the best (mean validation fitness) chosen; the judging seeds then see
    only it (no winner's curse). None otherwise."""
    seeds = base.retrain.selection_seeds
    if not seeds or len(names) < 2:
        return None
    choosing = replace(
        base, retrain=replace(base.retrain, seeds=seeds, selection_seeds=(), seed_models=False)
    )
    result = retrain_models(choosing, [models[n] for n in names])
    table = model_table(result.runs, base.study.fitness)
    best = table[0]["model"] if table else names[0]
    return {
        "seeds": list(seeds),
        "candidates": [_entry(n, models[n], result.runs) for n in names],
        "table": table,
        "chosen": best,
        "not_chosen": [n for n in names if n != best],
    }


def _entry(name: str, model: Model, runs: Sequence[RetrainRun]) -> dict[str, Any]:
    """One retrained model as the JSON's `retrained` list holds it: the seeds by their own
    names, a searched model as `trial-<number>` with the study (role) it came from; its
    figures per training seed that trained (`seeds`, in the same order), and its paired
    difference against the Evolved Transformer on the seeds both trained (None for the
    Evolved Transformer itself, or when it was not retrained)."""
    role, _, _ = name.partition("-trial-")
    mine = [run for run in runs if run.model == name]
    done = [run for run in mine if run.error is None]

    def values(metric: str) -> list[float]:
        return (
            [run.metrics[metric] for run in done]
            if all(metric in run.metrics for run in done)
            else []
        )

    return {
        "name": model.name if model.trial is None else f"trial-{model.trial}",
        "study": None if model.trial is None else role,
        "params": mine[0].parameters if mine else None,
        "architecture": model.params,
        "seeds": [run.seed for run in done],
        "validation_loss": values("validation_loss"),
        "chrf": values("validation_chrf"),
        "test_loss": values("test_loss"),
        "vs_evolved_transformer": _versus(name, runs, REFERENCE),
        "vs_evolved_transformer_both": _versus(name, runs, PRIMER_BOTH),
    }


def _versus(name: str, runs: Sequence[RetrainRun], reference: str) -> dict[str, Any] | None:
    """`name - reference` paired by training seed on validation loss and chrF (the metrics
    the runs have): mean, stderr, n, wins (`nas.paired.PairedDifference.to_dict`); None for
    the reference itself, or when it was not retrained."""
    if name == reference or not any(run.model == reference for run in runs):
        return None
    keys = {"validation_loss": "validation_loss", "validation_chrf": "chrf"}
    metrics = [m for m in keys if any(m in run.metrics for run in runs)]
    paired = paired_metrics(runs, name, reference, metrics)
    return {keys[metric]: pair.to_dict() for metric, pair in paired.items()}


def _warm_vs_cold(rows: dict[str, dict[str, Any]], chosen: dict[str, str]) -> dict[str, Any] | None:
    """What the warm (inherited weights) and cold studies picked, judged retrained from
    scratch: per study seed, the pick's validation loss and chrF over the training seeds;
    then the mean over study seeds."""
    out: dict[str, Any] = {}
    for variant in ("warm", "cold"):
        mine = [
            rows[name]
            for role, name in sorted(chosen.items())
            if role.startswith(f"{variant}-") and name in rows
        ]
        if not mine:
            return None
        out[variant] = {
            "picks": [
                {
                    "model": r["model"],
                    "parameters": r["parameters"],
                    "validation_loss_mean": r.get("validation_loss_mean"),
                    "validation_loss_sd": r.get("validation_loss_sd"),
                    "validation_chrf_mean": r.get("validation_chrf_mean"),
                }
                for r in mine
            ],
            "validation_loss_mean": statistics.fmean(r["validation_loss_mean"] for r in mine),
            "validation_chrf_mean": statistics.fmean(
                r.get("validation_chrf_mean", math.nan) for r in mine
            ),
        }
    return out


def _goal(rows: dict[str, dict[str, Any]], best_name: str) -> dict[str, Any]:
    """Does the study's best beat both seeds on validation loss and chrF, no larger?"""
    best = rows.get(best_name)
    seeds = [rows[n] for n in ("transformer", "evolved_transformer") if n in rows]
    if best is None or len(seeds) < 2:
        return {"met": None, "why": "no retrained best or seed"}
    checks = {
        "lower_validation_loss": all(
            best["validation_loss_mean"] < s["validation_loss_mean"] for s in seeds
        ),
        "higher_chrf": all(
            best.get("validation_chrf_mean", -1) > s.get("validation_chrf_mean", math.inf)
            for s in seeds
        ),
        "no_more_parameters": all(best["parameters"] <= s["parameters"] for s in seeds),
    }
    return {"met": all(checks.values()), **checks}


def _proxy(experiment: str) -> dict[str, Any] | None:
    """`proxy_rank.py`'s figures, when they were measured on `experiment`."""
    path = RESULTS / "proxy_rank.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    if data.get("experiment") != experiment:
        return None
    keys = (
        "kendall_tau",
        "kendall_p",
        "kendall_tau_by_eval_step",
        "kendall_tau_by_rung",
        "trial_budget_steps",
        "full_steps",
        "ranked",
        "mutants",
    )
    return {k: data.get(k) for k in keys}


def _plot(runs: dict[str, dict[str, Any]], path: Path, fitness: str) -> None:
    """Best-so-far against minutes: the headline study on the left, the comparisons (one
    colour per variant, one line per study seed) on the right; each panel its own budget."""
    panels = [
        ("headline", {k: r for k, r in runs.items() if k == "headline"}),
        ("equal wall-clock", {k: r for k, r in runs.items() if k != "headline"}),
    ]
    panels = [(title, chosen) for title, chosen in panels if chosen]
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (title, chosen) in zip(axes[0], panels, strict=True):
        colours: dict[str, Any] = {}
        for run in chosen.values():
            if not run["curve"]:
                continue
            x = [p[0] for p in run["curve"]] + [run["seconds"] / 60]
            y = [p[1] for p in run["curve"]] + [run["curve"][-1][1]]
            variant = run["variant"]
            line = ax.step(
                x,
                y,
                where="post",
                color=colours.get(variant),
                alpha=0.85,
                label=None if variant in colours else variant,
            )[0]
            colours.setdefault(variant, line.get_color())
        ax.set(
            xlabel="wall-clock minutes",
            title=title,
            ylabel=f"best {fitness.replace('_', ' ')} so far",
        )
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _brief(retrain: dict[str, Any]) -> Any:
    if not retrain:
        return None
    keys = ("validation_loss", "validation_chrf", "test_loss")
    return {
        "goal": retrain.get("goal"),
        "warm_vs_cold": retrain.get("warm_vs_cold"),
        "models": [
            {
                "model": r["model"],
                "parameters": r["parameters"],
                **{
                    k: (round(r.get(f"{k}_mean", math.nan), 4), round(r.get(f"{k}_sd", 0.0), 4))
                    for k in keys
                },
            }
            for r in retrain.get("table", [])
        ],
    }


if __name__ == "__main__":
    main()
