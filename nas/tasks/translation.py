"""English->German translation of names, from the gettext catalogs that ship with pycountry.

docs/design.md, section 5, wants an encoder-decoder task with real data that needs no download,
like the Evolved Transformer's WMT'14 En-De. pycountry's German catalogs for countries
(ISO 3166-1), subdivisions (3166-2), languages (639-3), currencies (4217) and scripts (15924)
map English names (msgid) to German ones (msgstr): "Germany" -> "Deutschland".

Cleaning, in this order: text is NFC-normalised, whitespace collapsed and stripped;
untranslated (empty) entries and identity pairs (German == English, e.g. most subdivision
names) are dropped; exact duplicate pairs (the same name in two catalogs) are kept once;
pairs with either side longer than `max_chars` (48) characters are dropped (11 of 4,069,
up to 101 characters; they would double the padded length for 0.3% of the data). A few
English names have two German translations in different catalogs ("Rakhine" is the state
"Rakhaing" and the language "Kado"); both are kept, and the split keeps them together.

Split: the distinct English names are sorted, shuffled with `random.Random(seed)` (stable
across machines and torch versions) and cut 80/10/10 into train/validation/test, so no
source name is shared between splits. Within a split, pairs are sorted.

Batches, character level, teacher forcing: x = (src (B, S), tgt_in (B, T)), y = tgt_out
(B, T), all int64, PAD = 0; src is the English characters, tgt_in = BOS + German,
tgt_out = German + EOS. S and T are the longest in the batch, or `max_chars` and
`max_chars + 1` with `fixed_length=True`.
"""

from __future__ import annotations

import gettext
import random
import time
import unicodedata
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from nas.decoding import StepFn, greedy_decode, translate_ids
from nas.tasks.base import (
    BOS,
    EOS,
    PAD,
    SPLITS,
    Direction,
    Forward,
    Task,
    Vocab,
    check_batch_size,
    check_split,
    generator,
    unigram_cross_entropy,
)
from nas.tasks.metrics import decode_metrics

__all__ = [
    "DOMAINS",
    "Translation",
    "decode_rows",
    "greedy_decode",
    "load_pairs",
    "read_catalog",
    "split_pairs",
    "translate_ids",
]

DOMAINS = ("iso3166-1", "iso3166-2", "iso639-3", "iso4217", "iso15924")
FRACTIONS = (0.8, 0.1, 0.1)  # train, validation, test
DECODE_ROWS = 128  # the most rows of a greedy batch that evaluation sizes itself


