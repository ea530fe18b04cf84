"""PipeMare's convergence against synchronous 1F1B and plain asynchronous training.

Why: PipeMare (`schedule="pipemare"`) trades exact gradients for a pipeline without
flushes; its T1 (lr rescheduling) and T2 (discrepancy correction) are meant to keep the
trained model close to synchronous training where plain asynchronous training degrades.
This trains a small character language model (an MLP over a window of bytes of
`pydoc_data.topics`, the Bengio-style LM: embedding, residual GELU blocks, vocabulary head)
on S stages with three schedules, the same seed, batches and learning rate:

    1f1b      synchronous (PipeDream-Flush)
    pipemare  asynchronous, update per micro-batch, T1 + T2
    async     the same without T1 and T2

and reports the final losses (mean of the last `--tail` steps), the margins, a JSON
(`benchmarks/results/pipemare.json`) and a PNG of the loss curves beside it.

    python benchmarks/pipemare.py            # 4 stages, ~2-3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import time
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import pipeline
from pipeline import ElasticPipeline, LayerSpec, StageContext
from pipeline.local.pipemare import PipeMareConfig

RESULTS = pathlib.Path(__file__).parent / "results"


class Embed(nn.Module):
    def __init__(self, context: int, dim: int, width: int) -> None:
        super().__init__()
        self.emb, self.proj = nn.Embedding(256, dim), nn.Linear(context * dim, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.emb(x).flatten(1))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(self.norm(x)))


def char_lm(context: int, width: int, blocks: int) -> list[LayerSpec]:
    specs = [LayerSpec("embed", functools.partial(Embed, context, 16, width))]
    specs += [LayerSpec(f"block{i}", functools.partial(Block, width)) for i in range(blocks)]
    specs.append(LayerSpec("head", functools.partial(nn.Linear, width, 256)))
    return specs


def batches(steps: int, batch: int, context: int, seed: int = 0) -> list[tuple[Any, Any]]:
    from pydoc_data.topics import topics

    text = torch.tensor(list("".join(topics.values()).encode()[:400_000]), dtype=torch.long)
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        start = torch.randint(0, len(text) - context - 1, (batch,), generator=g)
        idx = start[:, None] + torch.arange(context + 1)
        window = text[idx]
        out.append((window[:, :-1], window[:, -1]))
    return out


def run(ctx: StageContext, args: argparse.Namespace, schedule: str,
        config: PipeMareConfig | None) -> list[float]:  # fmt: skip
    specs = char_lm(args.context, args.width, args.blocks)
    sizes = [len(specs) // args.stages] * args.stages
    for i in range(len(specs) - sum(sizes)):
        sizes[-1 - i] += 1
    opt = functools.partial(torch.optim.SGD, lr=args.lr, momentum=0.9)
    pipe = ElasticPipeline(specs, optimizer=opt, loss_fn=F.cross_entropy, schedule=schedule,
                           pipemare=config, n_microbatches=args.microbatches, seed=1,
                           partition=sizes, on_nonfinite="ignore")  # fmt: skip
    losses = list(pipe.train(batches(args.steps, args.batch, args.context)))
    pipe.close()
    return losses


def train_all(args: argparse.Namespace) -> dict[str, Any]:
    runs = {
        "1f1b": ("1f1b", None),
        "pipemare": ("pipemare", PipeMareConfig(warmup_updates=args.warmup, update_every=1,
                                                correction_decay=args.decay)),
        "async": ("pipemare", PipeMareConfig(lr_reschedule=False, correction=False)),
    }
    out: dict[str, Any] = {}
    for name, (schedule, config) in runs.items():
        t0 = time.perf_counter()
        losses = pipeline.launch(functools.partial(run, args=args, schedule=schedule,
                                                   config=config), args.stages,
                                 threads_per_stage=1, timeout_s=600)[0]  # fmt: skip
        final = sum(losses[-args.tail :]) / args.tail
        out[name] = {"losses": losses, "final": final, "seconds": time.perf_counter() - t0}
        print(f"{name:9s} final {final:.4f}  ({out[name]['seconds']:.0f} s)", flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--context", type=int, default=12)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.3)
    p.add_argument("--warmup", type=int, default=400)
    p.add_argument("--decay", type=float, default=0.1)
    p.add_argument("--tail", type=int, default=30)
    p.add_argument("--out", default=str(RESULTS / "pipemare.json"))
    args = p.parse_args()
    runs = train_all(args)
    f1, fm, fa = (runs[k]["final"] for k in ("1f1b", "pipemare", "async"))
    summary = {"pipemare_minus_1f1b": fm - f1, "async_minus_1f1b": fa - f1,
               "async_minus_pipemare": fa - fm}  # fmt: skip
    print(json.dumps(summary, indent=1))
    result = {"config": vars(args), "runs": runs, "summary": summary}
    path = pathlib.Path(args.out)
    path.write_text(json.dumps(result, indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, r in runs.items():
        ax.plot(r["losses"], label=f"{name} (final {r['final']:.3f})", lw=1)
    ax.set(xlabel="step", ylabel="training loss",
           title=f"char LM, {args.stages} stages, SGD lr {args.lr}")  # fmt: skip
    ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=100)


if __name__ == "__main__":
    main()
