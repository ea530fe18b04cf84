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

Batches, vocabulary, decoding and metrics are `nas.tasks.parallel.ParallelCorpus`'s: by
default character level (`tokenization`: `nas.tasks.tokenizing.CHARACTERS`), x = (src (B,
S), tgt_in (B, T)), y = tgt_out (B, T), all int64, PAD = 0; src is the English characters,
tgt_in = BOS + German, tgt_out = German + EOS. S and T are the longest in the batch, or
`max_chars` and `max_chars + 1` with `fixed_length=True`. The options `tokenizer=bpe` or
`unigram` (with `vocab_size`) read subword pieces instead.
"""

from __future__ import annotations

import gettext
import random
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from nas.tasks.base import SPLITS
from nas.tasks.parallel import (
    DECODE_ROWS,
    Pair,
    ParallelCorpus,
    TranslationBatch,
    decode_rows,
)
from nas.tasks.tokenizing import CHARACTERS, TokenizerOptions
from nas.text.decoding import StepFn, greedy_decode, translate_ids

__all__ = [
    "DECODE_ROWS",
    "DOMAINS",
    "StepFn",
    "Translation",
    "TranslationBatch",
    "decode_rows",
    "greedy_decode",
    "load_pairs",
    "read_catalog",
    "split_pairs",
    "translate_ids",
]

DOMAINS = ("iso3166-1", "iso3166-2", "iso639-3", "iso4217", "iso15924")
FRACTIONS = (0.8, 0.1, 0.1)  # train, validation, test


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


class Translation(ParallelCorpus):
    """English->German names: loss (nats/token) and token accuracy; `evaluate` adds chrF,
    BLEU and exact match of greedy translations."""

    name = "translation"
    example_call = "m.translate(['Germany', 'France'])"

    def __init__(
        self,
        *,
        seed: int = 0,
        max_chars: int = 48,
        fixed_length: bool = False,
        language: str = "de",
        tokenization: TokenizerOptions = CHARACTERS,
    ) -> None:
        if max_chars < 1:
            raise ValueError(f"max_chars must be positive, got {max_chars}")
        pairs, counts = load_pairs(language)
        kept = [p for p in pairs if max(len(p[0]), len(p[1])) <= max_chars]
        counts["too_long"] = len(pairs) - len(kept)
        if not kept:
            raise ValueError(f"no {language!r} pairs of at most {max_chars} characters")
        super().__init__(
            split_pairs(kept, seed),
            counts,
            seed=seed,
            max_chars=max_chars,
            fixed_length=fixed_length,
            tokenization=tokenization,
        )