def decode_rows(pairs: int, batch_size: int) -> int:
    """Rows per greedy batch when decoding `pairs` pairs: the fewest multiples of
    `batch_size` (a batch the model takes: a pipeline's micro-batches divide it) that hold
    them, at most `DECODE_ROWS` (or `batch_size` where that is larger). Rows past the
    pairs are copies of the batch's first source, so a few decoded pairs cost a few rows."""
    check_batch_size(batch_size)
    most = max(batch_size, DECODE_ROWS // batch_size * batch_size)
    return min(most, max(1, -(-pairs // batch_size)) * batch_size)


Pair = tuple[str, str]
# x = (src (B, S), tgt_in (B, T)), y = tgt_out (B, T)
TranslationBatch = tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]


def locales_dir() -> Path:
    try:
        import pycountry
    except ImportError as error:
        raise ImportError(
            "the translation task reads pycountry's catalogs: pip install pycountry"
        ) from error
    return Path(pycountry.LOCALES_DIR)


def read_catalog(path: Path) -> dict[str, str]:
    """msgid -> msgstr of a compiled gettext catalog (.mo), without the header entry."""
    if not path.is_file():
        raise FileNotFoundError(f"no gettext catalog at {path}")
    with path.open("rb") as f:
        translations = gettext.GNUTranslations(f)
    # gettext has no public way to list a catalog; `_catalog` has held it since Python 2.
    catalog = getattr(translations, "_catalog", None)
    if not isinstance(catalog, dict):
        raise RuntimeError(
            f"cannot list the messages of {path}: gettext.GNUTranslations "
            "no longer has a `_catalog` dict"
        )
    return {k: v for k, v in catalog.items() if isinstance(k, str) and k and isinstance(v, str)}


def _clean(text: str) -> str:
    return " ".join(unicodedata.normalize("NFC", text).split())


def load_pairs(
    language: str = "de", domains: Sequence[str] = DOMAINS
) -> tuple[list[Pair], dict[str, int]]:
    """Sorted distinct (English, translation) pairs of the catalogs, and cleaning counts."""
    counts = {"entries": 0, "untranslated": 0, "identical": 0, "duplicates": 0}
    pairs: set[Pair] = set()
    root = locales_dir()
    for domain in domains:
        for english, foreign in read_catalog(
            root / language / "LC_MESSAGES" / f"{domain}.mo"
        ).items():
            english, foreign = _clean(english), _clean(foreign)
            counts["entries"] += 1
            if not english or not foreign:
                counts["untranslated"] += 1
            elif english == foreign:
                counts["identical"] += 1
            elif (english, foreign) in pairs:
                counts["duplicates"] += 1
            else:
                pairs.add((english, foreign))
    return sorted(pairs), counts


def split_pairs(
    pairs: Sequence[Pair], seed: int, fractions: Sequence[float] = FRACTIONS
) -> dict[str, list[Pair]]:
    """Train/validation/test by distinct source name, fixed by `seed` (see module docstring)."""
    if len(fractions) != 3 or any(f <= 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
        raise ValueError(
            f"fractions must be three positive numbers summing to 1, got {tuple(fractions)}"
        )
    sources = sorted({english for english, _ in pairs})
    random.Random(seed).shuffle(sources)
    n_val = round(fractions[1] * len(sources))
    n_test = round(fractions[2] * len(sources))
    cuts = {
        "validation": sources[:n_val],
        "test": sources[n_val : n_val + n_test],
        "train": sources[n_val + n_test :],
    }
    split_of = {source: split for split, names in cuts.items() for source in names}
    out: dict[str, list[Pair]] = {split: [] for split in SPLITS}
    for pair in sorted(pairs):
        out[split_of[pair[0]]].append(pair)
    return out


class Translation(Task):
    """English->German names: loss (nats/token) and token accuracy; `evaluate` adds chrF,
    BLEU and exact match of greedy translations."""

    name = "translation"
    baseline_metric = "loss"
    metric_directions: ClassVar[dict[str, Direction]] = {
        **Task.metric_directions,
        "chrf": "maximize",
        "bleu": "maximize",
        "exact_match": "maximize",
    }
    decoded_metrics = ("chrf", "bleu", "exact_match")
    decoder_only = False
    example_call = "m.translate(['Germany', 'France'])"

    def __init__(
        self,
        *,
        seed: int = 0,
        max_chars: int = 48,
        fixed_length: bool = False,
        language: str = "de",
    ) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        self.seed, self.max_chars, self.fixed_length = seed, max_chars, fixed_length
        pairs, self.counts = load_pairs(language)
        kept = [p for p in pairs if max(len(p[0]), len(p[1])) <= max_chars]
        self.counts["too_long"] = len(pairs) - len(kept)
        self.counts["pairs"] = len(kept)
        if not kept:
            raise ValueError(f"no {language!r} pairs of at most {max_chars} characters")
        self.vocab = Vocab.from_texts(text for pair in kept for text in pair)
        self.splits = split_pairs(kept, seed)
        self._encoded = {
            split: [(self.vocab.encode(en), self.vocab.encode(de)) for en, de in pairs]
            for split, pairs in self.splits.items()
        }

    def size(self, split: str) -> int:
        check_split(split)
        return len(self.splits[split])

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "max_chars": self.max_chars, "cleaning": dict(self.counts)}

    def pairs(self, split: str) -> list[Pair]:
        check_split(split)
        return list(self.splits[split])

    def _collate(
        self, rows: Sequence[tuple[list[int], list[int]]], filler: int
    ) -> TranslationBatch:
        """Pad `rows` into a batch, plus `filler` copies of row 0 whose targets are all PAD."""
        s = self.max_chars if self.fixed_length else max(len(src) for src, _ in rows)
        t = self.max_chars + 1 if self.fixed_length else max(len(tgt) for _, tgt in rows) + 1
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
            order = torch.randperm(len(data), generator=generator("translation", seed, epoch))
            indices = order.tolist()
            indices = indices[: len(indices) - len(indices) % batch_size]
        else:
            indices = list(range(len(data)))
        for start in range(0, len(indices), batch_size):
            chunk = indices[start : start + batch_size]
            yield self._collate([data[i] for i in chunk], batch_size - len(chunk))

    def decode_subset(self, split: str, pairs: int | None) -> list[int]:
        """Indices of the pairs of `split` that an evaluation decoding `pairs` of them reads:
        evenly spaced over the (sorted) split, so a subset samples every initial letter
        and is the same for every model; None (or more than the split holds): all."""
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
        """Greedy translations of the sources of `split` at `indices` (default: every pair,
        in `pairs(split)` order)."""
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
            max_len=self.max_chars + 1 if max_len is None else max_len,
            width=self.max_chars if self.fixed_length else None,
        )

    def generation_metrics(
        self,
        step_fn: StepFn,
        split: str = "validation",
        *,
        batch_size: int = 64,
        pairs: int | None = None,
    ) -> dict[str, float]:
        """Exact match, corpus chrF and BLEU of greedy translations of `pairs` pairs of `split`
        (`decode_subset`; None: all) against their references."""
        indices = self.decode_subset(split, pairs)
        hypotheses = self.generate(step_fn, split, batch_size=batch_size, indices=indices)
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
    ) -> dict[str, float]:
        """Loss and token accuracy (teacher forcing), then, unless `decode=0`, greedy
        decoding of `decode` pairs (None: all) in batches of `decode_batch_size` rows (one
        forward per generated token, so few large batches cost least; default
        `decode_rows`): `chrf`, `bleu`, `exact_match`, `decoded` (pairs) and `decode_s` (what
        decoding cost, in seconds)."""
        metrics = super().evaluate(forward, split, batch_size=batch_size, max_batches=max_batches)
        if decode == 0:
            return metrics
        started = time.perf_counter()
        pairs = len(self.decode_subset(split, decode))
        rows = decode_rows(pairs, batch_size) if decode_batch_size is None else decode_batch_size
        decoded = self.generation_metrics(
            lambda src, tgt: forward((src, tgt)), split, batch_size=rows, pairs=decode
        )
        return metrics | {
            "chrf": decoded["chrf"],
            "bleu": decoded["bleu"],
            "exact_match": decoded["exact_match"],
            "decoded": decoded["n"],
            "decode_s": time.perf_counter() - started,
        }

    def unigram_baseline(self, split: str) -> float:
        """Nats per target token (characters and EOS) under the training unigram."""
        check_split(split)

        def targets(name: str) -> list[int]:
            return [i for _, tgt in self._encoded[name] for i in [*tgt, EOS]]

        support = [EOS, *range(len(self.vocab) - len(self.vocab.chars), len(self.vocab))]
        return unigram_cross_entropy(targets("train"), targets(split), len(self.vocab), support)
