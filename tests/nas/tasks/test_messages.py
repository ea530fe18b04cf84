"""`task=messages`: sentences of the gettext catalogs in a folder (the system's by default),
what was read and dropped reported by `describe()`, and a clear refusal where there are no
catalogs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nas.tasks import SPLITS, CorpusError, Messages, TaskInputError, get_task
from nas.tasks.messages import FOLDER
from tests.nas.corpora import PAIRS, po_catalog, write_catalogs


def messages(**options: Any) -> Messages:
    task = get_task("messages", **{"tokenizer": "chars", **options})
    assert isinstance(task, Messages)
    return task


def test_the_catalogs_of_a_folder_give_their_sentences(tmp_path: Path) -> None:
    folder = write_catalogs(tmp_path / "locale")
    po_catalog([("Open", "Öffnen"), PAIRS[0]]).save(str(folder / "third.po"))  # 1 word; a copy
    task = messages(folder=str(folder))
    facts = task.describe()
    assert facts["catalogs"] == {"first.mo": 45, "second.po": 45, "third.po": 0}
    assert facts["skipped_catalogs"] == {} and facts["folder"] == str(folder)
    cleaning = facts["cleaning"]
    assert cleaning["duplicate"] == 1 and cleaning["too_few_words"] == 1
    assert {k: cleaning[k] for k in ("plural", "context", "fuzzy", "untranslated")} == {
        "plural": 1,
        "context": 1,
        "fuzzy": 1,
        "untranslated": 1,
    }
    assert cleaning["pairs"] == len(PAIRS) == sum(task.size(split) for split in SPLITS)
    shorter = messages(folder=str(folder), max_words=4)
    assert shorter.counts["too_many_words"] > 0
    assert all(len(s.split()) <= 4 for split in SPLITS for s, _ in shorter.pairs(split))


def test_an_unreadable_catalog_is_skipped_and_named(tmp_path: Path) -> None:
    folder = write_catalogs(tmp_path / "locale")
    (folder / "empty.po").write_text('msgid ""\nmsgstr ""\n"Content-Type: text/plain"\n')
    skipped = messages(folder=str(folder)).describe()["skipped_catalogs"]
    assert list(skipped) == ["empty.po"] and "empty" in skipped["empty.po"]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        ("missing", r"nowhere: no such folder; the messages task reads gettext catalogs"),
        ("no_catalogs", r"no readable gettext catalog \(\*.mo, \*.po\) in the folder \(none\)"),
        ("names_only", r"no message of 3 to 30 words in its 1 catalog\(s\)"),
    ],
)
def test_a_folder_without_sentences_is_refused_in_one_line(
    tmp_path: Path, make: str, message: str
) -> None:
    folder = tmp_path / ("nowhere" if make == "missing" else "locale")
    if make != "missing":
        folder.mkdir()
        (folder / "notes.txt").write_text("not a catalog")
    if make == "names_only":
        po_catalog([("Germany", "Deutschland"), ("Open", "Öffnen")]).save(str(folder / "a.po"))
    with pytest.raises(CorpusError, match=message) as error:
        messages(folder=str(folder))
    assert "\n" not in str(error.value)


def test_word_limits_must_make_a_range(tmp_path: Path) -> None:
    folder = str(write_catalogs(tmp_path / "locale"))
    with pytest.raises(TaskInputError, match=r"min_words=5 is more than max_words=4"):
        messages(folder=folder, min_words=5, max_words=4)
    with pytest.raises(TaskInputError, match=r"min_words=0 is not valid; valid: an integer >= 1"):
        messages(folder=folder, min_words=0)


def test_the_systems_catalogs_are_read_and_described() -> None:
    if not any(Path(FOLDER).glob("*.mo")):
        pytest.skip(f"no gettext catalogs in {FOLDER}")
    task = messages()
    facts = task.describe()
    assert sum(facts["catalogs"].values()) == facts["cleaning"]["pairs"] > 100
    assert facts["cleaning"]["read"] > facts["cleaning"]["pairs"]
    assert facts["cleaning"]["too_few_words"] > 0 and facts["words"] == [3, 30]
    for split in SPLITS:
        assert all(3 <= len(s.split()) <= 30 for s, _ in task.pairs(split))
