"""A parallel corpus kept in Hugging Face `datasets`' own forms, read as pairs.

Users who keep their data as a `datasets` dataset should not have to export it to files
first. `nas.tasks.corpus_files.read_corpus` hands over two forms:

* a folder holding `dataset_dict.json` (a `DatasetDict`: its splits) or `dataset_info.json`
  (one `Dataset`, split by the task): `read_saved_dataset` reads it with
  `datasets.load_from_disk`;
* a Parquet or Arrow file (`.parquet`, `.arrow`), the files `datasets` writes and the Hub
  serves: `read_dataset_file` reads it with `datasets.load_dataset("parquet" | "arrow",
  data_files=...)`, the library's own loader for local files.

Each yields raw pairs for the same cleaning as a text file's. `datasets` is imported here
only, when such a corpus is read: it is the optional extra `elastic-nas[corpus]`.

A row is a pair as a JSON Lines record is (`record_fields`): "source" and "target"
columns, columns named by the two language codes, or a "translation" column of
{code: text}. A split named other than train, validation (or dev) and test, or a row without
both sides, is a `CorpusError` naming the folder, the split and the row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from nas.tasks.corpus_files import SPLIT_NAMES, CorpusError, Group, Pair, record_fields

__all__ = ["DATASET_SUFFIXES", "read_dataset_file", "read_saved_dataset"]

# local files `datasets.load_dataset` reads, by suffix: the loader's name
DATASET_SUFFIXES = {".parquet": "parquet", ".arrow": "arrow"}


def read_saved_dataset(
    root: Path, source: str, target: str, counts: Counter[str]
) -> Iterator[Group]:
    """The raw pairs of the dataset saved in `root`, a group per split ("all" for a single
    `Dataset`), counting every row read in `counts["read"]`."""
    loaded = _load(root)
    if not isinstance(loaded, dict):  # one Dataset (a DatasetDict is a dict of them)
        yield "all", str(root), _rows(root, "all", loaded, source, target, counts)
        return
    for name in sorted(loaded):
        split = SPLIT_NAMES.get(str(name).lower())
        if split is None:
            raise CorpusError(
                f"{root}: the dataset has a split {name!r}; valid split names: "
                f"{', '.join(SPLIT_NAMES)} (save only those, or the pairs as one Dataset)"
            )
        where = f"{root} (split {name!r})"
        yield split, where, _rows(root, str(name), loaded[name], source, target, counts)


def read_dataset_file(file: Path, source: str, target: str, counts: Counter[str]) -> Iterator[Pair]:
    """The raw pairs of a Parquet or Arrow file, read with `datasets.load_dataset`."""
    datasets = _datasets(file, "a Parquet or Arrow file")
    loader = DATASET_SUFFIXES[file.suffix]
    try:
        rows = datasets.load_dataset(loader, data_files=str(file), split="train")
    except Exception as error:  # pyarrow's and datasets' errors vary by version
        raise CorpusError(f"{file}: not a readable {loader} file ({_first_line(error)})") from None
    yield from _rows(file, "all", rows, source, target, counts)


def _load(root: Path) -> Any:
    datasets = _datasets(root, "a dataset saved with Hugging Face datasets")
    try:
        return datasets.load_from_disk(str(root))
    except (OSError, ValueError) as error:
        raise CorpusError(f"{root}: not a readable saved dataset ({_first_line(error)})") from None


def _datasets(path: Path, what: str) -> Any:
    try:
        import datasets
    except ImportError:
        raise CorpusError(
            f"{path}: {what}; reading it needs the package: "
            "pip install 'elastic-nas[corpus]' (or pip install datasets)"
        ) from None
    datasets.disable_progress_bars()  # a corpus is read as part of a task: no bar of its own
    return datasets


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _rows(
    root: Path, split: str, rows: Iterable[Any], source: str, target: str, counts: Counter[str]
) -> Iterator[Pair]:
    for number, row in enumerate(rows, start=1):
        counts["read"] += 1
        pair = record_fields(row, source, target)
        if pair is None:
            raise CorpusError(
                f"{root} (split {split!r}), row {number}: expected the columns 'source' and "
                f"'target' (or {source!r} and {target!r}, or 'translation'), both non-empty; "
                f"got {row!r:.80}"
            )
        yield pair
