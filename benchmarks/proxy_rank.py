"""Does the trial budget rank architectures as full training does? Kendall tau, measured.

A search is only as good as its proxy: if the validation loss after a trial's short budget
orders architectures differently from the loss after full training, the search optimises
the wrong thing. For `--archs` architectures of an experiment's space (both seeds, then
`--mutants` random one-edit mutants of the Evolved Transformer seed, where evolution spends
its trials, then random samples; all inside its parameter window and with the space's
primitives), each is trained from scratch on the pipeline runtime, with the experiment's
settings (`nas.retrain.stage.retrain_models`, training seed = the study's seed):

* at the trial budget (`train.steps`, the trial's learning-rate schedule), scored as a
  trial is: the whole validation split at the end, the evaluation subset every
  `train.eval_every` steps (the points where PDH hurdles can sit);
* at the full budget (`retrain.steps`, the schedule stretched to it); when the trial
  budget is the full budget (rungs, as `search_2h`), one run serves both.

Reported: each architecture's parameters, curve and both losses; Kendall tau (scipy) between
the budget's final loss and the full loss, and between each evaluation step's loss and the
full loss (`kendall_tau_by_eval_step`; `kendall_tau_by_rung` at the PDH budgets: how well
each hurdle ranks); seconds per run.

    python benchmarks/proxy_rank.py [--experiment search_2h] [--archs 10] [--mutants 5]
    python benchmarks/proxy_rank.py --experiment search_1h \
        --out benchmarks/results/proxy_rank_search_1h.json
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from _run import RESULTS, first_paragraph, print_json, write_json
from common import experiment_settings
from scipy.stats import kendalltau

from nas.retrain.stage import Model, RetrainResult, retrain_models
from nas.settings import NasSettings
from nas.study.space import configured_space
from search_spaces.architecture import (
    InvalidArchitecture,
    from_json,
    functional_key,
    summary,
    to_json,
)
from search_spaces.compile import parameter_count
from search_spaces.suggest import RandomSuggest


class OneEdit:
    """A `Suggest` that answers as `base` does but for one name, `target`, which gets
    another of its choices; names `base` never answered get random ones (what a mutation
    reaches that its parent did not ask), as the evolution sampler's children do."""

    def __init__(self, base: dict[str, Any], target: str, rng: random.Random) -> None:
        self.base, self.target, self.rng = base, target, rng
        self.params: dict[str, Any] = {}

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        if name not in self.params:
            others = [c for c in choices if c != self.base.get(name)]
            keep = name != self.target and self.base.get(name, _NONE) in choices
            self.params[name] = self.base[name] if keep else self.rng.choice(others or choices)
        return self.params[name]

    def suggest_int(self, name: str, low: int, high: int) -> int:
        return int(self.suggest_categorical(name, list(range(low, high + 1))))


_NONE = object()


def _valid(settings: NasSettings, suggest: Any) -> Any:
    """The architecture `suggest` answers, or None outside the space's window."""
    space = configured_space(settings)
    arch = space.sample(suggest)
    try:
        space.validate(arch)
    except InvalidArchitecture:
        return None
    return arch


def architectures(settings: NasSettings, count: int, mutants: int, seed: int) -> list[Model]:
    """Both seeds, then distinct one-edit mutants of the Evolved Transformer, then distinct
    random samples, all inside the space's window."""
    space = configured_space(settings)
    models = [
        Model(name, None, space.seed_params(arch), to_json(arch))
        for name, arch in space.seeds().items()
    ]
    seen = {functional_key(from_json(m.architecture)) for m in models}
    parent, rng, draw = models[-1].params, random.Random(seed), seed
    while len(models) < count:
        draw += 1
        mutant = len(models) < 2 + mutants
        suggest: Any = (
            OneEdit(parent, rng.choice(sorted(parent)), rng) if mutant else RandomSuggest(draw)
        )
        arch = _valid(settings, suggest)
        if arch is not None and functional_key(arch) not in seen:
            seen.add(functional_key(arch))
            name = f"mutant-{draw}" if mutant else f"random-{draw}"
            models.append(Model(name, None, dict(suggest.params), to_json(arch)))
    return models


