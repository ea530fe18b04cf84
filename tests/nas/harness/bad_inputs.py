"""Bad input at the edges, in bulk: settings and files a new user gets wrong.

Each case is one command a user might type (`python -m nas ...`, or `python -m nas.export
convert ...`) with a bad setting, or a file that is broken, of the wrong kind or from
elsewhere. Every one must end in one [ERROR] line naming the value or file and what is
valid, exit status 1, no traceback, and nothing already recorded changed (`test_bad_inputs`
runs them all against a folder holding a recorded study).

The table in `docs/bad-inputs.md` is written from these cases:

    python -m tests.nas.harness.bad_inputs > docs/bad-inputs.md
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.nas.corpora import PAIRS, write_tsv

__all__ = ["CASES", "Case", "markdown"]

Files = Callable[[Path], list[str]]  # makes the case's files in a folder; its arguments


@dataclass(frozen=True)
class Case:
    """One bad input: its id, what is wrong, the arguments (or what makes them), and a
    fragment the error line must hold (the key or the file it names)."""

    id: str
    what: str
    arguments: tuple[str, ...] | Files
    names: str
    module: str = "nas"

    def argv(self, folder: Path) -> list[str]:
        made = self.arguments if isinstance(self.arguments, tuple) else self.arguments(folder)
        return list(made)


def _file(name: str, content: bytes) -> Files:
    def make(folder: Path) -> list[str]:
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        return [f"task.options.path={path}"]

    return make


def _corpus(name: str, content: bytes) -> Files:
    def make(folder: Path) -> list[str]:
        return ["task=corpus", *_file(name, content)(folder)]

    return make


def _corpus_with(*more: str) -> Files:
    def make(folder: Path) -> list[str]:
        return ["task=corpus", f"task.options.path={write_tsv(folder / 'pairs.tsv')}", *more]

    return make


def _corpus_folder(names: tuple[str, ...]) -> Files:
    def make(folder: Path) -> list[str]:
        root = folder / "corpus-splits"
        root.mkdir(exist_ok=True)
        for name in names:
            write_tsv(root / name, PAIRS[:30])
        return ["task=corpus", f"task.options.path={root}"]

    return make


def _storage(name: str, content: bytes, scheme: str = "sqlite:///") -> Files:
    def make(folder: Path) -> list[str]:
        path = folder / name
        path.write_bytes(content)
        return [f"study.storage={scheme}{path}"]

    return make


def _under_a_file(key: str, tail: str) -> Files:
    def make(folder: Path) -> list[str]:
        blocker = folder / "a-file"
        blocker.write_text("not a folder\n")
        return [f"{key}={blocker / tail}"]

    return make


def _seed_file(name: str, content: str) -> Files:
    def make(folder: Path) -> list[str]:
        path = folder / name
        path.write_text(content)
        return [f"search_space.seeds=[{path}]"]

    return make


def _export(damage: str) -> Files:
    """An exported model's folder, damaged: a tensor missing or of the wrong shape, or the
    tokenizer of another model; as a seed model."""

    def make(folder: Path) -> list[str]:
        from tests.nas.harness.exports import damaged_export

        return [f"search_space.seeds=[{damaged_export(folder, damage)}]"]

    return make


def _convert(damage: str) -> Files:
    def make(folder: Path) -> list[str]:
        from tests.nas.harness.exports import damaged_export

        return ["convert", str(damaged_export(folder, damage))]

    return make


LATIN_1 = "Die Datei wurde gelöscht\tThe file was deleted\n".encode("latin-1")

CASES: tuple[Case, ...] = (
    # -- settings refused while composing or checked --------------------------------------
    Case(
        "unknown-option",
        "an option group with no such option",
        ("sampler=annealing",),
        "Could not find 'sampler/annealing'; valid options of sampler: ",
    ),
    Case("unknown-key", "a key that does not exist", ("train.stepz=5",), "stepz"),
    Case(
        "added-unknown-key",
        "a key added that the settings do not have",
        ("+train.speed=5",),
        "speed",
    ),
    Case("broken-override", "an override that does not parse", ("train={steps: 5",), "train"),
    Case(
        "wrong-type",
        "text where a number goes",
        ("train.steps=abc",),
        "train.steps='abc' is not valid; it must be a positive integer",
    ),
    Case(
        "negative-steps",
        "a negative step count",
        ("train.steps=-5",),
        "train.steps=-5 is not valid; it must be a positive integer",
    ),
    Case("zero-batch", "a batch of no samples", ("train.batch_size=0",), "train.batch_size"),
    Case("zero-lr", "a learning rate of 0", ("train.lr=0",), "train.lr"),
    Case(
        "unknown-lr-schedule",
        "a learning-rate schedule that does not exist",
        ("train.lr_schedule=zigzag",),
        "train.lr_schedule",
    ),
    Case(
        "zero-eval-every", "evaluations every 0 steps", ("train.eval_every=0",), "train.eval_every"
    ),
    Case("zero-trials", "a study of no trials", ("study.n_trials=0",), "study.n_trials"),
    Case(
        "negative-budget",
        "a negative time budget",
        ("study.time_budget_s=-1",),
        "study.time_budget_s",
    ),
    Case(
        "unknown-objective",
        "an objective the task does not measure",
        ("study.objectives=[speed]",),
        "study.objectives",
    ),
    Case(
        "confirm-on-own-seed",
        "leaders confirmed on the study's own seed",
        ("study.confirm_seed=0",),
        "study.confirm_seed",
    ),
    Case(
        "unknown-schedule",
        "a pipeline schedule that does not exist",
        ("pipeline.schedule=zigzag",),
        "pipeline.schedule",
    ),
    Case(
        "unknown-planner",
        "a planner that does not exist",
        ("pipeline.planner=magic",),
        "pipeline.planner",
    ),
    Case("zero-stages", "a pipeline of 0 stages", ("pipeline.n_stages=0",), "pipeline.n_stages"),
    Case(
        "negative-memory",
        "a negative memory budget",
        ("pipeline.memory_budget=-1",),
        "pipeline.memory_budget",
    ),
    Case("unknown-stage", "a stage that does not exist", ("stages=[deploy]",), "stages"),
    Case(
        "empty-window",
        "a parameter window whose low end is above its high end",
        ("search_space.param_window=[2,1]",),
        "search_space.param_window",
    ),
    Case(
        "one-ended-window",
        "a parameter window of one number",
        ("search_space.param_window=[0.5]",),
        "search_space.param_window",
    ),
    Case(
        "unknown-primitive",
        "a primitive the space does not offer",
        ("search_space.primitives=[swish]",),
        "search_space.primitives",
    ),
    Case(
        "unknown-seed-model",
        "a seed model neither named nor a file",
        ("search_space.seeds=[nope]",),
        "search_space.seeds",
    ),
    Case(
        "zero-top-k",
        "retraining no model",
        ("retrain.top_k=0",),
        "retrain.top_k=0 is not valid; it must be a positive integer",
    ),
    Case(
        "pruner-option-unknown",
        "an option the pruner does not take",
        ("pruner=pdh", "+pruner.options.bogus=1"),
        "bogus",
    ),
    Case(
        "pruner-budget-off-step",
        "a hurdle between two evaluations",
        ("pruner=pdh", "pruner.options.budgets=[7]"),
        "pruner.options.budgets",
    ),
    Case("unknown-tracker", "a tracker that does not exist", ("tracker=nowhere",), "tracker"),
    Case("unknown-task", "a task that does not exist", ("task.name=poetry",), "poetry"),
    Case(
        "corpus-no-path",
        "the corpus task without its file",
        ("task=corpus",),
        "task.options.path has no value (??? in its option file); set it",
    ),
    Case(
        "corpus-bad-fractions",
        "split fractions that do not sum to 1",
        _corpus_with("task.options.fractions=[0.5,0.2,0.1]"),
        "fractions",
    ),
    # -- the user's files --------------------------------------------------------------------
    Case(
        "corpus-missing",
        "a corpus path that does not exist",
        ("task=corpus", "task.options.path=/nowhere/pairs.tsv"),
        "/nowhere/pairs.tsv",
    ),
    Case(
        "corpus-latin-1",
        "a corpus in Latin-1, not UTF-8",
        _corpus("latin1.tsv", LATIN_1 * 40),
        "latin1.tsv",
    ),
    Case("corpus-empty", "an empty corpus file", _corpus("empty.tsv", b""), "empty.tsv"),
    Case(
        "corpus-no-tabs",
        "a TSV whose lines hold no tab",
        _corpus("one-column.tsv", b"just one column\n" * 40),
        "one-column.tsv",
    ),
    Case(
        "corpus-binary",
        "a file of random bytes named .tsv",
        _corpus("noise.tsv", bytes(range(256)) * 8),
        "noise.tsv",
    ),
    Case(
        "corpus-broken-jsonl",
        "a JSON Lines corpus with a broken line",
        _corpus("broken.jsonl", b'{"en": "a", "de": "b"}\n{"en": \n'),
        "broken.jsonl",
    ),
    Case(
        "corpus-two-splits",
        "named splits that leave one out",
        _corpus_folder(("train.tsv", "test.tsv")),
        "corpus-splits",
    ),
    Case("study-of-another-search", "a study name another program's study holds", (), "kept"),
    Case(
        "storage-not-a-database",
        "a study database that is not a database",
        _storage("study.db", b"this is a text file, not SQLite\n" * 64),
        "study.db",
    ),
    Case(
        "storage-unknown-scheme",
        "a storage URL of no kind the harness opens",
        ("study.storage=ftp://host/study",),
        "ftp://host/study",
    ),
    Case(
        "storage-unreachable",
        "a database server nobody listens for",
        ("study.storage=postgresql+psycopg2://nas:pw@127.0.0.1:9/postgres",),
        "127.0.0.1:9",
    ),
    Case(
        "storage-journal-under-a-file",
        "a journal file under a file",
        _under_a_file("study.storage", "study.log"),
        "a-file",
    ),
    Case(
        "studies-dir-under-a-file",
        "a studies folder that cannot be made",
        _under_a_file("studies_dir", "studies"),
        "a-file",
    ),
    Case(
        "seed-not-json",
        "a seed architecture file that is not JSON",
        _seed_file("arch.json", "{not json"),
        "arch.json",
    ),
    Case(
        "seed-not-an-architecture",
        "a seed JSON file of something else",
        _seed_file("other.json", json.dumps({"layers": 3})),
        "other.json",
    ),
    Case(
        "export-missing-tensor",
        "an exported seed model missing a tensor",
        _export("missing-tensor"),
        "model.safetensors",
    ),
    Case(
        "export-wrong-shape",
        "an exported seed model with a tensor of the wrong shape",
        _export("wrong-shape"),
        "model.safetensors",
    ),
    Case(
        "export-foreign-tokenizer",
        "an exported seed model with another model's tokenizer.json",
        _export("foreign-tokenizer"),
        "tokenizer.json",
    ),
    Case(
        "convert-broken-config",
        "converting a folder whose config.json is broken",
        _convert("broken-config"),
        "config.json",
        module="nas.export",
    ),
)


def markdown() -> str:
    """The table of `docs/bad-inputs.md`."""
    lines = [
        "# Bad input at the edges",
        "",
        "What `python -m nas` (and `python -m nas.export`) says to settings and files a user",
        "gets wrong. Each ends in one `[ERROR]` line naming the value or file and what is valid,",
        "exit status 1, no traceback, nothing already recorded changed. The table is written",
        "from the cases `tests/nas/harness/test_bad_inputs.py` runs:",
        "`python -m tests.nas.harness.bad_inputs > docs/bad-inputs.md`.",
        "",
        "| case | what is wrong | given | the error names |",
        "| --- | --- | --- | --- |",
    ]
    for case in CASES:
        given = (
            " ".join(case.arguments)
            if isinstance(case.arguments, tuple)
            else "(a file the test writes)"
        )
        lines.append(f"| {case.id} | {case.what} | `{given}` | `{case.names}` |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(markdown())
