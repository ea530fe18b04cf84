"""Do the seed architectures learn? The Transformer and the Evolved Transformer on real data.

Both seeds of `search_spaces.evolved_transformer` are compiled to layers and trained on the
English->German names task (`nas.tasks.translation`, from pycountry's catalogs) in the
pipeline runtime on 2 stages (CPU gloo), one after the other on the same processes
(`reconfigure`), for the same fixed budget of steps. Reported per seed: validation loss
against the unigram baseline, token accuracy (teacher forced), and exact match and chrF of
greedy translations of the whole validation split. JSON to benchmarks/results/.

    python benchmarks/seed_learning.py [--steps 600] [--d-model 128]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path
from typing import Any

import torch
from _run import RESULTS, first_line, write_json

import pipeline
from nas.tasks.base import TokenStats, masked_cross_entropy
from nas.tasks.translation import Translation
from pipeline import ElasticPipeline, StageContext
from search_spaces.architecture import Architecture, summary
from search_spaces.compile import compile as compile_arch
from search_spaces.evolved_transformer import evolved_transformer, transformer


def seeds(d_model: int) -> dict[str, Architecture]:
    return {
        "transformer": transformer(d_model, n_heads=4, n_enc=2, n_dec=2),
        "evolved_transformer": evolved_transformer(d_model, n_heads=4, n_enc=1, n_dec=2),
    }


def evaluate(pipe: ElasticPipeline, task: Translation, batch_size: int) -> dict[str, float]:
    stats = TokenStats()
    for x, y in task.batches("validation", batch_size):
        stats.update(pipe.forward(x), y)
    return {
        "validation_loss": stats.loss,
        "token_accuracy": stats.accuracy,
        **task.generation_metrics(
            lambda s, t: pipe.forward((s, t)), "validation", batch_size=batch_size
        ),
    }


def train(ctx: StageContext, args: argparse.Namespace) -> dict[str, Any]:
    task = Translation(seed=0)
    optimizer = functools.partial(torch.optim.AdamW, lr=args.lr, weight_decay=0.01)
    pipe: ElasticPipeline | None = None
    results: dict[str, Any] = {"unigram_baseline": task.unigram_baseline("validation")}
    for name, arch in seeds(args.d_model).items():
        specs = compile_arch(arch, len(task.vocab), max_len=task.max_chars + 2, dropout=0.1)
        if pipe is None:
            pipe = ElasticPipeline(
                specs,
                optimizer=optimizer,
                loss_fn=masked_cross_entropy,
                n_microbatches=args.microbatches,
                seed=args.seed,
            )
        else:
            pipe.reconfigure(specs)
        start, losses, step = time.perf_counter(), [], 0
        while step < args.steps:
            for x, y in task.batches("train", args.batch, seed=args.seed, epoch=step):
                losses.append(pipe.train_step(x, y))
                step += 1
                if step == args.steps:
                    break
        train_s = time.perf_counter() - start
        results[name] = {
            "summary": summary(arch),
            "layers": len(specs),
            "partition": pipe.sizes,
            "steps": step,
            "train_s": train_s,
            "first_loss": losses[0],
            "last_train_loss": sum(losses[-20:]) / len(losses[-20:]),
            **evaluate(pipe, task, args.eval_batch),
        }
        if ctx.rank == 0:
            print(name, json.dumps(results[name]), flush=True)
    assert pipe is not None
    pipe.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--eval-batch", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "seed_learning.json")
    args = parser.parse_args()
    results = pipeline.launch(functools.partial(train, args=args), 2)[0]
    results["config"] = {k: v for k, v in vars(args).items() if k != "out"}
    for name in seeds(args.d_model):
        r = results[name]
        r["loss_vs_unigram"] = r["validation_loss"] / results["unigram_baseline"]
    write_json(args.out, results)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
