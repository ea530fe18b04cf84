"""PipeMare against synchronous and plain asynchronous training, on a character LM.

Why: PipeMare (`schedule="pipemare"`) updates one weight copy under in-flight micro-batches,
so a micro-batch's gradient on stage s of S is S-1-s updates stale; its T1 (learning-rate
rescheduling) and T2 (discrepancy correction) are meant to keep the trained model close to
synchronous training where plain asynchronous training degrades. This measures that.

What is compared, and why it is fair. Asynchronous runs update after every micro-batch
(`update_every=1`), so the yardstick must make the same updates: `sync` is 1F1B with one
micro-batch per step on the same micro-batches in the same order (in one process,
`ReferenceTrainer(n_microbatches=1)`; PipeMare on one stage equals it bit for bit). The
three runs then differ only in staleness: same seed, data, update count, batch per update
and learning rate. (1F1B with M micro-batches per step makes M times fewer updates on M
times larger batches; comparing against it mixes that with staleness, as an earlier version
of this file did.)

    sync      synchronous, one update per micro-batch
    pipemare  asynchronous 1F1B stream, one update per micro-batch, T1 + T2
    async     the same without T1 and T2 (plus ablations t1 and t2 in the reference table)

The task: an MLP language model (embedding of a 12-character window, residual GELU blocks, a
vocabulary head: Bengio-style) predicting the next character of `nas.tasks.charlm`'s
training split (Python's help topics); the metric is the loss of the final weights on the
validation split (the character after each window), beside the training curves. 12 layers
on 8 stages give delays of 7..0 updates. SGD with momentum 0.9, micro-batches of 16.

The base learning rate decays by a cosine to zero over the run, for every run; T1 uses
K = the run's updates. Why: T1 only lowers early steps, so under a constant rate a stage
runs at the full rate and full delay after K updates, i.e. plain asynchronous training, and
at a rate where that is unstable the run blows up after K as plain asynchronous runs do
(`--constant-lr --warmup 100 --seeds 4 --lrs --no-pipeline --out /tmp/c.json`: NaN in 2 of
4 seeds for async, T1 alone and T1 + T2 alike; sync 3.37-3.54). K shorter than the run
fails the same way in part (5 seeds: K = 200 ends 0.12 behind sync, K = 400 or 800 0.05).

T2 alone does not help on this model, and neither does its exact version (the backward on
the forward's own weights, measured with a patched reference: +0.16 behind sync, async
+0.15): the gap here is staleness, which T1 addresses; T2's extrapolation itself works
(`tests/pipeline/local/test_pipemare_convergence.py`).

Outputs: the three training curves on the real pipeline (`pipeline.launch`, one seed, each
checked against the one-process reference), the validation losses of all five variants for
`--seeds` seeds in one process (`ReferenceTrainer` applies the pipeline's exact rule), the
per-seed margins to `sync`, the three modes over `--lrs` (where synchronous training is
best, and how far above it the chosen rate is: staleness costs most at high rates), a JSON
(`benchmarks/results/pipemare.json`) and a PNG beside it (drawn by `pipemare_plot.py`).

    python benchmarks/pipemare.py                 # ~6 minutes on 2 cores
    python benchmarks/pipemare.py --no-pipeline   # the reference runs only, ~4 minutes
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import pathlib
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import pipeline
from nas.tasks.base import PAD
from nas.tasks.charlm import CharLM
from pipeline import ElasticPipeline, LayerSpec, PlanOptions, ReferenceTrainer, StageContext
from pipeline.local.pipemare import PipeMareConfig
from pipeline.local.spec import build_layer

RESULTS = pathlib.Path(__file__).parent / "results"
Batch = tuple[torch.Tensor, torch.Tensor]

# mode -> (T1, T2); None: synchronous
MODES: dict[str, tuple[bool, bool] | None] = {
    "sync": None,
    "pipemare": (True, True),
    "async": (False, False),
    "t1": (True, False),
    "t2": (False, True),
}


# -- the model and the data ---------------------------------------------------------------
class Embed(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int, width: int) -> None:
        super().__init__()
        self.emb, self.proj = nn.Embedding(vocab, dim), nn.Linear(context * dim, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.emb(x).flatten(1))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.gelu(self.fc(self.norm(x)))


def char_lm(vocab: int, context: int, width: int, blocks: int) -> list[LayerSpec]:
    specs = [LayerSpec("embed", functools.partial(Embed, vocab, context, 16, width))]
    specs += [LayerSpec(f"block{i}", functools.partial(Block, width)) for i in range(blocks)]
    specs.append(LayerSpec("head", functools.partial(nn.Linear, width, vocab)))
    return specs


@functools.lru_cache(maxsize=2)
def task(context: int) -> CharLM:
    return CharLM(seq_len=context)


def last_char(batches: Iterable[Batch]) -> list[Batch]:
    """(window, next character): the target is the last position of the task's y."""
    return [(x, y[:, -1]) for x, y in batches]


