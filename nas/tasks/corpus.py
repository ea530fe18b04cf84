"""Translation on the user's own parallel corpus: `task=corpus task.options.path=PATH`.

A search ranks architectures on the data it is given, so a user should be able to point a
study at the sentences their product translates: a TSV, CSV or JSON Lines file, a folder of
gettext catalogs or of such files, or a Hugging Face dataset saved to disk. Reading and
cleaning are `nas.tasks.corpus_files.read_corpus`'s (its counts are `describe()`'s
"cleaning"); batches, vocabulary and metrics are `nas.tasks.parallel.ParallelCorpus`'s.

Splits: files (or a saved dataset's splits) named train, validation (or dev) and test are
kept as they are; a corpus without named splits (or with a train split alone) is cut by
`fractions` of its distinct sources, shuffled with the task's seed, every copy of a source
in one split (`split_pairs`). Named splits that leave one out, or unnamed files beside
named ones, are refused: which pairs would be tested on is the user's to say.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nas.tasks.base import SPLITS, TaskInputError, check_positive
from nas.tasks.corpus_files import CorpusError, CorpusRead, read_corpus, split_pairs
from nas.tasks.parallel import Pair, ParallelCorpus
from nas.tasks.tokenizing import SUBWORDS, TokenizerOptions

__all__ = ["FRACTIONS", "Corpus", "arrange_splits", "check_fractions"]

FRACTIONS = (0.8, 0.1, 0.1)  # train, validation, test


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    """`fractions` as a (train, validation, test) triple of positive numbers summing to 1."""
    values = tuple(fractions)
    if (
        len(values) != 3
        or not all(isinstance(f, int | float) and not isinstance(f, bool) for f in values)
        or any(f <= 0 for f in values)
        or abs(sum(values) - 1) > 1e-9
    ):
        raise TaskInputError(
            f"fractions={list(values)!r} is not valid; valid: three positive numbers "
            "(train, validation, test) summing to 1, e.g. [0.8, 0.1, 0.1]"
        )
    return values[0], values[1], values[2]


def arrange_splits(
    read: CorpusRead, where: str, seed: int, fractions: Sequence[float]
) -> tuple[dict[str, list[Pair]], str]:
    """Train / validation / test of the corpus `read` from `where` (module doc), and how
    they were made: "given" or "seeded"."""
    named = sorted(split for split in read.splits if split != "all")
    if not named or named == ["train"]:
        pairs = [pair for split in sorted(read.splits) for pair in read.splits[split]]
        return split_pairs(pairs, check_fractions(fractions), seed), "seeded"
    if "all" in read.splits or named != sorted(SPLITS):
        given = ", ".join(named + (["unnamed files"] if "all" in read.splits else []))
        raise CorpusError(
            f"{where}: the corpus names some splits ({given}) but not exactly train, "
            "validation (or dev) and test; name a file after each of the three, or give "
            "the pairs without split names to have them split by seed"
        )
    return {split: list(read.splits[split]) for split in SPLITS}, "given"


class Corpus(ParallelCorpus):
    """Source -> target pairs read from the user's files (module doc); the metrics of
    `ParallelCorpus`."""

    name = "corpus"
    example_call = "m.translate(['The file could not be opened.'])"
    reads_user_data = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        seed: int = 0,
        source: str = "en",
        target: str = "de",
        max_chars: int = 400,
        fractions: Sequence[float] = FRACTIONS,
        fixed_length: bool = False,
        tokenization: TokenizerOptions = SUBWORDS,
    ) -> None:
        self.path = Path(path).expanduser()
        limit = check_positive("max_chars", max_chars)
        read = read_corpus(self.path, source=source, target=target, max_chars=limit)
        splits, self.split_by = arrange_splits(read, str(self.path), seed, fractions)
        self.files = list(read.files)
        longest = max(
            (len(side) for pairs in splits.values() for p in pairs for side in p), default=1
        )
        super().__init__(
            splits,
            read.counts,
            seed=seed,
            max_chars=longest,
            fixed_length=fixed_length,
            tokenization=tokenization,
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "path": str(self.path),
            "files": list(self.files),
            "splits": self.split_by,
        }
