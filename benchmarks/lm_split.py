"""A decoder-only language model on 2 ranks: where the layers are cut decides the throughput.

Why it exists (issue 32): in a language model the head (LayerNorm + projection over a
32000-token vocabulary, and its cross-entropy) costs as much as many Transformer blocks, so
the split a user writes for torch.distributed.pipelining (equal blocks per stage, embedding
first, head last) leaves one rank waiting on the other. This measures how much that costs,
how much a brute-force split at layer boundaries wins back, and where this runtime's
`partition="auto"` (and `schedule="auto"`) lands against both and against the bounds.

The model: token embedding + learned positions (one layer), N causal pre-norm Transformer
blocks (N layers), final LayerNorm + vocabulary projection (the head layer); loss =
cross-entropy over the vocabulary. At these sizes the head alone can cost more than all the
other layers together, and then it bounds every cut: whatever the split, the rank that holds
it does more than half the work. So the benchmark also runs the same model with the head cut
finer (`--head-parts K`, default 2; 1 runs only the one-layer head): K layers, the first
applies the LayerNorm and the first 1/K of the projection's rows and passes the carry
(normed hidden, logits part), each next one appends its rows' logits, the last returns the
logits concatenated over the vocabulary (the loss is unchanged). Each part is cut from the
one-layer head built with the same seed and key, so both models compute the same function
from the same initial weights (the JSON records how far apart their first losses are).

Defaults: d_model 256, 4 heads, 8 blocks, vocabulary 32000, sequence 128, batch 8 (the
largest that M = 8 divides with one process's step near 1 s on one thread: batch 16 took
~5.5 s of CPU, measured on a loaded machine), dropout 0.1 in the blocks, SGD; 2 ranks
(CPU, gloo, 1 thread per rank), M = 4 and 8 micro-batches. Data: random token ids from a
seeded generator (the targets are the inputs shifted by one); throughput does not depend on
the values. Every layer comes from a `LayerSpec` built by `build_layer` with seed 0, so
every run starts from the same weights. Per M, timed side by side in the same two
processes, in interleaved rounds (`timed_rounds`), medians over rounds with their spread:

* torch: Schedule1F1B (one stage per rank), ScheduleInterleaved1F1B (4 chunks, rank r holds
  r and r+2) and ScheduleZBVZeroBubble (4 chunks, V: rank 0 holds 0 and 3) with the user's
  split (blocks as equal as possible, embedding in the first chunk, head in the last) and
  with the best splits by brute force: every cut at layer boundaries is scored by its
  slowest rank (then its slowest chunk) on per-layer forward+backward times measured in
  one process on rank 0 (median of a few runs at the micro-batch size); the best
  `--top` are timed and the fastest measured is kept. Each is checked first: one step
  with dropout off must give the single process's loss and gradients;
* torch by hand (issue 41): Schedule1F1B at every 2-way cut of the model that runs every
  run (between the embedding, the blocks and the head), as a user sweeping cuts would;
* ours: `ElasticPipeline(partition="auto", schedule="auto")`, and with partition "auto"
  each of gpipe, 1f1b, zbh1, interleaved_1f1b, zbv and 2bw (which changes the update
  rule), each trained `--correction-steps` steps (12) before it is timed, so that its plan
  is corrected from the stage times it measured (`ElasticOptions.correct_after`, 10); the
  first step's loss is compared with `ReferenceTrainer`'s (ours is exact by construction,
  the repository's tests check gradients);
* one process: the whole model on rank 0 with gradient accumulation (rank 1 idles);
* bounds (computed, not run): one process / 2 (both ranks half the compute, no messages),
  and the best cut at layer boundaries: one process x the slower rank's share of the
  per-layer time under the best 2-way cut (no bubble, no messages); the same for the best
  split into 4 chunks in each torch layout (loop, V), which can place a head cut into parts.

Both models (head as 1 layer, head as K layers) run the above, except that by default
(`--split-head-runs key`) the K-part model runs only ours (auto), torch's brute-force splits,
one process and the bounds (`all`: every run). Per M and model, the JSON says which layer is
the heaviest, its and the head's share of the per-layer time, and whether one layer bounds
every cut (its share > 1/2). `head_granularity` puts the two models side by side: the gain
of the finer head on the best-cut bound from the cut alone (the K-part model's per-layer
times, with the head's parts summed into one layer or not: the same timings, no noise
between models), the ratio of the two models' bounds and measured samples/s, and the gap
between their first losses; `summary_in_words` says it in sentences.

Writes benchmarks/results/lm_split.json and prints a table.

    python benchmarks/lm_split.py [--rounds 6] [--ms 4 8] [--batch 8] [--head-parts 2]
        [--split-head-runs key|all] [--correction-steps 12] [--quick] [--out F]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from common import agreed_check, timed_rounds
from schedules import chunks_of
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleInterleaved1F1B,
    ScheduleZBVZeroBubble,
)

import pipeline
from pipeline import CostCache, ElasticPipeline, LayerSpec, PlanOptions, StageContext
from pipeline.local.carry import as_carry, floating, leaf, unwrap
from pipeline.local.spec import build_layer
from pipeline.pure.partition import bounds, equal_sizes
from pipeline.pure.schedule import SCHEDULES, is_stream

STAGES = 2
OPTIMIZER = functools.partial(torch.optim.SGD, lr=1e-3)
OURS = ("auto", "gpipe", "1f1b", "zbh1", "interleaved_1f1b", "zbv", "2bw")
EXACT = ("auto", "gpipe", "1f1b", "zbh1", "interleaved_1f1b", "zbv")  # 2bw: another update
TORCH_SCHEDULES: dict[str, tuple[type, str]] = {  # name: (class, layout of `chunks_of`)
    "1f1b": (Schedule1F1B, "single"),
    "interleaved_1f1b": (ScheduleInterleaved1F1B, "loop"),
    "zbv": (ScheduleZBVZeroBubble, "v"),
}
LOSS_TOLERANCE, GRAD_TOLERANCE = 1e-4, 1e-4  # abs loss; max |g - ref| / max |ref| per tensor
LAYER_REPEATS = 3
SEED = 0  # every layer: build_layer(spec, SEED, ...), as ElasticPipeline's default seed
LAYOUTS = ("single", "loop", "v")  # the bounds' chunk layouts (see `chunks_of`)
SplitHeadRuns = Literal["key", "all"]


# -- the model ------------------------------------------------------------------------------
class Embedding(nn.Module):
    """Token ids (batch, seq) -> token + learned position embeddings (batch, seq, d_model)."""

    def __init__(self, vocab: int, seq: int, d_model: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, d_model), nn.Embedding(seq, d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


class CausalBlock(nn.Module):
    """A pre-norm Transformer block whose attention sees only earlier positions."""

    def __init__(self, d_model: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model, heads, 4 * d_model, dropout, batch_first=True, norm_first=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], x.device, x.dtype)
        return self.layer(x, src_mask=mask, is_causal=True)


class Head(nn.Module):
    """Final LayerNorm and the projection over the vocabulary: (b, s, d) -> (b, s, vocab)."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.norm, self.out = nn.LayerNorm(d_model), nn.Linear(d_model, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the gradient contiguous. The gradient of a `torch.cat`
    input is a strided view; torch's pipelining sizes its receive buffers with the strides
    of the gradients it saw, and gloo refuses non-contiguous buffers."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


