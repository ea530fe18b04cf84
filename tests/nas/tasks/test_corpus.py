"""`task=corpus`: every format round-trips a small corpus written here through the task
(splits named by files kept, a seeded split otherwise), and every bad file or option is a
one-line `TaskInputError` naming the value and what is valid, raised by `check_task` before
a study would start."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from nas.tasks import SPLITS, Corpus, CorpusError, TaskInputError, check_task, get_task
from nas.tasks.corpus_files import split_pairs
from tests.nas.corpora import PAIRS, po_catalog, write_jsonl, write_tsv

SMALL = {"tokenizer": "chars"}  # the formats' tests need no subword training


def corpus(path: Path, **options: Any) -> Corpus:
    task = get_task("corpus", path=str(path), **{**SMALL, **options})
    assert isinstance(task, Corpus)
    return task


def every_pair(task: Corpus) -> list[tuple[str, str]]:
    return sorted(pair for split in SPLITS for pair in task.pairs(split))


def test_a_tsv_is_split_by_seed_keeping_each_source_in_one_split(tmp_path: Path) -> None:
    task = corpus(write_tsv(tmp_path / "pairs.tsv"), seed=3)
    assert every_pair(task) == sorted(PAIRS)
    expected = split_pairs(PAIRS, (0.8, 0.1, 0.1), seed=3)
    assert {split: task.pairs(split) for split in SPLITS} == expected
    assert [task.size(split) for split in SPLITS] == [72, 9, 9]
    sources = [{s for s, _ in task.pairs(split)} for split in SPLITS]
    assert not (sources[0] & sources[1]) and not (sources[0] & sources[2])
    assert task.describe()["splits"] == "seeded" and task.describe()["cleaning"]["kept"] == 90
    assert corpus(write_tsv(tmp_path / "again.tsv"), seed=3).splits == task.splits


def test_csv_json_lines_and_gettext_catalogs_give_the_same_task(tmp_path: Path) -> None:
    tsv = corpus(write_tsv(tmp_path / "pairs.tsv"))
    csv = tmp_path / "pairs.csv"
    csv.write_text("source,target\n" + "".join(f'"{s}","{t}"\n' for s, t in PAIRS))
    po = po_catalog(PAIRS, odd_entries=True)
    po.save(str(tmp_path / "pairs.po"))
    po.save_as_mofile(str(tmp_path / "pairs.mo"))
    for path in (csv, write_jsonl(tmp_path / "pairs.jsonl"), tmp_path / "pairs.po"):
        assert corpus(path).splits == tsv.splits, path
    compiled = corpus(tmp_path / "pairs.mo")  # a .mo holds its entries sorted by msgid
    assert every_pair(compiled) == every_pair(tsv)
    skipped = corpus(tmp_path / "pairs.po").describe()["cleaning"]
    assert {k: skipped[k] for k in ("plural", "context", "fuzzy", "untranslated")} == {
        "plural": 1,
        "context": 1,
        "fuzzy": 1,
        "untranslated": 1,
    }


def test_a_folder_keeps_the_splits_its_files_name(tmp_path: Path) -> None:
    parts = {"train.tsv": PAIRS[:80], "dev.tsv": PAIRS[80:85], "test.jsonl": PAIRS[85:]}
    for name, pairs in parts.items():
        (write_jsonl if name.endswith(".jsonl") else write_tsv)(tmp_path / name, pairs)
    task = corpus(tmp_path)
    assert task.pairs("train") == PAIRS[:80] and task.pairs("validation") == PAIRS[80:85]
    assert task.pairs("test") == PAIRS[85:] and task.describe()["splits"] == "given"
    assert len(task.describe()["files"]) == 3
    only_train = tmp_path / "only"
    only_train.mkdir()
    write_tsv(only_train / "train.tsv")
    assert corpus(only_train).describe()["splits"] == "seeded"


def test_a_saved_hugging_face_dataset_round_trips(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = {"translation": [{"en": s, "de": t} for s, t in PAIRS]}
    datasets.Dataset.from_dict(rows).save_to_disk(str(tmp_path / "one"))
    assert corpus(tmp_path / "one").splits == corpus(write_tsv(tmp_path / "p.tsv")).splits
    columns = {
        name: datasets.Dataset.from_dict({"source": [s for s, _ in p], "target": [t for _, t in p]})
        for name, p in (("train", PAIRS[:80]), ("validation", PAIRS[80:85]), ("test", PAIRS[85:]))
    }
    datasets.DatasetDict(columns).save_to_disk(str(tmp_path / "dict"))
    task = corpus(tmp_path / "dict")
    assert task.pairs("train") == PAIRS[:80] and task.pairs("test") == PAIRS[85:]
    assert task.describe()["splits"] == "given"
    datasets.DatasetDict({"extra": columns["train"]}).save_to_disk(str(tmp_path / "odd"))
    with pytest.raises(CorpusError, match=r"a split 'extra'; valid split names: train"):
        corpus(tmp_path / "odd")
    one_side = {"source": ["Open the file", "Close it"], "target": ["Datei öffnen", ""]}
    datasets.Dataset.from_dict(one_side).save_to_disk(str(tmp_path / "side"))
    with pytest.raises(CorpusError, match=r"side \(split 'all'\), row 2: expected the columns"):
        corpus(tmp_path / "side")


def test_parquet_and_arrow_files_are_read_with_load_dataset(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    rows = datasets.Dataset.from_dict({"en": [s for s, _ in PAIRS], "de": [t for _, t in PAIRS]})
    rows.to_parquet(str(tmp_path / "pairs.parquet"))
    expected = corpus(write_tsv(tmp_path / "p.tsv")).splits
    assert corpus(tmp_path / "pairs.parquet").splits == expected
    rows.save_to_disk(str(tmp_path / "saved"))  # its data file is an Arrow stream
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    assert corpus(arrow.rename(tmp_path / "pairs.arrow")).splits == expected
    (tmp_path / "broken.parquet").write_bytes(b"not parquet")
    with pytest.raises(CorpusError, match=r"broken.parquet: not a readable parquet file"):
        corpus(tmp_path / "broken.parquet")


def bad_file(tmp_path: Path, kind: str) -> Path:
    """A corpus that cannot be read, of `kind`."""
    path = tmp_path / f"{kind}.tsv"
    if kind == "empty":
        path.write_text("")
    elif kind == "latin":
        path.write_bytes("Open\tÖffnen\n".encode("latin-1"))
    elif kind == "identical":
        path.write_text("OK\tOK\nGNU\tGNU\n")  # every pair dropped by the cleaning
    elif kind == "one_side":
        write_tsv(path, PAIRS[:2])
        path.write_text(path.read_text() + "Close the window\n")
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", r"missing.tsv: no such file or folder"),
        ("empty", r"empty.tsv: empty \(no pair in it\)"),
        ("latin", r"latin.tsv:1: not UTF-8 \(byte 0xd6"),
        ("one_side", r"one_side.tsv:3: expected a source and a target separated by a tab"),
        ("identical", r"no pair left in the split\(s\) train, validation, test \(cleaning: "),
    ],
)
def test_a_bad_file_is_one_line_naming_it_before_a_study_starts(
    tmp_path: Path, kind: str, message: str
) -> None:
    options = {"path": str(bad_file(tmp_path, kind))}
    with pytest.raises(TaskInputError, match=message) as error:
        check_task("corpus", options)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tokenizer": "wordpiece"}, r"tokenizer='wordpiece' is not valid; valid tokenizers: "),
        ({"tokenizer": "bpe", "vocab_size": 20}, r"vocab_size=20 is not valid .* >= \d+"),
        ({"tokenizer": "unigram", "vocab_size": None}, r"vocab_size=None is not valid"),
        ({"tokenizer": "chars", "max_tokens": 30}, r"max_tokens=30 is not valid for tokenizer"),
        ({"tokenizer": "bpe", "vocab_size": 200, "max_tokens": 0}, r"max_tokens=0 is not valid"),
        ({"tokenizer": "bpe", "vocab_size": 200, "max_tokens": 1}, r"no pair left in the split"),
        ({"fractions": [0.5, 0.5]}, r"fractions=\[0.5, 0.5\] is not valid; valid: three"),
        ({"max_chars": 0}, r"max_chars=0 is not valid; valid: an integer >= 1"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_value_and_what_is_valid(
    tmp_path: Path, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(TaskInputError, match=message) as error:
        check_task("corpus", {"path": str(write_tsv(tmp_path / "p.tsv")), **options})
    assert "\n" not in str(error.value)


def test_named_splits_must_be_all_three(tmp_path: Path) -> None:
    write_tsv(tmp_path / "train.tsv", PAIRS[:80])
    write_tsv(tmp_path / "test.tsv", PAIRS[80:])
    with pytest.raises(CorpusError, match=r"names some splits \(test, train\) but not exactly"):
        corpus(tmp_path)
    write_tsv(tmp_path / "validation.tsv", PAIRS[80:82])
    write_tsv(tmp_path / "more.tsv", PAIRS[82:])
    with pytest.raises(CorpusError, match=r"\(test, train, validation, unnamed files\)"):
        corpus(tmp_path)


def test_only_tasks_on_the_users_data_are_built_before_a_study() -> None:
    check_task("translation", {"max_chars": -1})  # built by the study, which refuses it
    with pytest.raises(CorpusError, match="no such file or folder"):
        check_task("corpus", {"path": "/nowhere/pairs.tsv"})


def test_a_saved_dataset_without_the_datasets_package_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails
    with pytest.raises(CorpusError, match=r"pip install 'elastic-nas\[corpus\]'"):
        corpus(tmp_path)
