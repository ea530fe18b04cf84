"""How many of a sampler's proposals in the Evolved Transformer space are valid architectures.

Each sampler (Optuna's RandomSampler, TPESampler, NSGAIISampler, GPSampler and the
harness's `RegularizedEvolutionSampler`) proposes `--proposals` trials in an in-memory
`optuna.create_study` (ask/tell), each one `search_spaces.evolved_transformer.sample(trial)`
in two encoder-decoder spaces without a parameter window:

* small_cpu: d_model [32], 1 cell per side (the CPU demo's space);
* paper_like: d_model [64, 128], 1-3 cells per side.

The objective is the architecture's `parameter_count` (minimized: cheap, real, and it lets
the model-based samplers learn something). Reported per sampler and space: proposals, valid
(`sample` returned; every sample is valid by construction or repair, so anything else is a
bug), repaired (the same answers replayed with `repair=False` are rejected: the residual
repair was needed), distinct architectures, seconds; and the size of the intersection
search space (the parameters every trial asked: all that NSGA-II's crossover and the GP
model see, the rest is sampled independently at random).

For comparison the same loop runs the space as it was before (`--old-ref`, the module read
from git: dead branches on both sides, no `dec.cross_block`, no repair, every invalid
proposal rejected and told as FAIL), with the rejections by rule. There every sampler
proposes what its random start-up sampler does (seeded alike): none completes the trials a
model needs (TPE and GP 10, NSGA-II a generation of 50, evolution a population of 20).

    python benchmarks/valid_proposals.py [--proposals 200] [--seed 0] [--old-ref REF|none]
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import optuna
from _run import RESULTS, first_line, write_json
from optuna.samplers import BaseSampler, GPSampler, NSGAIISampler, RandomSampler, TPESampler
from optuna.search_space import IntersectionSearchSpace
from optuna.trial import TrialState

from nas.search.evolution import RegularizedEvolutionSampler
from search_spaces.architecture import InvalidArchitecture, summary
from search_spaces.compile import parameter_count
from search_spaces.evolved_transformer import sample
from search_spaces.suggest import FixedSuggest

ROOT = Path(__file__).resolve().parent.parent
OLD_REF = "b3fb342^"  # the last commit whose space rejected invalid proposals
SPACES: dict[str, dict[str, Any]] = {
    "small_cpu": {"decoder_only": False, "d_model": [32], "cells": (1, 1), "window": None},
    "paper_like": {"decoder_only": False, "d_model": [64, 128], "cells": (1, 3), "window": None},
}
SAMPLERS: dict[str, Callable[[int], BaseSampler]] = {
    "random": lambda seed: RandomSampler(seed=seed),
    "tpe": lambda seed: TPESampler(seed=seed),
    "nsga2": lambda seed: NSGAIISampler(seed=seed),
    "gp": lambda seed: GPSampler(seed=seed, warn_independent_sampling=False),
    "evolution": lambda seed: RegularizedEvolutionSampler(seed=seed),
}
RULES = {  # rejection message fragment -> rule (see validate)
    "both branches are dead": "dead",
    "only for the decoder": "encoder_attention_outside",
    "never attends": "no_cross_attention",
    "no residual path": "no_residual",
    "parameters is outside": "window",
}


def old_sample(ref: str) -> Callable[..., Any] | None:
    """`sample` of search_spaces/evolved_transformer.py at git `ref` (None if unavailable)."""
    try:
        source = subprocess.run(
            ["git", "show", f"{ref}:search_spaces/evolved_transformer.py"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        print(f"old space at {ref!r} unavailable: {error}", file=sys.stderr)
        return None
    spec = importlib.util.spec_from_loader("_old_evolved_transformer", loader=None)
    assert spec is not None
    module = ModuleType(spec.name)
    sys.modules[spec.name] = module  # dataclasses look their module up
    exec(compile(source, f"{ref}:evolved_transformer.py", "exec"), module.__dict__)
    return module.sample


def rule(error: InvalidArchitecture) -> str:
    return next((r for text, r in RULES.items() if text in str(error)), "other")


def run(
    make_sampler: Callable[[int], BaseSampler],
    space: dict[str, Any],
    proposals: int,
    seed: int,
    sample_fn: Callable[..., Any],
    measure_repair: bool,
) -> dict[str, Any]:
    study = optuna.create_study(direction="minimize", sampler=make_sampler(seed))
    valid, repaired, seen, rejected = 0, 0, set[str](), collections.Counter[str]()
    start = time.perf_counter()
    for _ in range(proposals):
        trial = study.ask()
        try:
            arch = sample_fn(trial, **space)
        except InvalidArchitecture as error:
            rejected[rule(error)] += 1
            study.tell(trial, state=TrialState.FAIL)
            continue
        valid += 1
        seen.add(summary(arch))
        study.tell(trial, parameter_count(arch))
        if measure_repair:  # outside the timing would be fairer; it is a small share
            try:
                sample_fn(FixedSuggest(trial.params), **space, repair=False)
            except InvalidArchitecture:
                repaired += 1
    seconds = time.perf_counter() - start
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    result: dict[str, Any] = {
        "proposals": proposals,
        "valid": valid,
        "valid_fraction": valid / proposals,
        "distinct_valid": len(seen),
        "seconds": round(seconds, 3),
        "best_parameter_count": min((t.values[0] for t in complete), default=None),
        "intersection_params": len(IntersectionSearchSpace().calculate(study)),
    }
    if measure_repair:
        result |= {"repaired": repaired, "repaired_fraction": repaired / proposals}
    if rejected:
        result["rejected_by"] = dict(rejected.most_common())
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--proposals", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samplers", nargs="+", choices=list(SAMPLERS), default=list(SAMPLERS))
    parser.add_argument("--old-ref", default=OLD_REF, help="git ref of the old space, or none")
    parser.add_argument("--out", type=Path, default=RESULTS / "valid_proposals.json")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    variants: dict[str, Callable[..., Any]] = {"current": sample}
    old = None if args.old_ref == "none" else old_sample(args.old_ref)
    if old is not None:
        variants["old"] = old
    results: dict[str, Any] = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "spaces": {
            name: {**space, "cells": list(space["cells"])} for name, space in SPACES.items()
        },
        "optuna": optuna.__version__,
    }
    for variant, sample_fn in variants.items():
        for space_name, space in SPACES.items():
            for name in args.samplers:
                r = run(
                    SAMPLERS[name],
                    space,
                    args.proposals,
                    args.seed,
                    sample_fn,
                    measure_repair=variant == "current",
                )
                results.setdefault(variant, {}).setdefault(space_name, {})[name] = r
                print(variant, space_name, name, json.dumps(r), flush=True)
    write_json(args.out, results, newline=True)


if __name__ == "__main__":
    main()
