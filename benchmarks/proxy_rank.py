"""Does the trial budget rank architectures as full training does? Kendall tau, measured.

A search is only as good as its proxy: if the validation loss after a trial's short budget
orders architectures differently from the loss after full training, the search optimises
the wrong thing. For `--archs` architectures of an experiment's space (both seeds, then
random samples inside its parameter window, the space's own `sample` with a seeded
`RandomSuggest`), each is trained twice from scratch on the pipeline runtime, with the
experiment's settings (`nas.retrain.retrain_models`, training seed = the study's seed):

* at the trial budget (`train.steps`, the trial's learning-rate schedule), scored as a
  trial is: the whole validation split at the end, the evaluation subset every
  `train.eval_every` steps (the points where PDH hurdles can sit);
* at the full budget (`retrain.steps`, the schedule stretched to it).

Reported: each architecture's parameters, curve and both losses; Kendall tau (scipy) between
the budget's final loss and the full loss, and between each evaluation step's loss and the
full loss (where a hurdle ranks well enough); seconds per run.

    python benchmarks/proxy_rank.py [--experiment search_1h] [--archs 10] [--sample-seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from common import experiment_settings
from scipy.stats import kendalltau

from nas.retrain import Model, RetrainResult, retrain_models
from nas.settings import NasSettings
from nas.trials import param_window, sample_architecture, seed_architectures
from search_spaces.architecture import InvalidArchitecture, summary, to_json
from search_spaces.compile import parameter_count
from search_spaces.evolved_transformer import seed_params, validate
from search_spaces.suggest import RandomSuggest

ROOT = Path(__file__).resolve().parent.parent


def architectures(settings: NasSettings, count: int, seed: int) -> list[Model]:
    """Both seeds, then distinct random samples inside the space's window."""
    models = [Model(name, None, seed_params(arch), to_json(arch))
              for name, arch in seed_architectures(settings).items()]  # fmt: skip
    window = param_window(settings)
    seen = {m.architecture for m in models}
    draw = seed
    while len(models) < count:
        suggest = RandomSuggest(draw)
        draw += 1
        arch = sample_architecture(suggest, settings)
        try:
            if window is not None:
                validate(arch, window=window)
        except InvalidArchitecture:
            continue
        if to_json(arch) not in seen:
            seen.add(to_json(arch))
            models.append(Model(f"random-{draw - 1}", None, dict(suggest.params), to_json(arch)))
    return models


def losses(result: RetrainResult) -> dict[str, dict[str, Any]]:
    out = {}
    for run in result.runs:
        out[run.model] = {
            "validation_loss": run.metrics.get("validation_loss"),
            "curve": {int(e["step"]): e["validation_loss"] for e in run.history
                      if "validation_loss" in e},
            "seconds": run.seconds, "error": run.error, "parameters": run.parameters,
        }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--experiment", default="search_1h")
    parser.add_argument("--archs", type=int, default=10)
    parser.add_argument("--sample-seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/proxy_rank.json")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. train.steps=300")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    settings = experiment_settings(args.experiment, args.overrides)
    models = architectures(settings, args.archs, args.sample_seed)
    folder = tempfile.mkdtemp(prefix="proxy_rank_")
    base = replace(settings, retrain=replace(settings.retrain, seeds=(settings.seed,),
                                             models_dir=folder))  # fmt: skip
    started = time.perf_counter()
    budget = losses(retrain_models(replace(base, retrain=replace(
        base.retrain, steps=settings.train.steps)), models))  # fmt: skip
    full_steps = base.retrain.steps or settings.train.steps
    full = losses(retrain_models(base, models))
    names = [m.name for m in models if budget[m.name]["error"] is None and
             full[m.name]["error"] is None]  # fmt: skip
    y = [full[n]["validation_loss"] for n in names]
    tau_final = kendalltau([budget[n]["validation_loss"] for n in names], y)
    steps = sorted(set.intersection(*(set(budget[n]["curve"]) for n in names))) if names else []
    by_step = {str(s): float(kendalltau([budget[n]["curve"][s] for n in names], y).statistic)
               for s in steps}  # fmt: skip
    result = {
        "experiment": args.experiment, "overrides": args.overrides,
        "trial_budget_steps": settings.train.steps, "full_steps": full_steps,
        "train": settings.train.__dict__, "d_model": list(settings.search_space.d_model),
        "param_window": settings.search_space.param_window,
        "architectures": [{
            "name": m.name, "parameters": budget[m.name]["parameters"],
            "body_parameters": parameter_count(_arch(m)), "summary": summary(_arch(m)),
            "params": m.params, "budget": budget[m.name], "full": full[m.name],
        } for m in models],
        "kendall_tau": float(tau_final.statistic), "kendall_p": float(tau_final.pvalue),
        "kendall_tau_by_eval_step": by_step, "ranked": len(names),
        "seconds": time.perf_counter() - started,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("kendall_tau", "kendall_p",
                                              "kendall_tau_by_eval_step", "seconds")}, indent=2))
    for a in result["architectures"]:
        print(f"{a['name']:22} {a['parameters']:>8} budget {a['budget']['validation_loss']:.4f} "
              f"full {a['full']['validation_loss']:.4f}")


def _arch(model: Model) -> Any:
    from search_spaces.architecture import from_json

    return from_json(model.architecture)


if __name__ == "__main__":
    main()
