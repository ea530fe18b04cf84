"""The language model of `lm_split.py`: its layers, sizes and data, its splits, and the
per-layer times the brute-force splits are scored on.

Why it exists: `lm_split.py` is the benchmark's entry point; what the model is (token
embedding, causal blocks, a head over a large vocabulary that may be cut into parts) and
how a split of its layers is scored are one concern, kept here apart from the runs and the
report.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from _torch_peer import STAGES, chunks_of
from torch import nn

from pipeline import LayerSpec
from pipeline.local.carry import as_carry, floating, leaf, unwrap
from pipeline.local.spec import build_layer
from pipeline.pure.partition import bounds, equal_sizes

LAYER_REPEATS = 3
SEED = 0  # every layer: build_layer(spec, SEED, ...), as ElasticPipeline's default seed


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