def train_batches(context: int, steps: int, batch: int, seed: int) -> list[Batch]:
    return last_char(itertools.islice(task(context).batches("train", batch, seed=seed), steps))


def split(batches: list[Batch], n: int) -> list[Batch]:
    """Each batch as n micro-batches, in order (as the pipeline splits a step)."""
    return [(a, b) for x, y in batches for a, b in zip(x.chunk(n), y.chunk(n), strict=True)]


def validation_loss(layers: list[nn.Module], context: int) -> float:
    """Mean cross-entropy of the next character after every validation window."""
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in last_char(task(context).batches("validation", 512)):
            out = x
            for layer in layers:
                out = layer(out)
            total += float(F.cross_entropy(out, y, ignore_index=PAD, reduction="sum"))
            count += int((y != PAD).sum())
    return total / count


class CosineSGD(torch.optim.SGD):
    """SGD with momentum whose learning rate follows a cosine to 0 over `total` updates
    (constant when `total` is None).

    The factor multiplies whatever rate a group holds when `step` runs, so PipeMare's T1
    (which sets a stage's rate for one update) scales this schedule:
    lr(s, k) = lr(k) * tau_s ** -(1 - min(k / K, 1)).
    """

    def __init__(self, params: Any, *, lr: float, momentum: float, total: int | None) -> None:
        super().__init__(params, lr=lr, momentum=momentum)
        self.total, self.updates = total, 0

    def factor(self) -> float:
        if self.total is None:
            return 1.0
        return 0.5 * (1.0 + math.cos(math.pi * min(self.updates / self.total, 1.0)))

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        rates = [group["lr"] for group in self.param_groups]
        for group in self.param_groups:
            group["lr"] *= self.factor()
        try:
            return super().step(closure)
        finally:
            for group, lr in zip(self.param_groups, rates, strict=True):
                group["lr"] = lr
            self.updates += 1


