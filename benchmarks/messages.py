"""Sentence translation of real software messages: the seeds' BLEU and chrF, and what subword
pieces buy over characters.

The `messages` task is English->German sentences from the system's gettext catalogs
(`nas.tasks.messages`). Two questions, at the budget of an experiment (default
`messages_cpu`: 1,000 steps, 2,000 BPE pieces):

1. **The seeds.** The Evolved Transformer and the Transformer seeds, retrained through the
   harness (`nas.retrain.stage.retrain_models`: whole validation and test splits, `decode_pairs`
   pairs decoded) with the same training seeds (a seed fixes the initialisation and the data
   order), each paired with the ET seed by seed (`nas.retrain.results.compare`) on
   validation loss, chrF and BLEU (sacreBLEU's corpus BLEU on detokenized text; its
   signature is in the JSON).
2. **Subwords against characters.** The ET trained `--speed-steps` steps on the same
   sentences with the experiment's subword tokenizer and with characters, one after the
   other, one run each on one worker: pairs per second, the runtime's tokens per second
   (batch x padded source length), and the mean length of a side in each tokenizer's units.

    python benchmarks/messages.py [--experiment messages_cpu] [--seeds 1 2 3] [overrides ...]

Run it alone: the load average before and after is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from _run import first_paragraph, write_json
from common import experiment_settings

from nas.retrain.results import compare, headline_objectives, model_table
from nas.retrain.stage import Model, RetrainRun, retrain_models
from nas.settings import NasSettings, TaskSettings
from nas.study.space import configured_space
from nas.tasks import get_task
from nas.tasks.parallel import ParallelCorpus
from search_spaces.architecture import to_json
from search_spaces.evolved_transformer import seed_params

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = "evolved_transformer"


def seed_models(settings: NasSettings) -> list[Model]:
    """The ET first (the reference every other model is paired with), then the Transformer."""
    seeds = configured_space(settings).seeds()
    return [
        Model(name, None, seed_params(seeds[name]), to_json(seeds[name]))
        for name in (REFERENCE, "transformer")
    ]


def retrained(
    settings: NasSettings, models: list[Model], seeds: tuple[int, ...]
) -> list[RetrainRun]:
    retrain = replace(settings.retrain, seeds=seeds, models_dir=tempfile.mkdtemp(prefix="msg_"))
    return list(retrain_models(replace(settings, retrain=retrain), models).runs)


def side_lengths(task: ParallelCorpus) -> dict[str, float]:
    """Mean length of a training pair's source and target in the task's units."""
    pairs = task.pairs("train")
    return {
        "source": statistics.fmean(len(task.vocab.encode(s)) for s, _ in pairs),
        "target": statistics.fmean(len(task.vocab.encode(t)) for _, t in pairs),
    }


def speed(settings: NasSettings, tokenizer: str, steps: int) -> dict[str, Any]:
    """One run of the ET for `steps` steps with `tokenizer` on the experiment's sentences
    (all of them: no subword length limit, so both tokenizers keep the same pairs)."""
    options = {**settings.task.options, "tokenizer": tokenizer, "max_tokens": None}
    task = get_task(settings.task.name, **options)
    assert isinstance(task, ParallelCorpus)
    mine = replace(
        settings,
        task=TaskSettings(name=settings.task.name, options=options),
        retrain=replace(settings.retrain, steps=steps, decode_pairs=1),
        study=replace(settings.study, workers=1),
    )
    (run,) = retrained(mine, seed_models(settings)[:1], (1,))
    return {
        "tokenizer": tokenizer,
        "vocab_size": len(task.vocab),
        "max_length": task.max_length,
        "sizes": task.describe()["sizes"],
        "mean_side_length": side_lengths(task),
        "steps": run.steps,
        "pairs_per_s": run.samples_per_s,
        "tokens_per_s": run.tokens_per_s,
        "validation_loss": run.metrics.get("validation_loss"),
        "error": run.error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--experiment", default="messages_cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--speed-steps", type=int, default=200)
    parser.add_argument("--skip-seeds", action="store_true", help="only the tokenizers' speed")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/messages.json")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. retrain.steps=600")
    args = parser.parse_args()
    os.environ.setdefault("WANDB_MODE", "offline")
    load_before = os.getloadavg()
    settings = experiment_settings(args.experiment, [*args.overrides, "tracker=none"])
    seeds = tuple(args.seeds) if args.seeds else settings.retrain.seeds
    task = get_task(settings.task.name, **settings.task.options)
    started = time.perf_counter()
    document: dict[str, Any] = {
        "experiment": args.experiment,
        "overrides": args.overrides,
        "task": task.describe(),
        "train": asdict(settings.train),
        "retrain_decode_pairs": settings.retrain.decode_pairs,
        "load_before": load_before,
    }
    if not args.skip_seeds:
        runs = retrained(settings, seed_models(settings), seeds)
        headline = headline_objectives(settings.task.name)
        reference, paired = compare(runs, settings.study.fitness, headline=headline)
        document |= {
            "seeds": list(seeds),
            "models": model_table(runs, settings.study.fitness),
            "reference": reference,
            "vs_reference": {m: {k: v.to_dict() for k, v in d.items()} for m, d in paired.items()},
            "runs": [asdict(run) | {"history": None} for run in runs],
        }
    chars = speed(settings, "chars", args.speed_steps)
    subwords = speed(settings, settings.task.options.get("tokenizer", "bpe"), args.speed_steps)
    document["speed"] = {
        "subwords": subwords,
        "chars": chars,
        "pairs_per_s_ratio": subwords["pairs_per_s"] / chars["pairs_per_s"],
        "same_pairs": subwords["sizes"] == chars["sizes"],
    }
    document |= {"seconds": time.perf_counter() - started, "load_after": os.getloadavg()}
    write_json(args.out, document, newline=True)
    _print(document)


def _print(document: dict[str, Any]) -> None:
    for row in document.get("models", []):
        print(json.dumps(row, default=str))
    print(json.dumps(document.get("vs_reference", {}), indent=2, default=str))
    speeds = document["speed"]
    for name in ("subwords", "chars"):
        s = speeds[name]
        print(
            f"{name:9} {s['tokenizer']:8} vocab {s['vocab_size']:5}  pairs/s "
            f"{s['pairs_per_s']:.1f}  tokens/s {s['tokens_per_s']:.0f}  mean side "
            f"{s['mean_side_length']['source']:.1f}/{s['mean_side_length']['target']:.1f}"
        )
    print(f"subwords / chars, pairs per second: {speeds['pairs_per_s_ratio']:.2f}x")


if __name__ == "__main__":
    main()
