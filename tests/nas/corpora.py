"""Small parallel corpora the translation-task tests write: made-up software messages, 90
distinct English->German pairs, enough for a seeded 80/10/10 split and a subword tokenizer."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import polib

NOUNS = [
    ("file", "die Datei"),
    ("folder", "den Ordner"),
    ("branch", "den Zweig"),
    ("key", "den Schlüssel"),
    ("user", "den Benutzer"),
    ("table", "die Tabelle"),
]
VERBS = [
    ("cannot open the", "kann {} nicht öffnen"),
    ("did not find the", "fand {} nicht"),
    ("deleted the", "löschte {}"),
]
PAIRS = [
    (f"{n} {verb} {noun}", f"{n} {german.format(article)}")
    for (noun, article), (verb, german), n in itertools.product(NOUNS, VERBS, range(1, 6))
]


def write_tsv(path: Path, pairs: list[tuple[str, str]] = PAIRS) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def write_jsonl(path: Path, pairs: list[tuple[str, str]] = PAIRS) -> Path:
    records = (
        json.dumps({"translation": {"en": s, "de": t}}, ensure_ascii=False) for s, t in pairs
    )
    path.write_text("\n".join(records) + "\n", encoding="utf-8")
    return path


def po_catalog(pairs: list[tuple[str, str]], *, odd_entries: bool = False) -> polib.POFile:
    """A German gettext catalog of `pairs`; `odd_entries`: also a plural, a context, a fuzzy
    and an untranslated entry, which a reader skips (and counts)."""
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Language": "de"}
    for source, target in pairs:
        po.append(polib.POEntry(msgid=source, msgstr=target))
    if odd_entries:
        po.append(
            polib.POEntry(msgid="Close the window", msgstr="Fenster schließen", msgctxt="menu")
        )
        po.append(polib.POEntry(msgid="Quit the program now", msgstr="Beenden", flags=["fuzzy"]))
        po.append(polib.POEntry(msgid="Show the help text", msgstr=""))
        po.append(
            polib.POEntry(
                msgid="%d file was copied",
                msgid_plural="%d files were copied",
                msgstr_plural={0: "%d Datei wurde kopiert", 1: "%d Dateien wurden kopiert"},
            )
        )
    return po


def write_catalogs(folder: Path, pairs: list[tuple[str, str]] = PAIRS) -> Path:
    """`folder` holding two catalogs of `pairs` (the first half compiled, `.mo`; the rest as
    `.po` with odd entries) and a file that is no catalog."""
    folder.mkdir(parents=True, exist_ok=True)
    half = len(pairs) // 2
    po_catalog(pairs[:half]).save_as_mofile(str(folder / "first.mo"))
    po_catalog(pairs[half:], odd_entries=True).save(str(folder / "second.po"))
    (folder / "notes.txt").write_text("not a catalog")
    return folder