# -- one run ------------------------------------------------------------------------------
def stage_sizes(n_layers: int, stages: int) -> list[int]:
    sizes = [n_layers // stages] * stages
    for i in range(n_layers - sum(sizes)):
        sizes[-1 - i] += 1
    return sizes


def setup(args: argparse.Namespace, mode: str, seed: int) -> dict[str, Any]:
    """What a run of `mode` trains: specs, optimizer, micro-batches per step, PipeMare's
    configuration and the batches (micro-batches for sync), the same in both harnesses."""
    specs = char_lm(len(task(args.context).vocab), args.context, args.width, args.blocks)
    updates = args.steps * args.microbatches
    data = train_batches(args.context, args.steps, args.batch, seed)
    switches, config = MODES[mode], None
    if switches is not None:
        config = PipeMareConfig(
            lr_reschedule=switches[0],
            correction=switches[1],
            warmup_updates=args.warmup or updates,
            correction_decay=args.decay,
        )
    return {
        "specs": specs,
        "config": config,
        "sizes": stage_sizes(len(specs), args.stages),
        "optimizer": functools.partial(
            CosineSGD,
            lr=args.lr,
            momentum=args.momentum,
            total=None if args.constant_lr else updates,
        ),
        "m": 1 if config is None else args.microbatches,
        "data": split(data, args.microbatches) if config is None else data,
    }


def per_step(losses: list[float], per: int) -> list[float]:
    """Micro-batch losses of sync as the mean of each step's `per`."""
    return [statistics.fmean(losses[i : i + per]) for i in range(0, len(losses), per)]


def reference_run(args: argparse.Namespace, mode: str, seed: int) -> dict[str, Any]:
    """`mode` in one process: losses per step (of `args.batch` samples) and the final
    weights' validation loss."""
    s = setup(args, mode, seed)
    trainer = ReferenceTrainer(
        s["specs"],
        optimizer=s["optimizer"],
        loss_fn=F.cross_entropy,
        n_microbatches=s["m"],
        seed=seed,
        pipemare=s["config"],
        stage_sizes=s["sizes"] if s["config"] else None,
    )
    losses = [trainer.train_step(x, y) for x, y in s["data"]]
    if s["config"] is None:
        losses = per_step(losses, args.microbatches)
    return {"losses": losses, "val": validation_loss(trainer.layers, args.context)}


def pipeline_run(
    ctx: StageContext, args: argparse.Namespace, mode: str, seed: int
) -> dict[str, Any]:
    """`mode` on the real pipeline (one process per stage): losses and rank 0's weights."""
    s = setup(args, mode, seed)
    pipe = ElasticPipeline(
        s["specs"],
        optimizer=s["optimizer"],
        loss_fn=F.cross_entropy,
        schedule="1f1b" if s["config"] is None else "pipemare",
        pipemare=s["config"],
        n_microbatches=s["m"],
        seed=seed,
        planning=PlanOptions(partition=s["sizes"]),
        on_nonfinite="ignore",
    )
    losses = list(pipe.train(s["data"]))
    state = pipe.full_state_dict()
    pipe.close()
    return {"losses": losses, "state": state}


def pipeline_curves(args: argparse.Namespace) -> dict[str, Any]:
    """sync, pipemare and async on `pipeline.launch` for seed 1, each beside its reference."""
    out: dict[str, Any] = {}
    for mode in ("sync", "pipemare", "async"):
        t0 = time.perf_counter()
        result = pipeline.launch(
            functools.partial(pipeline_run, args=args, mode=mode, seed=1),
            args.stages,
            threads_per_stage=1,
            timeout_s=900,
        )[0]
        seconds = time.perf_counter() - t0
        losses = result["losses"]
        if mode == "sync":
            losses = per_step(losses, args.microbatches)
        specs = setup(args, mode, 1)["specs"]
        layers = [build_layer(spec, 1, torch.device("cpu")) for spec in specs]
        for spec, layer in zip(specs, layers, strict=True):
            layer.load_state_dict(result["state"][spec.key])
        ref = reference_run(args, mode, 1)
        gap = max(abs(a - b) for a, b in zip(losses, ref["losses"], strict=True))
        out[mode] = {
            "losses": losses,
            "val": validation_loss(layers, args.context),
            "train_tail": statistics.fmean(losses[-args.tail :]),
            "max_abs_diff_vs_reference": gap,
            "seconds": seconds,
        }
        run = out[mode]
        print(
            f"pipeline {mode:9s} val {run['val']:.4f}  train {run['train_tail']:.4f}  "
            f"|pipeline - reference| <= {gap:.1e}  ({seconds:.0f} s)",
            flush=True,
        )
    return out


def reference_table(args: argparse.Namespace) -> dict[str, Any]:
    """Every mode for seeds 1..args.seeds in one process: validation losses, margins."""
    seeds = list(range(1, args.seeds + 1))
    vals: dict[str, list[float]] = {}
    for mode in MODES:
        vals[mode] = [reference_run(args, mode, seed)["val"] for seed in seeds]
        print(f"reference {mode:9s} val " + " ".join(f"{v:.4f}" for v in vals[mode]), flush=True)
    table: dict[str, Any] = {"seeds": seeds, "val": vals, "mean": {}, "sd": {}, "minus_sync": {}}
    for mode, v in vals.items():
        table["mean"][mode] = statistics.fmean(v)
        finite = len(v) > 1 and all(math.isfinite(x) for x in v)
        table["sd"][mode] = statistics.stdev(v) if finite else math.nan
        if mode != "sync":
            d = [a - b for a, b in zip(v, vals["sync"], strict=True)]
            table["minus_sync"][mode] = {
                "per_seed": d,
                "mean": statistics.fmean(d),
                "min": min(d),
                "max": max(d),
            }
    return table


def lr_sweep(args: argparse.Namespace, table: dict[str, Any]) -> dict[str, Any]:
    """sync, pipemare and async at each of `args.lrs` for `args.sweep_seeds` seeds: where
    synchronous training is best, and how far from it the chosen rate is."""
    seeds = table["seeds"][: args.sweep_seeds]
    sweep: dict[str, Any] = {"seeds": seeds, "mean": {}}
    for lr in args.lrs:
        at = argparse.Namespace(**{**vars(args), "lr": lr})
        means = {}
        for mode in ("sync", "pipemare", "async"):
            vals = (
                table["val"][mode][: len(seeds)]
                if lr == args.lr
                else [reference_run(at, mode, seed)["val"] for seed in seeds]
            )
            means[mode] = statistics.fmean(vals)
        sweep["mean"][str(lr)] = means
        print(f"lr {lr:<6} " + "  ".join(f"{m} {v:.4f}" for m, v in means.items()), flush=True)
    return sweep


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--stages", type=int, default=8)
    p.add_argument("--blocks", type=int, default=10)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--context", type=int, default=12)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--constant-lr", action="store_true", help="no cosine decay")
    p.add_argument("--warmup", type=int, default=0, help="T1's K (0: the run's updates)")
    p.add_argument("--decay", type=float, default=0.1, help="T2's D")
    p.add_argument("--tail", type=int, default=20)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--lrs", type=float, nargs="*", default=[0.01, 0.015, 0.02, 0.025])
    p.add_argument("--sweep-seeds", type=int, default=3)
    p.add_argument("--no-pipeline", action="store_true")
    p.add_argument("--out", default=str(RESULTS / "pipemare.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    result: dict[str, Any] = {"config": vars(args)}
    if not args.no_pipeline:
        result["pipeline"] = pipeline_curves(args)
    result["reference"] = reference_table(args)
    if args.lrs:
        result["lr_sweep"] = lr_sweep(args, result["reference"])
    print(json.dumps(result["reference"]["minus_sync"], indent=1))
    path = pathlib.Path(args.out)
    path.write_text(json.dumps(result, indent=1))
    # a sibling module, imported where this file runs as a script (benchmarks/ on the path);
    # the tests load this file alone
    from pipemare_plot import plot

    plot(path, args, result)


if __name__ == "__main__":
    main()
