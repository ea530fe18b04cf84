"""A parallel corpus read from the files users have: TSV, CSV, JSON Lines, gettext catalogs.

A translation study on one's own data starts from a file or a folder of them. Formats, by
suffix:

    .tsv            source <TAB> target, one pair a line (a header line naming the two
                    columns is skipped)
    .csv            the same with commas and CSV quoting
    .jsonl .json    one JSON object a line: {"source": ..., "target": ...}, or the
                    languages' codes as keys ({"en": ..., "de": ...}), or Hugging Face's
                    {"translation": {"en": ..., "de": ...}}
    .po .mo         gettext catalogs (read with `polib`): msgid -> msgstr; untranslated,
                    fuzzy, obsolete, plural and context entries are skipped and counted
    .parquet .arrow the files Hugging Face `datasets` writes, read with
                    `datasets.load_dataset` (`nas.tasks.saved_dataset`); rows as JSON Lines'

A folder is every such file in it (sorted, not recursive); files named after a split
(`train.*`, `validation.*` or `dev.*`, `test.*`) keep their split, the rest is split by the
task (`split_pairs`: seeded, every copy of a source in one split). A folder that a Hugging
Face `datasets` dataset was saved to (`save_to_disk`: it holds `dataset_dict.json` or
`dataset_info.json`) is read with `datasets.load_from_disk` (`nas.tasks.saved_dataset`,
the optional extra `elastic-nas[corpus]`), its splits kept as named.

Cleaning, in this order and counted (`CorpusRead.counts`): text NFC-normalised and its
whitespace collapsed; pairs with an empty side dropped; pairs whose two sides are equal
dropped; pairs with a side longer than `max_chars` dropped; exact duplicate pairs kept once.
Placeholders (`%s`, `{0}`, `%(name)d`) are text like any other and stay intact.

A missing, empty or mis-encoded file, or a line with one side only, raises `CorpusError`: one
line naming the file and the line number, which the CLI prints without a traceback.
"""

from __future__ import annotations

import csv
import json
import random
import unicodedata
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nas.tasks.base import TaskInputError

__all__ = [
    "SAVED_DATASET_FILES",
    "SPLIT_NAMES",
    "SUFFIXES",
    "CorpusError",
    "CorpusRead",
    "read_corpus",
    "record_fields",
    "split_pairs",
]

SUFFIXES = (".tsv", ".csv", ".jsonl", ".json", ".po", ".mo", ".parquet", ".arrow")
# what a file (or a saved dataset's split) may be called, and the split it then holds
SPLIT_NAMES = {"train": "train", "validation": "validation", "dev": "validation", "test": "test"}
_HEADERS = {("source", "target"), ("src", "tgt")}
SAVED_DATASET_FILES = ("dataset_dict.json", "dataset_info.json")  # `save_to_disk` writes one

Pair = tuple[str, str]
# one group of raw pairs: the split it belongs to ("all": none named), what to call it in a
# message (a file), and its pairs
Group = tuple[str, str, Iterator[Pair]]


class CorpusError(TaskInputError):
    """A corpus file that cannot be read as one: its message is one line naming the file
    (and the line) and what is wrong."""