class HeadPart(nn.Module):
    """Part `index` of `parts` of the head: `Head`'s weights (same seed and key), rows sliced.

    Part 0 applies the LayerNorm and returns (normed, logits_0); a middle part appends its
    logits to the carry; the last returns every part's logits concatenated over the vocabulary.
    """

    def __init__(self, d_model: int, vocab: int, parts: int, index: int) -> None:
        super().__init__()
        whole = build_layer(head_spec(d_model, vocab), SEED, torch.device("cpu"))
        assert isinstance(whole, Head)
        self.rows = bounds(equal_sizes(vocab, parts))[index]
        self.place = f"part {index + 1} of {parts}, vocabulary rows {self.rows} of {vocab}"
        self.norm: nn.LayerNorm | None = whole.norm if index == 0 else None
        self.weight = nn.Parameter(whole.out.weight.detach()[slice(*self.rows)].clone())
        self.bias = nn.Parameter(whole.out.bias.detach()[slice(*self.rows)].clone())
        self.last = index == parts - 1

    def extra_repr(self) -> str:  # the profiler's cost signature tells the parts apart
        return self.place

    def forward(self, *carry: Any) -> Any:
        items = carry[0] if len(carry) == 1 and isinstance(carry[0], tuple) else carry
        if self.norm is not None:
            normed, done = self.norm(items[0]), []
        else:
            normed, *done = items
        # not F.linear(normed, w, b): on 3-d input that returns a view, which torch's ZBV
        # cannot detach in place when it is a stage's output; the sum is no view, as cheap,
        # and equal to `Head`'s logits up to rounding (the JSON gives the loss difference)
        logits = F.linear(normed, self.weight) + self.bias
        if not self.last:
            return (normed, *done, logits)
        return torch.cat([*(_ContiguousGrad.apply(t) for t in done), logits], dim=-1)


def head_spec(d_model: int, vocab: int) -> LayerSpec:
    return LayerSpec("head", functools.partial(Head, d_model, vocab))


