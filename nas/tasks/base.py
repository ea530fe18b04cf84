"""What every task offers the harness: a vocabulary, deterministic batches, loss and metrics.

The pipeline runtime feeds the same batch to every stage process, so a task must produce
identical tensors on every rank without talking to the others. Everything here is therefore
a pure function of its arguments: batch order comes from a `torch.Generator` seeded with
`derive_seed(...)` (a hash of the arguments that does not depend on Python's hash
randomisation), never from the global RNG, and vocabularies are sorted, never iterated from
a set.

Shapes follow `search_spaces.compile`: logits are (batch, vocab, seq), the layout
`F.cross_entropy` expects, and targets are (batch, seq) int64 with PAD (0) where there is
nothing to predict.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

import torch
import torch.nn.functional as F

from nas.text.decoding import check_batch_size
from nas.text.vocab import BOS, EOS, PAD, SPECIALS, UNK, TokenVocab, Vocab
from pipeline.pure.checks import is_int

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "SPECIALS",
    "SPLITS",
    "UNK",
    "Batch",
    "DecodeShare",
    "Direction",
    "Forward",
    "Task",
    "TaskInputError",
    "TokenStats",
    "TokenVocab",
    "Vocab",
    "check_batch_size",
    "check_positive",
    "check_split",
    "derive_seed",
    "masked_cross_entropy",
    "unigram_cross_entropy",
]

SPLITS = ("train", "validation", "test")

# x is a tensor (decoder-only) or a tuple of tensors (encoder-decoder); y is (batch, seq).
Batch = tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor]
T = TypeVar("T")
# The model in evaluation mode: a batch's x -> logits (B, V, T) (e.g. `pipe.forward`).
Forward = Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class DecodeShare:
    """Generation spread over the callers of a collective evaluation (a pipeline's ranks):
    this one generates from every `world`-th example, from the `rank`-th on, with `forward`
    (its own copy of the model: `ElasticPipeline.replica`), and `gather` hands each
    caller's outputs to every caller, in rank order (a collective)."""

    forward: Forward
    rank: int
    world: int
    gather: Callable[[list[str]], list[list[str]]]

    def mine(self, items: Sequence[T]) -> list[T]:
        """This caller's share of `items`."""
        return list(items[self.rank :: self.world])

    def merged(self, outputs: list[str]) -> list[str]:
        """Every caller's outputs (this one's are `outputs`) in the order of the items."""
        parts = self.gather(outputs)
        count = sum(len(part) for part in parts)
        return [parts[i % self.world][i // self.world] for i in range(count)]


class TaskInputError(ValueError):
    """Data or an option a task cannot serve (a corpus file, a tokenizer setting): its message
    is one line naming the value and what would be valid, which the CLI prints without a
    traceback before any process starts (`nas.tasks.check_task`)."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).splitlines()))  # one line, whatever it quotes


def check_positive(key: str, value: object) -> int:
    """`value` of the option `key`, if it is an integer >= 1; else `TaskInputError`."""
    if not is_int(value) or value < 1:
        raise TaskInputError(f"{key}={value!r} is not valid; valid: an integer >= 1")
    return value


def check_split(split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from the parts' reprs: the same in every process, run and machine."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def generator(*parts: object) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*parts))


def masked_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross entropy (nats) over non-PAD targets; logits (B, V, T), targets (B, T).

    A module-level function, so it pickles as a pipeline `loss_fn`. A batch whose targets are
    all PAD gives NaN (0/0), as `F.cross_entropy` does; training batches never contain one.
    """
    return F.cross_entropy(logits, targets, ignore_index=PAD)


@dataclass
class TokenStats:
    """Sums over batches of the per-token loss and accuracy, ignoring PAD targets."""

    loss_sum: float = 0.0  # nats
    correct: int = 0
    count: int = 0

    @torch.no_grad()
    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> TokenStats:
        if (
            logits.dim() != 3
            or logits.shape[0] != targets.shape[0]
            or (logits.shape[2] != targets.shape[1])
        ):
            raise ValueError(
                f"expected logits (B, V, T) and targets (B, T), got "
                f"{tuple(logits.shape)} and {tuple(targets.shape)}"
            )
        mask = targets != PAD
        losses = F.cross_entropy(logits.float(), targets, reduction="none", ignore_index=PAD)
        self.loss_sum += float(losses[mask].sum())
        self.correct += int(((logits.argmax(1) == targets) & mask).sum())
        self.count += int(mask.sum())
        return self

    @property
    def loss(self) -> float:
        return self.loss_sum / self.count if self.count else math.nan

    @property
    def accuracy(self) -> float:
        return self.correct / self.count if self.count else math.nan

    @property
    def bits_per_token(self) -> float:
        return self.loss / math.log(2)


def unigram_cross_entropy(
    train: Sequence[int], targets: Sequence[int], vocab_size: int, support: Sequence[int]
) -> float:
    """Cross entropy (nats) of `targets` under the add-one-smoothed unigram of `train`.

    Every id in `support` (the tokens a model may predict) gets one pseudo-count, so a token
    that never occurs in training still has a finite cost; ids outside it get none.
    """
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    counts[torch.tensor(support, dtype=torch.long)] += 1
    counts += torch.bincount(torch.tensor(train, dtype=torch.long), minlength=vocab_size)
    log_p = counts.log() - counts.sum().log()
    return float(-log_p[torch.tensor(targets, dtype=torch.long)].mean())


Direction = Literal["minimize", "maximize"]


class Task(ABC):
    """A data set with fixed train/validation/test splits, batched identically on every rank.

    `baseline_metric` names the key of `metrics()` that `unigram_baseline()` is comparable to.
    What the harness asks of a task beyond its data (so that a user's task, named by import
    path as `task=my_pkg.tasks:MyTask`, plugs in like a built-in one):

    * `metric_directions`: every metric `evaluate` returns that a study may rank by, and
      whether it is minimised or maximised; the study's objectives are
      `validation_<metric>`, and the report shows them;
    * `decoded_metrics`: those of them `evaluate` measures only when it decodes (`decode`
      not 0), so a study ranking by one must decode at its evaluations;
    * `headline_metrics`: those a user reads first beside the fitness (BLEU and chrF for a
      translation): the retrained models are compared on them, their exports record them,
      their cards and tables show them. Nothing outside `nas.tasks` names a metric;
    * `metric_labels`: a short column header for a metric whose name is long (the
      report's trials table fits 80 columns);
    * `decoder_only`: whether its model reads one sequence (a language model) rather than
      a source and a target (which the exported model can `translate`);
    * `example_call`: how a user calls the exported model `m`, as the report shows it.
    """

    name: ClassVar[str]
    baseline_metric: ClassVar[str]
    metric_directions: ClassVar[dict[str, Direction]] = {
        "loss": "minimize",
        "accuracy": "maximize",
    }
    decoded_metrics: ClassVar[tuple[str, ...]] = ()
    headline_metrics: ClassVar[tuple[str, ...]] = ()
    metric_labels: ClassVar[dict[str, str]] = {"accuracy": "acc"}
    decoder_only: ClassVar[bool] = True
    example_call: ClassVar[str] = "m"
    vocab: TokenVocab  # characters (`Vocab`) or subword pieces (`nas.text.subwords`); the target's

    @property
    def source_vocab(self) -> TokenVocab:
        """The vocabulary of a translation's sources: `vocab` unless the task keeps
        separate source and target vocabularies (the model then has a source embedding of
        its own size)."""
        return self.vocab

    @abstractmethod
    def size(self, split: str) -> int:
        """The number of examples (pairs, or characters for a language model) in `split`."""

    @abstractmethod
    def batches(
        self, split: str, batch_size: int, *, seed: int = 0, epoch: int = 0
    ) -> Iterator[Batch]:
        """One epoch of `split` as (x, y) batches, the same tensors for the same arguments.

        Every batch has exactly `batch_size` rows (so the pipeline can split it into
        micro-batches): training drops the incomplete last batch (a different one each epoch);
        evaluation splits ignore seed and epoch, keep every example once in a fixed order, and
        fill the last batch with copies of its first row's inputs whose targets are all PAD.
        Such filler rows count for nothing in `TokenStats`; a micro-batch made only of them
        would make the mean loss NaN, so evaluate with `metrics`/`TokenStats` sums.
        """

    def largest_batch(self, batch_size: int) -> Batch:
        """A training batch of the largest shapes `batches` can yield: what a memory plan
        must fit (`pipeline.memory_budget` holds for every batch, not only the first).
        Default: the first training batch, for a task whose batches all have one shape; a
        task whose batches vary in length pads this one to its longest."""
        return next(iter(self.batches("train", batch_size)))

    @abstractmethod
    def unigram_baseline(self, split: str) -> float:
        """What predicting every target from the training unigram scores on `split`."""

    def loss_fn(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return masked_cross_entropy(logits, targets)

    def metrics(self, logits: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
        return self.summarise(TokenStats().update(logits, targets))

    def summarise(self, stats: TokenStats) -> dict[str, float]:
        """The task's metrics from token statistics accumulated over any number of batches."""
        return {"loss": stats.loss, "accuracy": stats.accuracy, "tokens": float(stats.count)}

    def evaluate(
        self,
        forward: Forward,
        split: str = "validation",
        *,
        batch_size: int,
        max_batches: int | None = None,
        decode: int | None = None,
        share: DecodeShare | None = None,
    ) -> dict[str, float]:
        """The task's metrics of the model `forward` on `split` (`summarise`'s keys).

        Token statistics come from the split's first `max_batches` batches (None: all of it).
        `decode`: how many examples to generate from and score (tasks that generate; None:
        all, 0: none), spread over the callers by `share` (default: all with `forward`); the
        others ignore both. Every call with the same arguments reads the same examples, so
        evaluations of different models compare.
        """
        check_split(split)
        stats = TokenStats()
        for i, (x, y) in enumerate(self.batches(split, batch_size)):
            if max_batches is not None and i >= max_batches:
                break
            stats.update(forward(x), y)
        return self.summarise(stats)

    def describe(self) -> dict[str, Any]:
        separate = {"source_vocab_size": len(self.source_vocab)}
        return {
            "task": self.name,
            "vocab_size": len(self.vocab),
            **(separate if self.source_vocab is not self.vocab else {}),
            "sizes": {split: self.size(split) for split in SPLITS},
        }
