"""`nas.tasks.corpus_files`: every format round-trips a small corpus written here; cleaning is
counted; every bad input is a one-line error naming the file and the line."""

from __future__ import annotations

import json
from pathlib import Path

import polib
import pytest

from nas.tasks.corpus_files import CorpusError, read_corpus, split_pairs

PAIRS = [
    ("Open the file", "Datei öffnen"),
    ("%s files copied", "%s Dateien kopiert"),  # a placeholder stays as it is
    ("Hello, world", "Hallo, Welt"),  # a comma inside a CSV field
]


def written(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_tsv_csv_and_json_lines_round_trip_the_same_pairs(tmp_path: Path) -> None:
    tsv = written(
        tmp_path / "a.tsv",
        "source\ttarget\n" + "\n".join(f"{s}\t{t}" for s, t in PAIRS) + "\n\n",
    )
    csv = written(tmp_path / "b.csv", "\n".join(f'"{s}","{t}"' for s, t in PAIRS))
    shapes = [
        {"source": PAIRS[0][0], "target": PAIRS[0][1]},
        {"en": PAIRS[1][0], "de": PAIRS[1][1]},
        {"translation": {"en": PAIRS[2][0], "de": PAIRS[2][1]}},
    ]
    jsonl = written(tmp_path / "c.jsonl", "\n".join(json.dumps(r) for r in shapes))
    for path in (tsv, csv, jsonl):
        read = read_corpus(path)
        assert read.splits == {"all": PAIRS}, path
        assert read.files == [str(path)] and read.counts["kept"] == 3
    assert read_corpus(tsv).counts["header"] == 1


def test_cleaning_is_stated_and_counted(tmp_path: Path) -> None:
    lines = [
        "  Save   as…\tSpeichern  unter…",  # whitespace collapsed
        "OK\tOK",  # identical
        "Save as…\tSpeichern unter…",  # a duplicate once collapsed
        "Cafe\u0301\tCafe\u0301 (de)",  # NFC: e + combining accent -> é
        f"{'x' * 50}\tlong",  # too long for max_chars=40
    ]
    read = read_corpus(written(tmp_path / "clean.tsv", "\n".join(lines)), max_chars=40)
    assert read.splits["all"] == [("Save as…", "Speichern unter…"), ("Café", "Café (de)")]
    assert (read.counts["identical"], read.counts["duplicate"], read.counts["too_long"]) == (
        1,
        1,
        1,
    )
    assert read.counts["read"] == 5 and read.counts["kept"] == 2


def catalog(path: Path) -> polib.POFile:
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8"}
    po.append(polib.POEntry(msgid=PAIRS[0][0], msgstr=PAIRS[0][1]))
    po.append(polib.POEntry(msgid=PAIRS[1][0], msgstr=PAIRS[1][1]))
    po.append(polib.POEntry(msgid="Close", msgstr="Schließen", msgctxt="menu"))  # context
    po.append(polib.POEntry(msgid="Quit", msgstr="Beenden", flags=["fuzzy"]))  # fuzzy
    po.append(polib.POEntry(msgid="Help", msgstr=""))  # untranslated
    po.append(
        polib.POEntry(
            msgid="%d file", msgid_plural="%d files", msgstr_plural={0: "%d Datei", 1: "%d Dateien"}
        )
    )
    po.save(str(path))
    return po


def test_gettext_catalogs_skip_and_count_what_is_not_one_translation(tmp_path: Path) -> None:
    po = catalog(tmp_path / "de.po")
    po.save_as_mofile(str(tmp_path / "de.mo"))
    read = read_corpus(tmp_path / "de.po")
    assert read.splits == {"all": PAIRS[:2]}
    assert {k: read.counts[k] for k in ("context", "fuzzy", "untranslated", "plural")} == {
        "context": 1,
        "fuzzy": 1,
        "untranslated": 1,
        "plural": 1,
    }
    compiled = read_corpus(tmp_path / "de.mo")  # sorted by msgid; no fuzzy or empty entry
    assert sorted(compiled.splits["all"]) == sorted(PAIRS[:2]) and compiled.counts["plural"] == 1


def test_a_folder_keeps_the_splits_its_files_name(tmp_path: Path) -> None:
    for name, (s, t) in zip(("train.tsv", "dev.tsv", "test.tsv"), PAIRS, strict=True):
        written(tmp_path / name, f"{s}\t{t}\n")
    (tmp_path / "notes.txt").write_text("not a corpus")
    read = read_corpus(tmp_path)
    assert read.splits == {
        "train": [PAIRS[0]],
        "validation": [PAIRS[1]],
        "test": [PAIRS[2]],
    }
    assert [Path(f).name for f in read.files] == ["dev.tsv", "test.tsv", "train.tsv"]


def test_a_seeded_split_keeps_every_copy_of_a_source_together() -> None:
    pairs = [(f"s{i % 30}", f"t{i}") for i in range(90)]  # each source three times
    split = split_pairs(pairs, (0.8, 0.1, 0.1), seed=3)
    assert split == split_pairs(pairs, (0.8, 0.1, 0.1), seed=3)
    assert sum(len(v) for v in split.values()) == 90
    sources = {name: {s for s, _ in v} for name, v in split.items()}
    assert not (sources["train"] & sources["validation"]) and not (
        sources["train"] & sources["test"]
    )
    assert (len(sources["train"]), len(sources["validation"]), len(sources["test"])) == (24, 3, 3)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("one.tsv", "Open\tÖffnen\nClose\n", r"one.tsv:2: expected a source and a target"),
        ("side.tsv", "Open\t\n", r"side.tsv:1: expected a source and a target"),
        ("bad.jsonl", '{"source": "Open"}\n', r"bad.jsonl:1: expected the keys 'source'"),
        ("broken.jsonl", "{not json\n", r"broken.jsonl:1: not a JSON object"),
        ("empty.tsv", "\n\n", r"empty.tsv: empty \(no pair in it\)"),
        ("notes.txt", "x", r"notes.txt: unknown format '.txt'"),
    ],
)
def test_bad_input_is_one_line_naming_the_file_and_the_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    with pytest.raises(CorpusError, match=message) as error:
        read_corpus(written(tmp_path / name, content))
    assert "\n" not in str(error.value)


def test_a_missing_or_mis_encoded_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="no such file or folder"):
        read_corpus(tmp_path / "nowhere.tsv")
    latin = tmp_path / "latin.tsv"
    latin.write_bytes("Open\tÖffnen\nSave\tSichern\nClose\tSchließen\n".encode("latin-1"))
    with pytest.raises(CorpusError, match=r"latin.tsv:1: not UTF-8 \(byte 0xd6"):
        read_corpus(latin)
    (tmp_path / "none").mkdir()
    with pytest.raises(CorpusError, match="no corpus file in the folder"):
        read_corpus(tmp_path / "none")