class Chain(nn.Module):
    """Layers in a row whose input may be several tensors (torch passes a tuple carry
    between stages as positional arguments; `nn.Sequential` takes one)."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, *carry: Any) -> Any:
        h = carry[0] if len(carry) == 1 else carry
        for layer in self.layers:
            h = layer(h)
        return h


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over the vocabulary of every position."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@dataclass(frozen=True)
class LMConfig:
    """The model's and the batch's sizes; every field is a command-line flag."""

    d_model: int = 256
    heads: int = 4
    blocks: int = 8
    vocab: int = 32000
    seq: int = 128
    batch: int = 8
    dropout: float = 0.1
    head_parts: int = 1  # the head as this many layers (--head-parts sets the second model's)

    @property
    def layers(self) -> int:
        return self.blocks + 1 + self.head_parts

    @property
    def label(self) -> str:
        return f"head_as_{self.head_parts}_layer" + ("s" if self.head_parts > 1 else "")

    def check(self, ms: Sequence[int]) -> None:
        """Every size positive, and the batch split evenly into each M's micro-batches."""
        for name, value in dataclasses.asdict(self).items():
            if name != "dropout" and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if self.head_parts > self.vocab:
            raise ValueError(f"--head-parts {self.head_parts} exceeds --vocab {self.vocab}")
        if self.d_model % self.heads:
            raise ValueError(f"--d-model {self.d_model} is not a multiple of --heads {self.heads}")
        for m in ms:
            if m < 1 or self.batch % m:
                raise ValueError(f"--batch {self.batch} does not split into M={m} micro-batches")

    def specs(self) -> list[LayerSpec]:
        """Embedding, the blocks, the head: keys "embed", "block<i>", "head" (or "head<i>")."""
        p, d = self.dropout, self.d_model
        head = [head_spec(d, self.vocab)]
        if self.head_parts > 1:
            head = [
                LayerSpec(
                    f"head{i}", functools.partial(HeadPart, d, self.vocab, self.head_parts, i)
                )
                for i in range(self.head_parts)
            ]
        return [
            LayerSpec("embed", functools.partial(Embedding, self.vocab, self.seq, self.d_model)),
            *[
                LayerSpec(f"block{i}", functools.partial(CausalBlock, self.d_model, self.heads, p))
                for i in range(self.blocks)
            ],
            *head,
        ]

    def data(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Seeded random token ids: (inputs, next-token targets), each (batch, seq)."""
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, self.vocab, (self.batch, self.seq + 1), generator=g)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


# -- splits ---------------------------------------------------------------------------------
def user_split(cfg: LMConfig, n_chunks: int) -> list[int]:
    """The split a user writes: blocks as equal as possible, embedding first, head last."""
    if cfg.blocks < n_chunks:
        return equal_sizes(cfg.layers, n_chunks)
    sizes = equal_sizes(cfg.blocks, n_chunks)
    sizes[0] += 1
    sizes[-1] += cfg.head_parts
    return sizes


def all_splits(n_layers: int, n_chunks: int) -> Iterator[list[int]]:
    """Every split of `n_layers` into `n_chunks` non-empty consecutive chunks."""
    for cuts in itertools.combinations(range(1, n_layers), n_chunks - 1):
        edges = [0, *cuts, n_layers]
        yield [b - a for a, b in itertools.pairwise(edges)]


def rank_times(sizes: Sequence[int], layout: str, times: Sequence[float]) -> list[float]:
    """Each rank's summed layer time under the split `sizes` and the chunk `layout`."""
    chunk = [sum(times[a:b]) for a, b in bounds(sizes)]
    return [sum(chunk[c] for c in chunks_of(layout, r)[1]) for r in range(STAGES)]


def best_splits(times: Sequence[float], layout: str, top: int) -> list[list[int]]:
    """The `top` splits with the least slowest-rank time (ties: least slowest-chunk time)."""
    n_chunks = chunks_of(layout, 0)[0]

    def score(sizes: list[int]) -> tuple[float, float]:
        chunk = [sum(times[a:b]) for a, b in bounds(sizes)]
        return max(rank_times(sizes, layout, times)), max(chunk)

    return sorted(all_splits(len(times), n_chunks), key=score)[:top]


def layer_times(cfg: LMConfig, m: int, device: torch.device) -> list[float]:
    """Forward + backward seconds of each layer alone at the micro-batch size (median)."""
    layers = [build_layer(s, SEED, device) for s in cfg.specs()]
    x, y = (t[: cfg.batch // m].to(device) for t in cfg.data())
    inputs = []
    with torch.no_grad():
        h = x
        for layer in layers:
            inputs.append(h)
            h = layer(h)
    times = []
    for i, layer in enumerate(layers):
        inp = inputs[i] if i == 0 else unwrap(leaf(as_carry(inputs[i], "a carry")))
        last = i == len(layers) - 1
        grads = None if last else [torch.randn_like(t) for t in floating(as_carry(layer(inp), ""))]
        samples = []
        for _ in range(LAYER_REPEATS + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            out = layer(inp)
            if grads is None:
                lm_loss(out, y).backward()
            else:
                torch.autograd.backward(floating(as_carry(out, "an output")), grads)
            samples.append(time.perf_counter() - t0)
        layer.zero_grad(set_to_none=True)
        times.append(statistics.median(samples[1:]))
    return times


# -- runs -----------------------------------------------------------------------------------
def reference_grads(cfg: LMConfig, m: int, device: torch.device) -> tuple[float, list[Any]]:
    """Dropout off: the mean micro-batch loss and each layer's gradients, accumulated over m."""
    model = Chain([build_layer(s, SEED, device) for s in cfg.specs()]).eval()
    total = 0.0
    for xi, yi in zip(*(t.chunk(m) for t in cfg.data()), strict=True):
        loss = lm_loss(model(xi), yi)
        (loss / m).backward()
        total += float(loss.detach())
    grads = [
        [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in layer.parameters()]
        for layer in model.layers
    ]
    return total / m, grads


def single_process(ctx: StageContext, cfg: LMConfig, m: int) -> Callable[[], None]:
    """One step of the whole model on rank 0, accumulating over m micro-batches."""
    if ctx.rank != 0:
        return lambda: None
    model = Chain([build_layer(s, SEED, ctx.device) for s in cfg.specs()])
    optimizer = OPTIMIZER(model.parameters())
    x, y = cfg.data()

    def step() -> None:
        for xi, yi in zip(x.chunk(m), y.chunk(m), strict=True):
            (lm_loss(model(xi), yi) / m).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def torch_run(
    ctx: StageContext,
    cfg: LMConfig,
    cls: type,
    layout: str,
    sizes: list[int],
    m: int,
    reference: tuple[float, list[Any]],
) -> tuple[Callable[[], None], dict[str, Any]]:
    """(step, check) of one torch schedule on this rank's chunks of the split `sizes`."""
    n_chunks, mine = chunks_of(layout, ctx.rank)
    spans = bounds(sizes)
    specs = cfg.specs()
    modules = [
        Chain([build_layer(s, SEED, ctx.device) for s in specs[slice(*spans[c])]]) for c in mine
    ]
    stages = [
        PipelineStage(mod, c, n_chunks, ctx.device) for mod, c in zip(modules, mine, strict=True)
    ]
    schedule = cls(stages[0] if layout == "single" else stages, n_microbatches=m, loss_fn=lm_loss)
    optimizer = OPTIMIZER([p for mod in modules for p in mod.parameters()])
    first, last = 0 in mine, n_chunks - 1 in mine
    x, y = cfg.data()

    def forward_backward(losses: list[torch.Tensor]) -> None:
        kwargs: dict[str, Any] = {"target": y, "losses": losses} if last else {}
        schedule.step(*((x,) if first else ()), **kwargs)

    for mod in modules:  # the check: dropout off, one step, loss and gradients
        mod.eval()
    losses: list[torch.Tensor] = []
    forward_backward(losses)
    loss = float(torch.stack([t.detach() for t in losses]).mean()) if last else None
    ref_loss, ref_grads = reference
    worst = 0.0
    for mod, c in zip(modules, mine, strict=True):
        for offset, layer in enumerate(mod.layers):
            got = [p.grad for p in layer.parameters()]
            for g, w in zip(got, ref_grads[spans[c][0] + offset], strict=True):
                diff = math.inf if g is None else float((g - w).abs().max())
                worst = max(worst, diff / float(w.abs().max().clamp_min(1e-30)))
    optimizer.zero_grad(set_to_none=True)
    for mod in modules:
        mod.train()
    check = agreed_check(loss, worst, ref_loss, (LOSS_TOLERANCE, GRAD_TOLERANCE))

    def step() -> None:
        forward_backward([])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step, check


def ours_run(
    cfg: LMConfig, name: str, m: int, cache: CostCache, steps: int, correction_steps: int
) -> tuple[Callable[[], None], ElasticPipeline, float]:
    """(step, pipeline, first loss); the first step plans, the next `correction_steps` let
    the plan be corrected from measured costs (`ElasticOptions.correct_after`, on by
    default) before anything is timed. 2bw trains a stream per round."""
    pipe = ElasticPipeline(
        cfg.specs(),
        optimizer=OPTIMIZER,
        loss_fn=lm_loss,
        schedule=name,
        n_microbatches=m,
        planning=PlanOptions(partition="auto", cost_cache=cache),
    )
    x, y = cfg.data()
    first_loss = pipe.train_step(x, y)
    if name == "auto" or not is_stream(name):
        for _ in range(correction_steps):
            pipe.train_step(x, y)
    calls = itertools.count()

    def step() -> None:
        if name == "auto" or not is_stream(name):
            pipe.train_step(x, y)
        elif next(calls) % steps == 0:
            for _ in pipe.train(itertools.repeat((x, y), steps)):
                pass

    return step, pipe, first_loss


def ours_record(pipe: ElasticPipeline, first_loss: float, ref_loss: float) -> dict[str, Any]:
    """What ours chose (schedule, partition, plan) and its first step's loss check."""
    stats = pipe.stats()
    return {
        "chosen_schedule": stats.schedule,
        "partition": list(stats.partition),
        "partition_history": pipe.partition_history,
        "replans": [e.details for e in pipe.events if e.kind in ("trigger", "replan")],
        "plan": stats.plan.to_dict() if stats.plan is not None else None,
        "first_step_loss": first_loss,
        "reference_first_step_loss": ref_loss,
        "loss_abs_diff": abs(first_loss - ref_loss),
        "predicted_iteration_s": stats.predicted_iteration_s,
        "bubble_fraction": stats.bubble_fraction,
        "tokens_per_s_last_step": stats.tokens_per_s,
    }


def _key(name: str, sizes: Sequence[int], m: int) -> str:
    return f"torch_{name}_{'-'.join(map(str, sizes))}_M{m}"


def build_m(
    ctx: StageContext,
    cfg: LMConfig,
    m: int,
    top: int,
    steps: int,
    cache: CostCache,
    full: bool,
    correction_steps: int,
) -> tuple[dict[str, Callable[[], None]], dict[str, Any], dict[str, Any]]:
    """Every run at M = m (not `full`: only torch's brute-force splits, ours (auto) and one
    process): (steps by key, records by key, the per-layer times and the reference loss)."""
    times: list[Any] = [layer_times(cfg, m, ctx.device) if ctx.rank == 0 else None]
    dist.broadcast_object_list(times, src=0)  # both ranks pick the same splits
    per_layer: list[float] = times[0]
    runs: dict[str, Callable[[], None]] = {}
    records: dict[str, dict[str, Any]] = {}
    reference = reference_grads(cfg, m, ctx.device)
    for name, (cls, layout) in TORCH_SCHEDULES.items():
        equal = user_split(cfg, chunks_of(layout, 0)[0])
        searched = best_splits(per_layer, layout, top)
        # 1F1B by hand: every cut between the blocks and the head (the model's own runs)
        swept = list(all_splits(cfg.layers, 2)) if full and layout == "single" else []
        chosen = [*([equal] if full else []), *searched, *swept]
        for sizes in [s for i, s in enumerate(chosen) if s not in chosen[:i]]:
            key = _key(name, sizes, m)
            records[key] = {
                "kind": "torch",
                "schedule": cls.__name__,
                "layout": layout,
                "chunk_sizes": sizes,
                "user_split": sizes == equal,
                "brute_force_rank": searched.index(sizes) if sizes in searched else None,
                "hand_swept": sizes in swept,
                "scored_rank_times_s": rank_times(sizes, layout, per_layer),
            }
            try:
                runs[key], records[key]["check"] = torch_run(
                    ctx, cfg, cls, layout, sizes, m, reference
                )
            except Exception as error:
                records[key]["error"] = f"{type(error).__name__}: {error}"[:2000]
    ref_loss = pipeline.ReferenceTrainer(
        cfg.specs(), optimizer=OPTIMIZER, loss_fn=lm_loss, n_microbatches=m
    ).train_step(*cfg.data())
    for name in OURS if full else ("auto",):
        key = f"ours_{name}_M{m}"
        records[key] = {"kind": "ours", "schedule": name, "exact": name in EXACT}
        try:
            runs[key], pipe, first = ours_run(cfg, name, m, cache, steps, correction_steps)
            records[key]["_pipe"] = (pipe, first, ref_loss)
        except Exception as error:
            records[key]["error"] = f"{type(error).__name__}: {error}"[:2000]
    runs[f"single_process_M{m}"] = single_process(ctx, cfg, m)
    records[f"single_process_M{m}"] = {"kind": "single_process"}
    names = [s.key for s in cfg.specs()]
    return runs, records, {"layer_names": names, "times_s": per_layer, "ref_loss": reference[0]}


def run_all(
    ctx: StageContext,
    models: Sequence[tuple[LMConfig, bool]],
    ms: Sequence[int],
    rounds: int,
    steps: int,
    top: int,
    correction_steps: int,
) -> dict[str, Any]:
    """In both processes: build every run of every (model, full?) at every M, warm up, time
    them all in the same rounds. Keys: "<model label>/<run>_M<m>"."""
    cache = CostCache()
    runs: dict[str, Callable[[], None]] = {}
    records: dict[str, dict[str, Any]] = {}
    layers: dict[str, dict[str, Any]] = {}
    for cfg, full in models:
        layers[cfg.label] = {}
        for m in ms:
            r, rec, layers[cfg.label][f"M{m}"] = build_m(
                ctx, cfg, m, top, steps, cache, full, correction_steps
            )
            runs.update({f"{cfg.label}/{k}": v for k, v in r.items()})
            records.update({f"{cfg.label}/{k}": v for k, v in rec.items()})
    for key, step in list(runs.items()):  # a second warm-up step (the first: plan / check)
        try:
            step()
        except Exception as error:
            records[key]["error"] = f"{type(error).__name__}: {error}"[:2000]
            del runs[key]
    seconds = timed_rounds(runs, rounds, steps)
    for key, rec in records.items():
        ours = rec.pop("_pipe", None)
        if ours is not None and key in seconds:
            rec.update(ours_record(*ours))
        if key in seconds:
            rec["per_round_step_s"] = seconds[key]
    by_model = {
        label: {k.split("/", 1)[1]: v for k, v in records.items() if k.startswith(f"{label}/")}
        for label in layers
    }
    return {"records": by_model, "layer_times": layers, "registry": sorted(SCHEDULES)}


# -- the report -----------------------------------------------------------------------------
def _best(runs: dict[str, dict[str, Any]], ok: Callable[[dict[str, Any]], bool]) -> Any:
    cands = [(v["samples_per_s"], k) for k, v in runs.items() if "samples_per_s" in v and ok(v)]
    return max(cands)[1] if cands else None


def _correct(v: dict[str, Any]) -> bool:
    return v["kind"] == "torch" and bool(v.get("check", {}).get("correct"))


def best_cuts(per_layer: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Per chunk layout: the best split by per-layer time and its slower rank's share."""
    out = {}
    for layout in LAYOUTS:
        if len(per_layer) >= chunks_of(layout, 0)[0]:
            sizes = best_splits(per_layer, layout, 1)[0]
            share = max(rank_times(sizes, layout, per_layer)) / sum(per_layer)
            out[layout] = {"chunk_sizes": sizes, "slower_rank_share": share}
    return out


def cut_analysis(cfg: LMConfig, lt: dict[str, Any]) -> dict[str, Any]:
    """Where the per-layer time sits (shares of its sum, i.e. of one process's step without
    the optimizer): the heaviest layer, the head, and the best split in each chunk layout;
    for a head in parts, also with the parts' times summed into one layer (the same
    timings, so the difference is the cut's alone, free of timing noise between models)."""
    per_layer, names = lt["times_s"], lt["layer_names"]
    total = sum(per_layer)
    top = max(range(len(per_layer)), key=per_layer.__getitem__)
    head = sum(per_layer[cfg.blocks + 1 :])
    merged = best_cuts([*per_layer[: cfg.blocks + 1], head]) if cfg.head_parts > 1 else None
    return {
        "heaviest_layer": names[top],
        "heaviest_layer_share": per_layer[top] / total,
        "one_layer_bounds_every_cut": per_layer[top] > total - per_layer[top],
        "head_layers": names[cfg.blocks + 1 :],
        "head_share": head / total,
        "head_over_half": head > total - head,
        "head_time_over_mean_block_time": head
        / statistics.mean(per_layer[1 : cfg.blocks + 1] or [math.nan]),
        "best_cut_by_layout": best_cuts(per_layer),
        "best_cut_by_layout_head_as_one_layer": merged,
    }


def summarize(
    cfg: LMConfig, ms: Sequence[int], records: dict[str, Any], layers: dict[str, Any]
) -> dict[str, Any]:
    """Per M: samples/s per run, the bests, the bounds and ours(auto)'s ratios to them."""
    out: dict[str, Any] = {}
    for m in ms:
        mine = {k[: -len(f"_M{m}")]: v for k, v in records.items() if k.endswith(f"_M{m}")}
        for rec in mine.values():
            if times := rec.get("per_round_step_s"):
                rec["median_step_s"] = statistics.median(times)
                rec["samples_per_s"] = cfg.batch / rec["median_step_s"]
                rec["samples_per_s_min_max"] = [cfg.batch / max(times), cfg.batch / min(times)]
                rec["spread"] = (max(times) - min(times)) / rec["median_step_s"]
        single_s = mine["single_process"]["median_step_s"]
        cuts = cut_analysis(cfg, layers[f"M{m}"])
        shares = {k: v["slower_rank_share"] for k, v in cuts["best_cut_by_layout"].items()}
        chunked = min((v for k, v in shares.items() if k != "single"), default=math.nan)
        bounds_sps = {
            "half_of_one_process": 2 * cfg.batch / single_s,
            "best_cut_at_layer_boundaries": cfg.batch / (single_s * shares["single"]),
            "best_cut_at_layer_boundaries_4_chunks": cfg.batch / (single_s * chunked),
        }
        res: dict[str, Any] = {
            "one_process_samples_per_s": cfg.batch / single_s,
            "single_process_loss_dropout_off": layers[f"M{m}"]["ref_loss"],
            "head_share_of_one_process_step": m
            * sum(layers[f"M{m}"]["times_s"][cfg.blocks + 1 :])
            / single_s,
            "bounds_samples_per_s": bounds_sps,
            "best_2way_cut": cuts["best_cut_by_layout"]["single"]["chunk_sizes"],
            "best_2way_cut_slower_share": shares["single"],
            "cuts": cuts,
        }
        best = {
            "torch_user_split": _best(mine, lambda v: _correct(v) and v["user_split"]),
            "torch_brute_force": _best(
                mine, lambda v: _correct(v) and v["brute_force_rank"] is not None
            ),
            "torch_1f1b_hand_swept": _best(mine, lambda v: _correct(v) and v["hand_swept"]),
            "torch_1f1b_equal_split": _best(
                mine, lambda v: _correct(v) and v["user_split"] and v["layout"] == "single"
            ),
            "ours_auto": "ours_auto" if "samples_per_s" in mine.get("ours_auto", {}) else None,
            "ours_best_exact": _best(mine, lambda v: v["kind"] == "ours" and v["exact"]),
        }
        sps = {k: mine[v]["samples_per_s"] if v else math.nan for k, v in best.items()}
        per_schedule = {}
        for name in TORCH_SCHEDULES:
            of = {k: v for k, v in mine.items() if k.startswith(f"torch_{name}_")}
            user = _best(of, lambda v: _correct(v) and v["user_split"])
            found = _best(of, lambda v: _correct(v) and v["brute_force_rank"] is not None)
            per_schedule[name] = {"user_split": user, "brute_force_fastest_measured": found}
        auto = mine.get("ours_auto", {})
        res |= {
            "best": best,
            "best_samples_per_s": sps,
            "torch_per_schedule": per_schedule,
            "ours_auto_chose": {k: auto.get(k) for k in ("chosen_schedule", "partition")},
            "ours_auto_vs_torch_best_user_split": sps["ours_auto"] / sps["torch_user_split"],
            "ours_auto_vs_torch_best_brute_force": sps["ours_auto"] / sps["torch_brute_force"],
            "ours_auto_vs_torch_1f1b_best_hand_swept": sps["ours_auto"]
            / sps["torch_1f1b_hand_swept"],
            "ours_auto_vs_torch_1f1b_equal_split": sps["ours_auto"] / sps["torch_1f1b_equal_split"],
            "torch_1f1b_best_hand_swept_cut": mine.get(best["torch_1f1b_hand_swept"] or "", {}).get(
                "chunk_sizes"
            ),
            "ours_auto_vs_best_cut_bound": sps["ours_auto"]
            / bounds_sps["best_cut_at_layer_boundaries"],
            "ours_auto_vs_half_of_one_process": sps["ours_auto"]
            / bounds_sps["half_of_one_process"],
            "runs": mine,
        }
        out[f"M{m}"] = res
    return out


def _model_row(res: dict[str, Any]) -> dict[str, Any]:
    cuts, sps = res["cuts"], res["best_samples_per_s"]
    return {
        **{k: cuts[k] for k in ("heaviest_layer", "heaviest_layer_share")},
        **{k: cuts[k] for k in ("one_layer_bounds_every_cut", "head_share", "head_over_half")},
        "head_share_of_one_process_step": res["head_share_of_one_process_step"],
        **{
            f"best_cut_slower_share_by_layout{tail}": {
                k: v["slower_rank_share"] for k, v in (cuts[f"best_cut_by_layout{tail}"]).items()
            }
            for tail in ("", "_head_as_one_layer")
            if cuts[f"best_cut_by_layout{tail}"] is not None
        },
        "bounds_samples_per_s": res["bounds_samples_per_s"],
        "one_process_samples_per_s": res["one_process_samples_per_s"],
        "ours_auto_samples_per_s": sps["ours_auto"],
        "torch_brute_force_samples_per_s": sps["torch_brute_force"],
        "torch_1f1b_hand_swept_samples_per_s": sps["torch_1f1b_hand_swept"],
        "torch_1f1b_equal_split_samples_per_s": sps["torch_1f1b_equal_split"],
        "torch_1f1b_best_hand_swept_cut": res["torch_1f1b_best_hand_swept_cut"],
        "ours_auto_partition": res["ours_auto_chose"]["partition"],
    }


def _sentence(m: int, label: str, row: dict[str, Any]) -> str:
    b = row["bounds_samples_per_s"]
    shares = row["best_cut_slower_share_by_layout"]
    chunked = min((v for k, v in shares.items() if k != "single"), default=math.nan)
    over = "more" if row["head_over_half"] else "less"
    heavy = f"{row['heaviest_layer']}, {row['heaviest_layer_share']:.0%}"
    return (
        f"M{m}, {label.replace('_', ' ')}: the head is {row['head_share']:.0%} of the per-layer "
        f"time ({row['head_share_of_one_process_step']:.0%} of the one-process step), {over} "
        "than all other layers together; "
        + (
            f"one layer ({heavy}) bounds every cut"
            if row["one_layer_bounds_every_cut"]
            else f"no single layer bounds every cut (heaviest: {heavy})"
        )
        + f". The best 2-way cut leaves {shares['single']:.0%} on the slower rank (bound "
        f"{b['best_cut_at_layer_boundaries']:.1f} samples/s), the best 4-chunk cut {chunked:.0%} "
        f"(bound {b['best_cut_at_layer_boundaries_4_chunks']:.1f}); measured: ours (auto) "
        f"{row['ours_auto_samples_per_s']:.1f}, torch brute force "
        f"{row['torch_brute_force_samples_per_s']:.1f}, one process "
        f"{row['one_process_samples_per_s']:.1f} samples/s." + _swept_sentence(row)
    )


def _swept_sentence(row: dict[str, Any]) -> str:
    """Ours against torch 1F1B's hand sweep (only the model every run ran has one)."""
    swept, equal = (row[f"torch_1f1b_{k}_samples_per_s"] for k in ("hand_swept", "equal_split"))
    if not math.isfinite(swept):
        return ""
    ours = row["ours_auto_samples_per_s"]
    return (
        f" Against torch 1F1B: the best hand-swept cut {row['torch_1f1b_best_hand_swept_cut']} "
        f"{swept:.2f} samples/s, the equal split {equal:.2f}; ours (auto, cut "
        f"{row['ours_auto_partition']} after its measured correction) x{ours / swept:.3f} and "
        f"x{ours / equal:.3f}."
    )


def head_granularity(
    cfgs: Sequence[LMConfig], by_model: dict[str, Any], ms: Sequence[int]
) -> tuple[dict[str, Any], list[str]]:
    """Per M: the models (head as 1 layer, as K) side by side, with the finer head's gains
    (its number over the one-layer head's), and the same in sentences."""
    out: dict[str, Any] = {}
    words = []
    for m in ms:
        row = {c.label: _model_row(by_model[c.label][f"M{m}"]) for c in cfgs}
        words += [_sentence(m, c.label, row[c.label]) for c in cfgs]
        if len(cfgs) == 2:
            one, fine = (row[c.label] for c in cfgs)
            shares = [  # the K-part model's timings, its head summed into one layer or not
                fine[f"best_cut_slower_share_by_layout{tail}"]
                for tail in ("_head_as_one_layer", "")
            ]
            chunked = [min(v for k, v in sh.items() if k != "single") for sh in shares]
            gain = {  # the bound's gain from the cut alone (same timings), then across models
                **{
                    f"best_cut_bound_{k}_same_timings": v / shares[1][k]
                    for k, v in shares[0].items()
                },
                "best_cut_bound_4_chunks_same_timings": chunked[0] / chunked[1],
                **{
                    f"bound_{k}": fine["bounds_samples_per_s"][k] / v
                    for k, v in one["bounds_samples_per_s"].items()
                },
                **{
                    k: fine[f"{k}_samples_per_s"] / one[f"{k}_samples_per_s"]
                    for k in ("one_process", "ours_auto", "torch_brute_force")
                },
            }
            losses = [by_model[c.label][f"M{m}"]["single_process_loss_dropout_off"] for c in cfgs]
            row |= {
                "finer_head_over_one_layer_head": gain,
                "single_process_loss_abs_diff": abs(losses[1] - losses[0]),
            }
            words.append(
                f"M{m}: on the same per-layer times, the head as {cfgs[1].head_parts} layers "
                f"takes the slower rank's share of the best cut from {shares[0]['single']:.0%} "
                f"to {shares[1]['single']:.0%} (2-way) and from {chunked[0]:.0%} to "
                f"{chunked[1]:.0%} (4 chunks): x{gain['best_cut_bound_single_same_timings']:.2f} "
                f"and x{gain['best_cut_bound_4_chunks_same_timings']:.2f} on the best-cut bound "
                f"(the two models' bounds, each with its own timings and one-process time: "
                f"x{gain['bound_best_cut_at_layer_boundaries']:.2f} and "
                f"x{gain['bound_best_cut_at_layer_boundaries_4_chunks']:.2f}); "
                f"measured x{gain['ours_auto']:.2f} for ours (auto), "
                f"x{gain['torch_brute_force']:.2f} for torch brute force, "
                f"x{gain['one_process']:.2f} for one process (the models' first losses differ "
                f"by {row['single_process_loss_abs_diff']:.1e})."
            )
        out[f"M{m}"] = row
    return out, words


def print_table(by_m: dict[str, Any], layers: dict[str, Any]) -> None:
    for label, res in by_m.items():
        lt = layers[label]
        print(
            f"\n{label}: per-layer fwd+bwd ms (one process, micro-batch): "
            + ", ".join(
                f"{n} {1e3 * t:.1f}" for n, t in zip(lt["layer_names"], lt["times_s"], strict=True)
            )
        )
        print(f"  {'run':<34}{'samples/s':>10}{'min':>8}{'max':>8}  note")
        for name, rec in res["runs"].items():
            if "samples_per_s" not in rec:
                print(f"  {name:<34}  error: {rec.get('error', '?')[:70]}")
                continue
            lo, hi = rec["samples_per_s_min_max"]
            note = ""
            if rec["kind"] == "torch":
                tags = ["user split"] if rec["user_split"] else []
                if rec["brute_force_rank"] is not None:
                    tags.append(f"brute force #{rec['brute_force_rank']}")
                note = ", ".join(tags) + ("" if rec["check"]["correct"] else " INCORRECT")
            elif rec["kind"] == "ours":
                note = (
                    f"{rec['chosen_schedule']} {rec['partition']} dloss {rec['loss_abs_diff']:.1e}"
                )
            print(f"  {name:<34}{rec['samples_per_s']:>10.2f}{lo:>8.2f}{hi:>8.2f}  {note}")
        for k, v in res["bounds_samples_per_s"].items():
            print(f"  bound {k}: {v:.2f} samples/s")
        for k in (
            "torch_best_user_split",
            "torch_best_brute_force",
            "best_cut_bound",
            "half_of_one_process",
        ):
            print(f"  ours(auto) / {k}: {res[f'ours_auto_vs_{k}']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = LMConfig()
    for f in dataclasses.fields(LMConfig):
        if f.name == "head_parts":
            continue
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(getattr(defaults, f.name)),
            default=getattr(defaults, f.name),
        )
    parser.add_argument("--ms", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--steps", type=int, default=1, help="steps per run per round (2bw: one stream of them)"
    )
    parser.add_argument("--top", type=int, default=2, help="brute-force splits timed per schedule")
    parser.add_argument(
        "--head-parts",
        type=int,
        default=2,
        help="also run the model with the head as this many layers (1: only the one-layer head)",
    )
    parser.add_argument(
        "--split-head-runs",
        choices=["key", "all"],
        default="key",
        help="runs of the split-head model: key = ours (auto), torch brute force, one process",
    )
    parser.add_argument(
        "--correction-steps",
        type=int,
        default=12,
        help="steps ours trains before it is timed: its plan is corrected from measured costs "
        "after 10 (ElasticOptions.correct_after)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny model, 1 round")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "lm_split.json"
    )
    args = parser.parse_args()
    if args.quick:
        args.d_model, args.blocks, args.vocab, args.seq, args.rounds = 64, 2, 1000, 16, 1
    cfg = LMConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(LMConfig)[:-1]})
    cfgs = [cfg]
    if args.head_parts != 1:
        cfgs.append(dataclasses.replace(cfg, head_parts=args.head_parts))
    try:
        for c in cfgs:
            c.check(args.ms)
    except ValueError as error:
        parser.error(str(error))
    split_head_runs: SplitHeadRuns = args.split_head_runs
    models = [(c, c.head_parts == 1 or split_head_runs == "all") for c in cfgs]
    load_before, started = os.getloadavg(), time.perf_counter()
    result = pipeline.launch(
        functools.partial(
            run_all,
            models=models,
            ms=args.ms,
            rounds=args.rounds,
            steps=args.steps,
            top=args.top,
            correction_steps=args.correction_steps,
        ),
        STAGES,
        threads_per_stage=1,
        timeout_s=600.0,
    )[0]
    by_model = {
        c.label: summarize(c, args.ms, result["records"][c.label], result["layer_times"][c.label])
        for c in cfgs
    }
    granularity, words = head_granularity(cfgs, by_model, args.ms)
    report = {
        "config": {
            **dataclasses.asdict(cfg),
            "head_parts": [c.head_parts for c in cfgs],
            "models": {c.label: {"layers": c.layers, "every_run": full} for c, full in models},
            "microbatches": args.ms,
            "stages": STAGES,
            "threads_per_stage": 1,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "ours_correction_steps_before_timing": args.correction_steps,
            "hand_sweep": "torch Schedule1F1B at every 2-way cut of the head-as-1-layer model "
            "(between the embedding, the blocks and the head), timed in the same rounds",
            "quick": args.quick,
            "optimizer": "SGD lr 1e-3",
            "data": "random token ids from a seeded generator; targets = inputs shifted by one",
            "torch": torch.__version__,
            "our_schedules_registered": result["registry"],
            "check_tolerances": {"loss_abs": LOSS_TOLERANCE, "grad_rel": GRAD_TOLERANCE},
            "brute_force": (
                f"every split at layer boundaries into the schedule's chunks, scored by the "
                f"slowest rank's summed per-layer fwd+bwd time (ties: slowest chunk), per-layer "
                f"times measured alone in one process on rank 0 at the micro-batch size "
                f"(median of {LAYER_REPEATS}); the best {args.top} by score are timed in the "
                f"rounds and the fastest measured (median) correct one is reported"
            ),
            "wall_s": time.perf_counter() - started,
            "load_average_1_5_15_before": load_before,
            "load_average_1_5_15_after": os.getloadavg(),
        },
        "layer_times": result["layer_times"],
        "summary_in_words": words,
        "head_granularity": granularity,
        "summary": {
            label: {k: {kk: vv for kk, vv in v.items() if kk != "runs"} for k, v in by_m.items()}
            for label, by_m in by_model.items()
        },
        "by_model": by_model,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    for label, by_m in by_model.items():
        print(f"\n== {label.replace('_', ' ')}")
        print_table(by_m, result["layer_times"][label])
    print("\n" + "\n".join(words))


if __name__ == "__main__":
    main()
