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
into `--out` over what earlier runs of other parts wrote there. The studies are run and read
in `search_quality_studies.py`, the JSON and the picture put together in
`search_quality_report.py`; the retraining of the picks is here.

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
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
from _run import RESULTS, Clock, first_paragraph, write_json
from common import experiment_settings
from search_quality_report import brief, goal, merge, plot, warm_vs_cold
from search_quality_studies import run_studies, summarize_variants, variants_of

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
from nas.settings import NasSettings
from nas.study.leading import leader
from nas.study.space import configured_space, seed_models
from search_spaces.architecture import summary, to_json
from search_spaces.evolved_transformer import PRIMITIVES, seed_params
from search_spaces.primer import with_primitives

PRIMER_BOTH = f"{REFERENCE}+both"  # the ET with both Primer edits (`--primer-reference`)
PARTS = ("samplers", "pruning", "warm", "best")


def main() -> None:
    args = _arguments()
    if args.replot:  # draw the picture again from `--out`, run nothing
        saved = json.loads(args.out.read_text())
        plot(saved["studies"], args.out.with_suffix(".png"), saved["runs"][-1]["fitness"])
        return
    os.environ.setdefault("WANDB_MODE", "offline")
    root = Path(tempfile.mkdtemp(prefix="search_quality_"))
    base = experiment_settings(
        args.experiment,
        [f"studies_dir={root / 'studies'}", f"output_dir={root / 'run'}", *args.overrides],
    )
    if args.search_minutes is None:
        args.search_minutes = (base.study.time_budget_s or base.study.timeout_s or 3600) / 60
    clock = Clock()
    wanted = variants_of(args.parts)
    runs, picks = run_studies(base, wanted, args)
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
        "seconds": clock.seconds(),
        **clock.load_average(),
        # a `--headline-study` ran outside this script: the load before it, as measured then
        "headline_study_load_average_1_5_15_before": args.headline_load_before,
    }
    summary = summarize_variants(runs, wanted, args.study_seeds)
    if "headline" in runs:  # what the headline study judged per hour, and on which shape
        keys = ("trials", "trials_per_hour", "complete", "pruned", "refused", "shapes")
        summary["headline"] = {key: runs["headline"].get(key) for key in keys}
        # every trial is a candidate judged, at the fidelity counted beside it (inherited
        # estimates, promoted and full-budget measurements)
        summary["headline"]["candidates_per_hour"] = runs["headline"].get("trials_per_hour")
        summary["headline"]["fidelity"] = runs["headline"].get("fidelity")
    result = merge(args.out, run, runs, summary, retrained, args.experiment)
    write_json(args.out, result, newline=True)
    plot(result["studies"], args.out.with_suffix(".png"), base.study.fitness)
    print(
        json.dumps(
            {"summary": result["summary"], "retrain": brief(result["retrain"])},
            indent=2,
            default=str,
        )
    )


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
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


def _candidates(
    base: NasSettings, settings: NasSettings, runs: dict[str, dict[str, Any]], picks: dict[str, str]
) -> tuple[dict[str, Model], dict[str, list[str]]]:
    """The models to retrain, one per architecture (a network two studies picked,
    `nas.retrain.stage.identity`, once), and per role the names its picks were retrained
    under (the role's `retrain.top_k` best complete trials for "best", one otherwise)."""
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
    return models, candidates


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
    models, candidates = _candidates(base, settings, runs, picks)
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
        "warm_vs_cold": warm_vs_cold(rows, chosen),
    }
    if "best" in chosen:
        out["study_best"] = _study_best(runs[picks["best"]], settings)
        out["goal"] = goal(rows, chosen["best"])
    return out


def _study_best(run: dict[str, Any], settings: NasSettings) -> dict[str, Any]:
    """The best trial of the headline study `run`, and whether it is one of the seeds."""
    study = optuna.load_study(study_name=run["study_name"], storage=run["storage"])
    trials, fitness = study.get_trials(deepcopy=False), settings.study.fitness
    top = leader(trials, study.user_attrs, settings.seed, fitness) or study.best_trial
    seeds = {summary(arch) for arch in seed_models(settings).values()}
    return {
        "trial": top.number,
        "value": top.values[0],
        "is_a_seed": top.user_attrs.get("architecture") in seeds,
    }


def _primer_reference(settings: NasSettings) -> Model:
    """The Evolved Transformer with squared ReLU and multi-DConv-head attention everywhere,
    as `space_room.py` builds it: what applying Primer's two edits by hand gives."""
    arch = with_primitives(configured_space(settings).seeds()[REFERENCE], PRIMITIVES)
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


if __name__ == "__main__":
    main()
