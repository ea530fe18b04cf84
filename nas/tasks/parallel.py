"""Translation of a parallel corpus: what every sentence- or name-translation task shares.

The built-in names (`translation`, pycountry's catalogs), the user's own corpus (`corpus`)
and the system's software messages (`messages`) differ only in where their pairs come from.
`ParallelCorpus` is everything else, written once: the vocabulary, the batches, the loss,
greedy decoding and its metrics. A subclass reads its pairs, cuts them into train /
validation / test and passes them to `ParallelCorpus.__init__`; it adds `describe()`'s facts.

Tokenization (`tokenization`, a `nas.tasks.tokenizing.TokenizerOptions`): characters, or
subword pieces learned from the training split ("bpe", "unigram"; `vocab_size` pieces).
One vocabulary serves both sides (`shared_vocab=True`, the default; the source embedding,
the target embedding and the head then have `len(task.vocab)` rows), or each side has its
own (`shared_vocab=False`): `vocab` is then the target's (the target embedding, the head,
decoding) and `source_vocab` the source's, each learned from its side of the training split
(`vocab_size` pieces each), or each side's characters. The model's source embedding has
`len(task.source_vocab)` rows (`nas.study.training.compile_model`).

Lengths: `max_chars` is the longest side in characters the task holds; a subword task also
has `max_tokens`, the longest side in pieces (pairs longer than the `max_tokens` option are
dropped and counted). The model's positions follow the one that counts
(`nas.study.training.max_len` reads `max_tokens` first), and so do fixed-length batches and the
longest translation generated (`max_length`).

Batches, teacher forcing: x = (src (B, S), tgt_in (B, T)), y = tgt_out (B, T), all int64,
PAD = 0; tgt_in = BOS + target, tgt_out = target + EOS. S and T are the longest in the batch,
or `max_length` and `max_length + 1` with `fixed_length=True`. Greedy translations are
decoded to text before they are scored, so chrF and BLEU read detokenized text.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import torch

from nas.tasks.base import (
    BOS,
    EOS,
    PAD,
    SPECIALS,
    SPLITS,
    DecodeShare,
    Direction,
    Forward,
    Task,
    TaskInputError,
    TokenVocab,
    check_batch_size,
    check_split,
    generator,
    unigram_cross_entropy,
)
from nas.tasks.metrics import bleu_signature, decode_metrics
from nas.tasks.tokenizing import CHARACTERS, TokenizerOptions, build_vocab
from nas.text.decoding import StepFn, translate_ids

__all__ = [
    "DECODE_ROWS",
    "Pair",
    "ParallelCorpus",
    "TranslationBatch",
    "decode_rows",
]

Pair = tuple[str, str]
# x = (src (B, S), tgt_in (B, T)), y = tgt_out (B, T)
TranslationBatch = tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]
DECODE_ROWS = 128  # the most rows of a greedy batch that evaluation sizes itself


def decode_rows(pairs: int, batch_size: int) -> int:
    """Rows per greedy batch when decoding `pairs` pairs: the fewest multiples of
    `batch_size` (a batch the model takes: a pipeline's micro-batches divide it) that hold
    them, at most `DECODE_ROWS` (or `batch_size` where that is larger). Rows past the
    pairs are copies of the batch's first source, so a few decoded pairs cost a few rows."""
    check_batch_size(batch_size)
    most = max(batch_size, DECODE_ROWS // batch_size * batch_size)
    return min(most, max(1, -(-pairs // batch_size)) * batch_size)


class ParallelCorpus(Task):
    """Source -> target pairs per split: loss (nats/token) and token accuracy; `evaluate`
    adds chrF, BLEU and exact match of greedy translations (module doc)."""

    baseline_metric = "loss"
    metric_directions: ClassVar[dict[str, Direction]] = {
        **Task.metric_directions,
        "chrf": "maximize",
        "bleu": "maximize",
        "exact_match": "maximize",
    }
    decoded_metrics = ("chrf", "bleu", "exact_match")
    headline_metrics = ("chrf", "bleu", "exact_match")
    metric_labels: ClassVar[dict[str, str]] = {**Task.metric_labels, "exact_match": "exact"}
    decoder_only = False
    # whether the CLI builds the task before a study starts (`nas.tasks.check_task`), so
    # that a bad file or option of the user's ends the command in one line
    reads_user_data: ClassVar[bool] = False
    max_tokens: int  # a subword task's longest side in pieces; absent for characters

    def __init__(
        self,
        splits: Mapping[str, Sequence[Pair]],
        counts: Mapping[str, int],
        *,
        seed: int,
        max_chars: int,
        fixed_length: bool = False,
        tokenization: TokenizerOptions = CHARACTERS,
    ) -> None:
        """`splits`: the pairs of each of `SPLITS`, cleaned; `counts`: what reading them
        counted (`describe()`'s "cleaning"); `max_chars`: the longest side in characters;
        `tokenization`: what the vocabulary is made of."""
        self.seed, self.fixed_length, self.tokenization = seed, fixed_length, tokenization
        self.max_chars = max_chars
        self.counts: dict[str, int] = dict(counts)
        self.splits = {split: list(splits.get(split, ())) for split in SPLITS}
        self._check_filled()
        if tokenization.shared_vocab:
            self.vocab = build_vocab(tokenization, self.splits, seed)
            self._source_vocab = self.vocab
        else:
            self.vocab = build_vocab(tokenization, self.splits, seed, "target")
            self._source_vocab = build_vocab(tokenization, self.splits, seed, "source")
        self._encoded = {
            split: [(self._source_vocab.encode(src), self.vocab.encode(tgt)) for src, tgt in pairs]
            for split, pairs in self.splits.items()
        }
        if tokenization.subwords:
            self._keep_tokens(tokenization.max_tokens)
            self._check_filled()
        self.counts["pairs"] = sum(len(pairs) for pairs in self.splits.values())

    def _check_filled(self) -> None:
        """`TaskInputError` unless every split holds a pair."""
        empty = [split for split in SPLITS if not self.splits[split]]
        if empty:
            raise TaskInputError(
                f"the {self.name} task has no pair left in the split(s) {', '.join(empty)} "
                f"(cleaning: {self.counts}); it needs at least one in each of {', '.join(SPLITS)}"
            )

    def _keep_tokens(self, limit: int | None) -> None:
        """Drop (and count) the pairs with a side longer than `limit` pieces; `max_tokens`
        is then the longest side kept."""
        dropped = 0
        for split in SPLITS:
            rows = list(zip(self.splits[split], self._encoded[split], strict=True))
            kept = [r for r in rows if limit is None or max(map(len, r[1])) <= limit]
            dropped += len(rows) - len(kept)
            self.splits[split] = [pair for pair, _ in kept]
            self._encoded[split] = [ids for _, ids in kept]
        if limit is not None:
            self.counts["too_many_tokens"] = dropped
        sides = (len(ids) for rows in self._encoded.values() for pair in rows for ids in pair)
        self.max_tokens = max(sides, default=1)

    @property
    def source_vocab(self) -> TokenVocab:
        return self._source_vocab

    @property
    def max_length(self) -> int:
        """The longest side the task holds, in its tokens (characters or pieces)."""
        return self.max_tokens if self.tokenization.subwords else self.max_chars

    def size(self, split: str) -> int:
        check_split(split)
        return len(self.splits[split])

    def describe(self) -> dict[str, Any]:
        lengths = {"max_chars": self.max_chars}
        if self.tokenization.subwords:
            lengths["max_tokens"] = self.max_tokens
        return {
            **super().describe(),
            "tokenizer": self.tokenization.tokenizer,
            **lengths,
            "cleaning": dict(self.counts),
            "bleu_signature": bleu_signature(),
        }

    def pairs(self, split: str) -> list[Pair]:
        check_split(split)
        return list(self.splits[split])

    def _collate(
        self, rows: Sequence[tuple[list[int], list[int]]], filler: int, *, longest: bool = False
    ) -> TranslationBatch:
        """Pad `rows` into a batch, plus `filler` copies of row 0 whose targets are all PAD;
        to the task's longest side where `fixed_length` or `longest`, else to the rows'."""
        full = self.fixed_length or longest
        s = self.max_length if full else max(len(src) for src, _ in rows)
        t = self.max_length + 1 if full else max(len(tgt) for _, tgt in rows) + 1
        n = len(rows) + filler
        src = torch.full((n, s), PAD, dtype=torch.long)
        tgt_in = torch.full((n, t), PAD, dtype=torch.long)
        tgt_out = torch.full((n, t), PAD, dtype=torch.long)
        for i in range(n):
            a, b = rows[i] if i < len(rows) else rows[0]
            src[i, : len(a)] = torch.tensor(a, dtype=torch.long)
            tgt_in[i, : len(b) + 1] = torch.tensor([BOS, *b], dtype=torch.long)
            if i < len(rows):
                tgt_out[i, : len(b) + 1] = torch.tensor([*b, EOS], dtype=torch.long)
        return (src, tgt_in), tgt_out

    def batches(
        self, split: str, batch_size: int, *, seed: int = 0, epoch: int = 0
    ) -> Iterator[TranslationBatch]:
        check_split(split)
        check_batch_size(batch_size)
        data = self._encoded[split]
        if split == "train":
            if len(data) < batch_size:
                raise ValueError(
                    f"the training split has {len(data)} pairs, fewer than batch_size={batch_size}"
                )
            order = torch.randperm(len(data), generator=generator(self.name, seed, epoch))
            indices = order.tolist()
            indices = indices[: len(indices) - len(indices) % batch_size]
        else:
            indices = list(range(len(data)))
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            yield self._collate([data[i] for i in chunk], batch_size - len(chunk))

    def largest_batch(self, batch_size: int) -> TranslationBatch:
        """The training split's first `batch_size` pairs padded to the longest side the
        task holds (`max_length` source tokens, `max_length + 1` target tokens): no batch
        is larger."""
        check_batch_size(batch_size)
        data = self._encoded["train"]
        rows = [data[i % len(data)] for i in range(batch_size)]
        return self._collate(rows, 0, longest=True)

    def decode_subset(self, split: str, pairs: int | None) -> list[int]:
        """Indices of the pairs of `split` that an evaluation decoding `pairs` of them reads:
        evenly spaced over the split, so a subset samples all of it and is the same for
        every model; None (or more than the split holds): all."""
        check_split(split)
        total = len(self.splits[split])
        if pairs is None or pairs >= total:
            return list(range(total))
        if pairs < 0:
            raise ValueError(f"pairs={pairs} is not valid; use None (all) or a count >= 0")
        return [i * total // pairs for i in range(pairs)]

    def generate(
        self,
        step_fn: StepFn,
        split: str,
        *,
        batch_size: int = 64,
        max_len: int | None = None,
        indices: Sequence[int] | None = None,
    ) -> list[str]:
        """Greedy translations, as text, of the sources of `split` at `indices` (default:
        every pair, in `pairs(split)` order)."""
        if split == "train":
            raise ValueError("generate() reads an evaluation split: 'validation' or 'test'")
        check_split(split)
        data = self._encoded[split]
        chosen = range(len(data)) if indices is None else indices
        sources = [data[i][0] for i in chosen]
        return translate_ids(
            step_fn,
            self.vocab,
            sources,
            batch_size=batch_size,
            max_len=self.max_length + 1 if max_len is None else max_len,
            width=self.max_length if self.fixed_length else None,
        )

    def generation_metrics(
        self,
        step_fn: StepFn,
        split: str = "validation",
        *,
        batch_size: int = 64,
        pairs: int | None = None,
        share: DecodeShare | None = None,
    ) -> dict[str, float]:
        """Exact match, corpus chrF and BLEU of greedy translations of `pairs` pairs of `split`
        (`decode_subset`; None: all) against their references, both as text; with `share`,
        each caller translates its share of them (then every caller holds them all)."""
        indices = self.decode_subset(split, pairs)
        if share is None:
            hypotheses = self.generate(step_fn, split, batch_size=batch_size, indices=indices)
        else:
            mine = share.mine(indices)
            hypotheses = share.merged(
                self.generate(step_fn, split, batch_size=batch_size, indices=mine)
            )
        references = [self.splits[split][i][1] for i in indices]
        return decode_metrics(hypotheses, references)

    def evaluate(
        self,
        forward: Forward,
        split: str = "validation",
        *,
        batch_size: int,
        max_batches: int | None = None,
        decode: int | None = None,
        decode_batch_size: int | None = None,
        share: DecodeShare | None = None,
    ) -> dict[str, float]:
        """Loss and token accuracy (teacher forcing), then, unless `decode=0`, greedy
        decoding of `decode` pairs (None: all) in batches of `decode_batch_size` rows (one
        forward per generated token, so few large batches cost least; default
        `decode_rows`), each caller its share with its own model where `share` says so:
        `chrf`, `bleu`, `exact_match`, `decoded` (pairs) and `decode_s` (what decoding cost,
        in seconds)."""
        metrics = super().evaluate(forward, split, batch_size=batch_size, max_batches=max_batches)
        if decode == 0:
            return metrics
        started = time.perf_counter()
        subset = self.decode_subset(split, decode)
        pairs = len(subset if share is None else share.mine(subset))
        rows = decode_rows(pairs, batch_size) if decode_batch_size is None else decode_batch_size
        model = forward if share is None else share.forward
        decoded = self.generation_metrics(
            lambda src, tgt: model((src, tgt)), split, batch_size=rows, pairs=decode, share=share
        )
        return metrics | {
            "chrf": decoded["chrf"],
            "bleu": decoded["bleu"],
            "exact_match": decoded["exact_match"],
            "decoded": decoded["n"],
            "decode_s": time.perf_counter() - started,
        }

    def unigram_baseline(self, split: str) -> float:
        """Nats per target token (characters or pieces, and EOS) under the training unigram."""
        check_split(split)

        def targets(name: str) -> list[int]:
            return [i for _, tgt in self._encoded[name] for i in [*tgt, EOS]]

        support = [EOS, *range(len(SPECIALS), len(self.vocab))]
        return unigram_cross_entropy(targets("train"), targets(split), len(self.vocab), support)
