"""The studies of `search_quality.py`: each variant's settings, running a study for a
wall-clock budget (or reading one back), what it did, and the summary over study seeds.

Why it exists: `search_quality.py` is the entry point and retrains the picks; running and
reading the studies (samplers, pruners, warm against cold) is this module's.
"""

from __future__ import annotations

import argparse
import collections
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

import optuna
from scipy.stats import kendalltau

from nas.search.fidelity import Fidelity, fidelity_of, is_measured
from nas.settings import NasSettings, PrunerSettings, SamplerSettings, lower_is_better
from nas.study.inheritance import INHERITED_FROM
from nas.study.opening import open_study
from nas.study.run import run_study
from nas.study.space import seed_models
from nas.study.trials import INVALID, counted, finished, seconds_searched
from search_spaces.architecture import summary

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


def variants_of(parts: list[str]) -> list[str]:
    """The study variants `parts` compare, each once, in the parts' order."""
    chosen = {
        "samplers": ["evolution", "random", "tpe"],
        "pruning": ["evolution", "evolution-pdh-median", "evolution-sha", "evolution-no-pdh"],
        "warm": ["evolution-inherit", "evolution-cold"],
    }
    return list(dict.fromkeys(v for part in parts for v in chosen.get(part, [])))


def read_stored(settings: NasSettings, variant: str, seed: int) -> dict[str, Any]:
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


def run_variant(
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
        return read_stored(settings, variant, seed)
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


def run_studies(
    base: NasSettings, wanted: list[str], args: argparse.Namespace
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every study the parts compare (seeds outermost: a slow stretch hits every variant),
    the headline's, and the picks to retrain: role -> the study whose pick it is."""
    runs: dict[str, dict[str, Any]] = {}
    for seed in range(args.study_seeds):
        for variant in wanted:
            minutes = args.compare_minutes
            runs[f"{variant}/{seed}"] = run_variant(base, variant, seed, minutes, None, args.reuse)
    picks: dict[str, str] = {}
    if "best" in args.parts:
        key = "evolution/0"
        if args.headline_study:  # a study the harness ran (and may have resumed) before
            key = "headline"
            runs[key] = read_stored(
                replace(base, study=replace(base.study, name=args.headline_study)), "evolution", 0
            )
        elif key not in runs or args.search_minutes != args.compare_minutes or args.search_trials:
            key = "headline"
            runs[key] = run_variant(
                base, "evolution", 0, args.search_minutes, args.search_trials, args.reuse
            )
        picks["best"] = key
    if "warm" in args.parts:
        for seed in range(args.study_seeds):
            picks |= {
                f"warm-{seed}": f"evolution-inherit/{seed}",
                f"cold-{seed}": f"evolution-cold/{seed}",
            }
    return runs, picks


def _best_so_far(
    done: Sequence[optuna.trial.FrozenTrial], fitness: str, start: datetime, ended: dict[int, Any]
) -> tuple[float | None, list[list[float]]]:
    """The study's best *measured* fitness (full budget: never an estimate) and its
    best-so-far curve against minutes since `start`."""
    curve: list[list[float]] = []
    best, best_key = None, math.inf  # the best fitness so far and its lower-is-better key
    for t in done:
        if t.state != optuna.trial.TrialState.COMPLETE or not t.values or not is_measured(t):
            continue
        key = lower_is_better(fitness, t.values[0])
        if key < best_key:
            best, best_key = t.values[0], key
            curve.append([(ended[t.number] - start).total_seconds() / 60, best])
    return best, curve


def _promotions(
    done: Sequence[optuna.trial.FrozenTrial], fitness: str, start: datetime, ended: dict[int, Any]
) -> list[list[float]]:
    """Each promoted child: [minutes since `start`, its estimate, its measurement]."""
    return [
        [
            (ended[t.number] - start).total_seconds() / 60,
            float(t.user_attrs[f"estimated_{fitness}"]),
            t.values[0],
        ]
        for t in done
        if fidelity_of(t) is Fidelity.PROMOTED
        and t.values
        and f"estimated_{fitness}" in t.user_attrs
    ]


def _seed_values(
    done: Sequence[optuna.trial.FrozenTrial], settings: NasSettings
) -> dict[str, float]:
    """Each seed model's measured fitness in the study, by name (the trials that trained it)."""
    names = {summary(arch): name for name, arch in seed_models(settings).items()}
    return {
        names[t.user_attrs["architecture"]]: t.values[0]
        for t in done
        if t.values and t.user_attrs.get("architecture") in names
    }


def _steps_trained(
    done: Sequence[optuna.trial.FrozenTrial], settings: NasSettings
) -> tuple[list[int], set[Any]]:
    """The steps each trial trained (and each parent's control), and the parents."""
    steps = [
        int(t.user_attrs.get("steps", settings.train.steps))
        if t.state == optuna.trial.TrialState.COMPLETE
        else max(t.intermediate_values, default=0)
        for t in done
    ]
    # study.fidelity=inherited: a parent's control trains `inherit_steps` once, for its children
    parents = {
        t.user_attrs[INHERITED_FROM] for t in done if "control_validation_loss" in t.user_attrs
    }
    steps += [settings.study.inherit_steps] * len(parents)
    return steps, parents


def _read(
    study: optuna.Study,
    settings: NasSettings,
    variant: str,
    seed: int,
    start: datetime,
    seconds: float,
) -> dict[str, Any]:
    """What a study did: trials by state, steps trained, best-so-far against minutes."""
    ended = {
        t.number: t.datetime_complete
        for t in study.trials
        if counted(t) and t.datetime_complete is not None
    }
    done = sorted((t for t in study.trials if t.number in ended), key=lambda t: ended[t.number])
    best, curve = _best_so_far(done, settings.study.fitness, start, ended)
    steps, parents = _steps_trained(done, settings)
    top = settings.train.steps * len(done)  # had every trial gone to the top rung
    states = [t.state.name.lower() for t in done]
    return {
        "variant": variant,
        "seed": seed,
        "seconds": seconds,
        "trials": len(done),
        "trials_per_hour": 3600 * len(done) / seconds,
        **{state: states.count(state) for state in ("complete", "pruned", "fail")},
        "fidelity": dict(collections.Counter(fidelity_of(t).value for t in done)),
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
        "promotions": _promotions(done, settings.study.fitness, start, ended),
        "seed_models": _seed_values(done, settings),
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


def summarize_variants(
    runs: dict[str, dict[str, Any]], variants: list[str], seeds: int
) -> dict[str, Any]:
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


def headline_pruning(headline: dict[str, Any] | None) -> dict[str, Any] | None:
    """The headline study's pruning: steps trained against every trial at the top rung."""
    if headline is None or "steps_if_all_top" not in headline:
        return None
    keys = ("steps_saved", "steps_trained", "steps_if_all_top", "pruned", "complete", "stopped_at")
    return {key: headline.get(key) for key in keys}
