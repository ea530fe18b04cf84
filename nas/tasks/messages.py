"""English->German sentences of real software, from the system's gettext catalogs.

Names (`translation`) are a small, unusual corpus; users translate sentences. Every Linux
system with German locale support holds thousands of them offline, translated by people for
real programs: the gettext catalogs of PostgreSQL, git, GnuPG, coreutils, the C library,
GTK and the rest (`/usr/share/locale/de/LC_MESSAGES/*.mo`). `task=messages` reads them
(`folder` another one: any folder of `.mo` or `.po` catalogs of one target language).

Each catalog is read and cleaned by `nas.tasks.corpus_files.read_corpus` (plural, context,
fuzzy and untranslated entries skipped; empty, identical and too long pairs dropped; all
counted); then pairs repeated across catalogs are kept once, and only sentences stay: an
English side of `min_words` to `max_words` words (3 to 30), the rest counted as
"too_few_words" and "too_many_words". A catalog that cannot be read (empty, mis-encoded) is
skipped and named in `describe()`; a folder without one readable catalog is an error.
Measured on a Debian system with 86 German catalogs: 42,316 distinct pairs, 33,997 of them
of 3 to 30 words. The split is seeded and keeps every copy of a source in one split.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nas.tasks.base import TaskInputError, check_positive
from nas.tasks.corpus import FRACTIONS
from nas.tasks.corpus_files import CorpusError, read_corpus, split_pairs
from nas.tasks.parallel import Pair, ParallelCorpus
from nas.tasks.tokenizing import SUBWORDS, TokenizerOptions

__all__ = ["CATALOG_SUFFIXES", "FOLDER", "Messages", "keep_sentences", "read_catalogs"]

FOLDER = "/usr/share/locale/de/LC_MESSAGES"
CATALOG_SUFFIXES = (".mo", ".po")


def read_catalogs(
    folder: Path, max_chars: int
) -> tuple[dict[Pair, str], Counter[str], list[str], dict[str, str]]:
    """The distinct pairs of every catalog in `folder` (each: the file name of the catalog
    it came from first), the cleaning counts, the catalogs read and those skipped (file
    name: why)."""
    if not folder.is_dir():
        raise CorpusError(
            f"{folder}: no such folder; the messages task reads gettext catalogs "
            f"(*.mo, *.po) of one language, e.g. {FOLDER} (task.options.folder)"
        )
    files = sorted(p for p in folder.iterdir() if p.suffix in CATALOG_SUFFIXES and p.is_file())
    counts: Counter[str] = Counter()
    pairs: dict[Pair, str] = {}  # the catalog each pair came from first
    read_ones: list[str] = []
    skipped: dict[str, str] = {}
    for file in files:
        try:
            read = read_corpus(file, max_chars=max_chars)
        except CorpusError as error:
            skipped[file.name] = str(error)
            continue
        counts.update({k: v for k, v in read.counts.items() if k != "kept"})
        read_ones.append(file.name)
        for pair in (p for split in read.splits.values() for p in split):
            if pair in pairs:
                counts["duplicate"] += 1
            else:
                pairs[pair] = file.name
    if not read_ones:
        found = f"{len(files)} unreadable" if files else "none"
        raise CorpusError(
            f"{folder}: no readable gettext catalog (*.mo, *.po) in the folder ({found}); "
            f"the messages task needs a folder of them, e.g. {FOLDER} (task.options.folder)"
        )
    return pairs, counts, read_ones, skipped


def keep_sentences(
    pairs: Iterable[Pair], min_words: int, max_words: int, counts: Counter[str]
) -> list[Pair]:
    """The pairs whose source has `min_words` to `max_words` words; the others counted as
    "too_few_words" or "too_many_words"."""
    kept = []
    for pair in pairs:
        words = len(pair[0].split())
        if words < min_words:
            counts["too_few_words"] += 1
        elif words > max_words:
            counts["too_many_words"] += 1
        else:
            kept.append(pair)
    return kept


class Messages(ParallelCorpus):
    """English->German software messages (module doc); the metrics of `ParallelCorpus`."""

    name = "messages"
    example_call = "m.translate(['The file could not be opened.'])"
    reads_user_data = True

    def __init__(
        self,
        *,
        folder: str | os.PathLike[str] = FOLDER,
        seed: int = 0,
        min_words: int = 3,
        max_words: int = 30,
        max_chars: int = 400,
        fixed_length: bool = False,
        tokenization: TokenizerOptions = SUBWORDS,
    ) -> None:
        check_positive("min_words", min_words)
        if check_positive("max_words", max_words) < min_words:
            raise TaskInputError(
                f"min_words={min_words} is more than max_words={max_words}; valid: "
                "min_words <= max_words"
            )
        self.folder = Path(folder).expanduser()
        pairs, counts, catalogs, self.skipped = read_catalogs(
            self.folder, check_positive("max_chars", max_chars)
        )
        kept = keep_sentences(pairs, min_words, max_words, counts)
        if not kept:
            raise CorpusError(
                f"{self.folder}: no message of {min_words} to {max_words} words in its "
                f"{len(catalogs)} catalog(s) (cleaning: {dict(counts)})"
            )
        self.min_words, self.max_words = min_words, max_words
        self.catalogs = {name: 0 for name in catalogs}  # the sentences each catalog gave
        for pair in kept:
            self.catalogs[pairs[pair]] += 1
        longest = max(len(side) for pair in kept for side in pair)
        super().__init__(
            split_pairs(kept, FRACTIONS, seed),
            counts,
            seed=seed,
            max_chars=longest,
            fixed_length=fixed_length,
            tokenization=tokenization,
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "folder": str(self.folder),
            "words": [self.min_words, self.max_words],
            "catalogs": dict(self.catalogs),
            "skipped_catalogs": dict(self.skipped),
        }