@dataclass
class CorpusRead:
    """The pairs read, by split where the files named one (else under "all"), and what the
    reading and cleaning counted."""

    splits: dict[str, list[Pair]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    files: list[str] = field(default_factory=list)


def read_corpus(
    path: str | Path, *, source: str = "en", target: str = "de", max_chars: int = 400
) -> CorpusRead:
    """Read and clean the corpus at `path` (a file, a folder of files or a saved dataset,
    module doc); `source` and `target` are the language codes JSON Lines may use as keys."""
    root = Path(path).expanduser()
    if not root.exists():
        raise CorpusError(f"{root}: no such file or folder (a corpus: {', '.join(SUFFIXES)})")
    read = CorpusRead()
    seen: dict[str, set[Pair]] = {}
    for split, name, pairs in _groups(root, source, target, read.counts):
        before = read.counts["read"]
        raw = list(pairs)
        if read.counts["read"] == before:
            raise CorpusError(f"{name}: empty (no pair in it)")
        kept = read.splits.setdefault(split, [])
        for pair in raw:
            clean = _clean(pair, max_chars, read.counts)
            if clean is not None and clean not in seen.setdefault(split, set()):
                seen[split].add(clean)
                kept.append(clean)
            elif clean is not None:
                read.counts["duplicate"] += 1
        read.files.append(name)
    read.counts["kept"] = sum(len(p) for p in read.splits.values())
    return read


def _groups(root: Path, source: str, target: str, counts: Counter[str]) -> Iterator[Group]:
    """The raw pairs under `root`, a group per file (or per split of a saved dataset)."""
    if root.is_dir() and any((root / name).is_file() for name in SAVED_DATASET_FILES):
        from nas.tasks.saved_dataset import read_saved_dataset

        yield from read_saved_dataset(root, source, target, counts)
        return
    files = sorted(p for p in root.iterdir() if p.suffix in SUFFIXES) if root.is_dir() else [root]
    if not files:
        raise CorpusError(
            f"{root}: no corpus file in the folder (suffixes {', '.join(SUFFIXES)}, or a "
            f"dataset saved with save_to_disk: {' or '.join(SAVED_DATASET_FILES)})"
        )
    for file in files:
        if file.suffix not in SUFFIXES:
            raise CorpusError(f"{file}: unknown format {file.suffix!r}; use {', '.join(SUFFIXES)}")
        split = SPLIT_NAMES.get(file.stem.lower(), "all")
        yield split, str(file), _pairs(file, source, target, counts)


def split_pairs(
    pairs: Sequence[Pair], fractions: tuple[float, float, float], seed: int
) -> dict[str, list[Pair]]:
    """`pairs` cut into train/validation/test by `fractions` of their distinct sources,
    shuffled with `random.Random(seed)`: every copy of a source lands in one split (a model is
    never scored on a sentence it was trained on). Within a split, pairs keep their order."""
    sources = sorted({s for s, _ in pairs})
    random.Random(seed).shuffle(sources)
    n_train = round(fractions[0] * len(sources))
    n_val = round(fractions[1] * len(sources))
    where = {s: "train" for s in sources[:n_train]}
    where |= {s: "validation" for s in sources[n_train : n_train + n_val]}
    where |= {s: "test" for s in sources[n_train + n_val :]}
    out: dict[str, list[Pair]] = {"train": [], "validation": [], "test": []}
    for pair in pairs:
        out[where[pair[0]]].append(pair)
    return out


def _clean(pair: Pair, max_chars: int, counts: Counter[str]) -> Pair | None:
    """The module doc's cleaning of one pair; None (counted) when it is dropped."""
    src, tgt = (" ".join(unicodedata.normalize("NFC", side).split()) for side in pair)
    reason = (
        "empty"
        if not src or not tgt
        else "identical"
        if src == tgt
        else "too_long"
        if max(len(src), len(tgt)) > max_chars
        else None
    )
    if reason is not None:
        counts[reason] += 1
        return None
    return src, tgt


def _pairs(file: Path, source: str, target: str, counts: Counter[str]) -> Iterator[Pair]:
    if file.suffix in (".po", ".mo"):
        yield from _catalog(file, counts)
        return
    if file.suffix in (".parquet", ".arrow"):
        from nas.tasks.saved_dataset import read_dataset_file

        yield from read_dataset_file(file, source, target, counts)
        return
    text = _text(file)
    if file.suffix in (".tsv", ".csv"):
        yield from _table(file, text, counts)
    else:
        yield from _json_lines(file, text, source, target, counts)


def _text(file: Path) -> str:
    """The file as UTF-8 text (a BOM dropped); mis-encoded: the line of the first bad byte."""
    data = file.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise CorpusError(
            f"{file}:{line}: not UTF-8 (byte {data[error.start]:#x} at offset {error.start}); "
            "save the corpus as UTF-8"
        ) from None


def _table(file: Path, text: str, counts: Counter[str]) -> Iterator[Pair]:
    dialect = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if file.suffix == ".tsv" else {}
    reader = csv.reader(text.splitlines(), **dialect)  # type: ignore[arg-type]
    for number, row in enumerate(reader, start=1):
        if not row or not any(cell.strip() for cell in row):
            continue  # a blank line
        if number == 1 and tuple(c.strip().lower() for c in row) in _HEADERS:
            counts["header"] += 1
            continue
        counts["read"] += 1
        if len(row) != 2 or not row[0].strip() or not row[1].strip():
            raise CorpusError(
                f"{file}:{number}: expected a source and a target separated by "
                f"{'a tab' if file.suffix == '.tsv' else 'a comma'}, got {len(row)} field(s): "
                f"{row!r:.80}"
            )
        yield row[0], row[1]


def _json_lines(
    file: Path, text: str, source: str, target: str, counts: Counter[str]
) -> Iterator[Pair]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        counts["read"] += 1
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise CorpusError(f"{file}:{number}: not a JSON object ({error.msg})") from None
        pair = record_fields(record, source, target)
        if pair is None:
            raise CorpusError(
                f"{file}:{number}: expected the keys 'source' and 'target' (or {source!r} and "
                f"{target!r}, or 'translation'), got {line.strip()!r:.80}"
            )
        yield pair


def record_fields(record: object, source: str, target: str) -> Pair | None:
    """The pair of one record (a JSON object, a dataset's row): its "source" and "target",
    its `source` and `target` language codes, or those inside its "translation"; None when
    it has neither (or a side is empty)."""
    if isinstance(record, dict) and isinstance(record.get("translation"), dict):
        record = record["translation"]
    return _fields(record, ("source", "target")) or _fields(record, (source, target))


def _fields(record: object, keys: tuple[str, str]) -> Pair | None:
    if not isinstance(record, dict):
        return None
    first, second = record.get(keys[0]), record.get(keys[1])
    if not isinstance(first, str) or not isinstance(second, str):
        return None
    return (first, second) if first.strip() and second.strip() else None


def _catalog(file: Path, counts: Counter[str]) -> Iterator[Pair]:
    """A gettext catalog's translated singular entries without context (module doc)."""
    import polib

    try:
        catalog = polib.mofile(str(file)) if file.suffix == ".mo" else polib.pofile(str(file))
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise CorpusError(f"{file}: not a gettext catalog ({error})") from None
    for entry in catalog:
        counts["read"] += 1
        reason = (
            "obsolete"
            if entry.obsolete
            else "plural"
            if entry.msgid_plural
            else "fuzzy"
            if "fuzzy" in entry.flags
            else "context"
            if entry.msgctxt
            else "untranslated"
            if not entry.msgstr
            else None
        )
        if reason is not None:
            counts[reason] += 1
            continue
        yield entry.msgid, entry.msgstr
