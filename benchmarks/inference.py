"""What inference costs on a pipeline: `pipe.forward` on 2 ranks, each rank's `pipe.replica()`,
and the same layers in one process, at decoding's batch sizes.

Greedy decoding calls the model once per generated token, on a few to a hundred rows, and
reads only the last position, so per call the pipeline pays its stages in turn, its
messages and handing the outputs (batch x positions x vocabulary) to every rank. This
times one call of each, in interleaved rounds, on a decoder-like stack: 4 linear layers
of width `--width` over `--positions` positions, then a head over `--vocab` outputs, cut
[3, 2] on 2 stages of one thread each (CPU, gloo), 2 micro-batches. The replica's column
is what one rank pays when each decodes its own share (`nas.study.training.decode_share`).
Medians in milliseconds; JSON to benchmarks/results/inference.json.

    python benchmarks/inference.py [--rounds 30] [--rows 8 128]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _run import RESULTS, Clock, first_line, print_json, write_json
from torch import nn

import pipeline
from pipeline import ElasticPipeline, LayerSpec, PlanOptions, StageContext
from pipeline.local.spec import build_layer


def specs(width: int, vocab: int) -> list[LayerSpec]:
    body = [LayerSpec(f"l{i}", functools.partial(nn.Linear, width, width)) for i in range(4)]
    return [*body, LayerSpec("head", functools.partial(nn.Linear, width, vocab))]


def timed(call: Callable[[], Any], rounds: int) -> float:
    """Median milliseconds of `call`, barrier to barrier (every rank calls it)."""
    seconds = []
    for _ in range(rounds):
        dist.barrier()
        started = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - started)
    return 1000 * statistics.median(seconds)


def run(ctx: StageContext, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    layers = specs(args.width, args.vocab)
    pipe = ElasticPipeline(
        layers,
        optimizer=functools.partial(torch.optim.SGD, lr=0.1),
        loss_fn=F.mse_loss,
        planning=PlanOptions(partition=[3, 2]),
        n_microbatches=2,
    )
    x = torch.randn(8, args.positions, args.width)
    pipe.train_step(x, torch.randn(8, args.positions, args.vocab))
    replica = pipe.replica()
    alone = nn.Sequential(*[build_layer(s, 0, ctx.device) for s in layers]).eval()
    out: dict[str, dict[str, float]] = {}
    for rows in args.rows:
        batch = torch.randn(rows, args.positions, args.width)
        with torch.no_grad():
            calls = {
                "pipeline_forward": lambda b=batch: pipe.forward(b),
                "replica": lambda b=batch: replica(b),
                "one_process": lambda b=batch: alone(b),
            }
            out[f"rows_{rows}"] = {name: timed(call, args.rounds) for name, call in calls.items()}
    pipe.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--positions", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=2000)
    args = parser.parse_args()
    clock = Clock()
    medians = pipeline.launch(functools.partial(run, args=args), 2, threads_per_stage=1)[0]
    ratios = {
        rows: {
            "pipeline_forward_over_one_process": m["pipeline_forward"] / m["one_process"],
            "replica_over_one_process": m["replica"] / m["one_process"],
        }
        for rows, m in medians.items()
    }
    document = {
        "config": vars(args)
        | {"stages": 2, "partition": [3, 2], "microbatches": 2}
        | {"wall_s": clock.seconds(), **clock.load_average()},
        "median_ms": medians,
        "ratios": ratios,
    }
    write_json(RESULTS / "inference.json", document)
    print_json(document, ["median_ms", "ratios"])


if __name__ == "__main__":
    main()
