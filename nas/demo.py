"""Demo: train a character language model pipeline-parallel and print its throughput.

The README's main job until the NAS harness lands. It joins the three packages the way
the harness will: the data is `nas.tasks.CharLM` (Python's own documentation, from the
standard library, so nothing to download), the model is the search space's seed
Transformer compiled decoder-only for that vocabulary (`search_spaces.compile`), and
`pipeline` trains it on stage processes with a planned partition. Every stage process
builds the same task and draws the same batches (they depend only on the seed and the
epoch); rank 0 prints progress.

    python -m nas.demo --stages 2 --steps 100 --schedule 1f1b
"""

from __future__ import annotations

import argparse
import functools
import math
import time
from collections.abc import Iterator
from typing import Any

import torch

import pipeline
from nas.tasks import CharLM, masked_cross_entropy
from pipeline import ElasticPipeline, StageContext
from search_spaces.compile import compile as compile_arch
from search_spaces.evolved_transformer import transformer

N_HEADS = 4


def train_batches(task: CharLM, batch: int, seed: int) -> Iterator[tuple[Any, torch.Tensor]]:
    """Training batches epoch after epoch, without end."""
    epoch = 0
    while True:
        yield from task.batches("train", batch, seed=seed, epoch=epoch)
        epoch += 1


def train(ctx: StageContext, args: argparse.Namespace) -> dict[str, Any]:
    task = CharLM(seq_len=args.seq)
    arch = transformer(args.d_model, N_HEADS, n_enc=0, n_dec=args.layers)  # decoder-only
    specs = compile_arch(arch, len(task.vocab), max_len=args.seq, dropout=0.1)
    pipe = ElasticPipeline(
        specs, optimizer=functools.partial(torch.optim.AdamW, lr=args.lr),
        loss_fn=masked_cross_entropy, schedule=args.schedule,
        n_microbatches=args.microbatches, seed=args.seed,
    )  # fmt: skip
    data = train_batches(task, args.batch, args.seed)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = next(data)
        loss = pipe.train_step(x, y)  # the first step profiles the layers and plans
        if ctx.rank == 0 and step == 1:
            print(f"{task.size('train'):,} training characters, vocabulary {len(task.vocab)}, "
                  f"{len(specs)} layers (seed Transformer, {args.layers} decoder layers) on "
                  f"{ctx.world_size} stages {pipe.sizes} (planned), {args.schedule}")  # fmt: skip
        if ctx.rank == 0 and (step % args.log_every == 0 or step == args.steps):
            elapsed = time.perf_counter() - start
            tokens = step * args.batch * args.seq
            print(f"step {step:4d}/{args.steps}  loss {loss:.3f}  "
                  f"{loss / math.log(2):.2f} bits/char  {tokens / elapsed:,.0f} tokens/s",
                  flush=True)  # fmt: skip
    stats: Any = pipe.stats()
    pipe.close()
    return stats.to_dict() if hasattr(stats, "to_dict") else stats


def even_layers(text: str) -> int:
    """--layers: the seed puts two Transformer layers in each cell."""
    value = int(text)
    if value < 2 or value % 2:
        raise argparse.ArgumentTypeError(f"--layers must be even and >= 2, got {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Pipeline-parallel character LM demo")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--layers", type=even_layers, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args(argv)
    stats = pipeline.launch(functools.partial(train, args=args), n_stages=args.stages)[0]
    print(f"throughput {stats['samples_per_s'] * args.seq:,.0f} tokens/s "
          f"(median step {stats['iteration_s'] * 1e3:.1f} ms)")  # fmt: skip
    for s in stats["stages"]:
        print(f"  stage {s['stage']}: layers {', '.join(s['layers'])}; per step "
              f"forward {s['forward_s'] * 1e3:.1f} ms, backward {s['backward_s'] * 1e3:.1f} ms, "
              f"waiting {s['wait_s'] * 1e3:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