def losses(result: RetrainResult) -> dict[str, dict[str, Any]]:
    out = {}
    for run in result.runs:
        out[run.model] = {
            "validation_loss": run.metrics.get("validation_loss"),
            "curve": {
                int(e["step"]): e["validation_loss"] for e in run.history if "validation_loss" in e
            },
            "seconds": run.seconds,
            "error": run.error,
            "parameters": run.parameters,
        }
    return out


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--experiment", default="search_2h")
    parser.add_argument("--archs", type=int, default=10)
    parser.add_argument(
        "--mutants",
        type=int,
        default=0,
        help="how many of the archs are one-edit mutants of the ET seed",
    )
    parser.add_argument("--sample-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "proxy_rank.json")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. train.steps=300")
    return parser.parse_args()


def _kendall(
    budget: dict[str, dict[str, Any]], full: dict[str, dict[str, Any]], models: list[Model]
) -> dict[str, Any]:
    """Kendall tau of the trial budget's ranking against full training's, at the end and at
    each evaluation step, over the models that trained at both."""
    names = [
        m.name for m in models if budget[m.name]["error"] is None and full[m.name]["error"] is None
    ]
    y = [full[n]["validation_loss"] for n in names]
    tau_final = kendalltau([budget[n]["validation_loss"] for n in names], y)
    steps = sorted(set.intersection(*(set(budget[n]["curve"]) for n in names))) if names else []
    by_step = {
        str(s): float(kendalltau([budget[n]["curve"][s] for n in names], y).statistic)
        for s in steps
    }
    return {"tau": tau_final, "by_step": by_step, "ranked": len(names)}


def main() -> None:
    args = _arguments()
    os.environ.setdefault("WANDB_MODE", "offline")
    settings = experiment_settings(args.experiment, args.overrides)
    models = architectures(settings, args.archs, args.mutants, args.sample_seed)
    folder = tempfile.mkdtemp(prefix="proxy_rank_")
    base = replace(
        settings, retrain=replace(settings.retrain, seeds=(settings.seed,), models_dir=folder)
    )
    started = time.perf_counter()
    budget = losses(
        retrain_models(
            replace(base, retrain=replace(base.retrain, steps=settings.train.steps)), models
        )
    )
    full_steps = base.retrain.steps or settings.train.steps
    full = budget if full_steps == settings.train.steps else losses(retrain_models(base, models))
    ranks = _kendall(budget, full, models)
    by_step = ranks["by_step"]
    result = {
        "experiment": args.experiment,
        "overrides": args.overrides,
        "trial_budget_steps": settings.train.steps,
        "full_steps": full_steps,
        "train": settings.train.__dict__,
        "d_model": list(settings.search_space.d_model),
        "param_window": settings.search_space.param_window,
        "architectures": [
            {
                "name": m.name,
                "parameters": budget[m.name]["parameters"],
                "body_parameters": parameter_count(_arch(m)),
                "summary": summary(_arch(m)),
                "params": m.params,
                "budget": budget[m.name],
                "full": full[m.name],
            }
            for m in models
        ],
        "kendall_tau": float(ranks["tau"].statistic),
        "kendall_p": float(ranks["tau"].pvalue),
        "kendall_tau_by_eval_step": by_step,
        "ranked": ranks["ranked"],
        "kendall_tau_by_rung": {b: t for b, t in by_step.items() if int(b) in _rungs(settings)},
        "mutants": sum(m.name.startswith("mutant-") for m in models),
        "seconds": time.perf_counter() - started,
    }
    write_json(args.out, result, newline=True)
    print_json(result, ("kendall_tau", "kendall_p", "kendall_tau_by_eval_step", "seconds"))
    for a in result["architectures"]:
        print(
            f"{a['name']:22} {a['parameters']:>8} budget {a['budget']['validation_loss']:.4f} "
            f"full {a['full']['validation_loss']:.4f}"
        )


def _arch(model: Model) -> Any:
    return from_json(model.architecture)


def _rungs(settings: NasSettings) -> list[int]:
    """The PDH budgets of the experiment, if it prunes with hurdles."""
    return list(settings.pruner.options.get("budgets", [])) if settings.pruner.name == "pdh" else []


if __name__ == "__main__":
    main()
