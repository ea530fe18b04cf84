"""A character language model on Python's own documentation (`pydoc_data.topics`).

docs/design.md, section 5, wants a decoder-only task with real data that ships offline; the
standard library's help topics (79 of them, 465k characters) are the text `task=charlm`
trains on. `CharLanguageModel` is the task for any text split three ways;
`textfile.py` reuses it for the user's own file.

Split: each topic (in sorted order) is cut by characters into its first 90% (train), the
next 5% (validation) and the last 5% (test), and each split joins its pieces with a blank
line. Cutting every topic, rather than the joined text once, makes validation and test
sample all topics, not just the last few alphabetically.

Batches: x = ids (B, T), y = the same window shifted by one (B, T), int64. Training draws
(len(train) - 1) // T random windows per epoch; validation and test tile the split with
non-overlapping windows in order (every character after the first is a target exactly
once; the last window is padded with PAD, which the loss ignores).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import ClassVar

import torch

from nas.tasks.base import (
    PAD,
    SPLITS,
    Direction,
    Task,
    TokenStats,
    Vocab,
    check_batch_size,
    check_split,
    generator,
    unigram_cross_entropy,
)

__all__ = ["CharLM", "CharLanguageModel", "load_topics", "split_text"]

CUTS = (0.9, 0.95)  # train | validation | test, as fractions of the characters


def split_text(text: str, cuts: tuple[float, float] = CUTS) -> tuple[str, str, str]:
    """(train, validation, test): text[:90%], text[90%:95%], text[95%:] by characters."""
    a, b = int(len(text) * cuts[0]), int(len(text) * cuts[1])
    return text[:a], text[a:b], text[b:]


def load_topics() -> dict[str, str]:
    from pydoc_data.topics import topics

    return {name: topics[name] for name in sorted(topics)}


class CharLanguageModel(Task):
    """Next-character prediction on three texts; metrics: loss, bits per char, accuracy."""

    name = "charlm"
    baseline_metric = "bits_per_char"
    metric_directions: ClassVar[dict[str, Direction]] = {
        **Task.metric_directions,
        "bits_per_char": "minimize",
    }
    # what character models are reported in, and what a reader grasps at once
    headline_metrics = ("bits_per_char", "accuracy")
    metric_labels: ClassVar[dict[str, str]] = {**Task.metric_labels, "bits_per_char": "bpc"}
    vocab: Vocab  # characters

    def __init__(self, texts: Mapping[str, str], *, seq_len: int = 64) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        if sorted(texts) != sorted(SPLITS):
            raise ValueError(f"texts must have exactly the splits {SPLITS}, got {sorted(texts)}")
        for split, text in texts.items():
            if len(text) < seq_len + 1:
                raise ValueError(
                    f"the {split} text has {len(text)} characters; windows of "
                    f"seq_len={seq_len} need at least {seq_len + 1}"
                )
        self.seq_len = seq_len
        self.texts = {split: texts[split] for split in SPLITS}
        self.vocab = Vocab.from_texts(self.texts.values())
        self.ids = {
            split: torch.tensor(self.vocab.encode(text), dtype=torch.long)
            for split, text in self.texts.items()
        }

    def size(self, split: str) -> int:
        check_split(split)
        return len(self.texts[split])

    def _windows(
        self, ids: torch.Tensor, starts: list[int], rows: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y for windows at `starts`, padded with PAD; rows beyond them copy row 0's x."""
        x = torch.full((rows, self.seq_len), PAD, dtype=torch.long)
        y = torch.full((rows, self.seq_len), PAD, dtype=torch.long)
        for i, start in enumerate(starts):
            window = ids[start : start + self.seq_len + 1]
            x[i, : len(window) - 1] = window[:-1]
            y[i, : len(window) - 1] = window[1:]
        x[len(starts) :] = x[0]
        return x, y

    def batches(
        self, split: str, batch_size: int, *, seed: int = 0, epoch: int = 0
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        check_split(split)
        check_batch_size(batch_size)
        ids, t = self.ids[split], self.seq_len
        if split == "train":
            n = (len(ids) - 1) // t
            if n < batch_size:
                raise ValueError(
                    f"the training text holds {n} windows of {t} characters per "
                    f"epoch, fewer than batch_size={batch_size}"
                )
            g = generator(self.name, seed, epoch)
            starts = torch.randint(0, len(ids) - t, (n - n % batch_size,), generator=g).tolist()
        else:
            starts = list(range(0, len(ids) - 1, t))
        for i in range(0, len(starts), batch_size):
            yield self._windows(ids, starts[i : i + batch_size], batch_size)

    def summarise(self, stats: TokenStats) -> dict[str, float]:
        return {
            "loss": stats.loss,
            "bits_per_char": stats.bits_per_token,
            "accuracy": stats.accuracy,
            "tokens": float(stats.count),
        }

    def unigram_baseline(self, split: str) -> float:
        """Bits per character of `split` under the add-one-smoothed training unigram."""
        check_split(split)
        first_char = len(self.vocab) - len(self.vocab.chars)
        nats = unigram_cross_entropy(
            self.ids["train"].tolist(),
            self.ids[split].tolist(),
            len(self.vocab),
            range(first_char, len(self.vocab)),
        )
        return nats / math.log(2)


class CharLM(CharLanguageModel):
    """The language model on `pydoc_data.topics`, split per topic (see module docstring)."""

    def __init__(self, *, seq_len: int = 64) -> None:
        parts: dict[str, list[str]] = {split: [] for split in SPLITS}
        for text in load_topics().values():
            for split, piece in zip(SPLITS, split_text(text), strict=True):
                parts[split].append(piece)
        super().__init__({split: "\n\n".join(p) for split, p in parts.items()}, seq_len=seq_len)
