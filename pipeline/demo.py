"""Demo: train a character language model pipeline-parallel and print its throughput.

The text is Python's own documentation (`pydoc_data.topics`, in the standard library), so
the demo needs no download. Every stage process reads the same text and draws the same
batches from a seeded generator; rank 0 prints progress.

    python -m pipeline.demo --stages 2 --steps 100 --schedule 1f1b
"""

from __future__ import annotations

import argparse
import functools
import math
import time

import torch
import torch.nn.functional as F

import pipeline
from pipeline import ElasticPipeline, StageContext
from pipeline.local.models import char_lm


def load_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[name] for name in sorted(topics))


class BatchIter:
    """Random windows of `seq + 1` characters: x = window[:-1], y = window[1:]."""

    def __init__(self, ids: torch.Tensor, batch: int, seq: int, seed: int) -> None:
        self.ids, self.batch, self.seq = ids, batch, seq
        self.generator = torch.Generator().manual_seed(seed)

    def __iter__(self) -> BatchIter:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        high = len(self.ids) - self.seq - 1
        starts = torch.randint(0, high, (self.batch,), generator=self.generator)
        windows = torch.stack([self.ids[s : s + self.seq + 1] for s in starts.tolist()])
        return windows[:, :-1], windows[:, 1:]  # (batch, seq) each


def train(ctx: StageContext, args: argparse.Namespace) -> dict[str, object]:
    text = load_text()
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    specs = char_lm(len(vocab), n_layers=args.layers, d_model=args.d_model, n_heads=4,
                    max_len=args.seq)  # fmt: skip
    pipe = ElasticPipeline(
        specs, optimizer=functools.partial(torch.optim.AdamW, lr=args.lr),
        loss_fn=F.cross_entropy, schedule=args.schedule, n_microbatches=args.microbatches,
        seed=args.seed,
    )  # fmt: skip
    data = BatchIter(ids, args.batch, args.seq, args.seed)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x, y = next(data)
        loss = pipe.train_step(x, y)  # the first step profiles the layers and plans
        if ctx.rank == 0 and step == 1:
            print(f"{len(text):,} characters, vocabulary {len(vocab)}, {len(specs)} layers on "
                  f"{ctx.world_size} stages {pipe.sizes} (planned), {args.schedule}")  # fmt: skip
        if ctx.rank == 0 and (step % args.log_every == 0 or step == args.steps):
            elapsed = time.perf_counter() - start
            tokens = step * args.batch * args.seq
            print(f"step {step:4d}/{args.steps}  loss {loss:.3f}  "
                  f"{loss / math.log(2):.2f} bits/char  {tokens / elapsed:,.0f} tokens/s",
                  flush=True)  # fmt: skip
    stats = pipe.stats()
    pipe.close()
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description="Pipeline-parallel character LM demo")
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=10)
    args = parser.parse_args()
    stats = pipeline.launch(functools.partial(train, args=args), n_stages=args.stages)[0]
    print(f"throughput {stats['samples_per_s'] * args.seq:,.0f} tokens/s "
          f"(median step {stats['iteration_s'] * 1e3:.1f} ms)")  # fmt: skip
    for s in stats["stages"]:
        print(f"  stage {s['stage']}: layers {', '.join(s['layers'])}; per step "
              f"forward {s['forward_s'] * 1e3:.1f} ms, backward {s['backward_s'] * 1e3:.1f} ms, "
              f"waiting {s['wait_s'] * 1e3:.1f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
