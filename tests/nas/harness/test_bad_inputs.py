"""Every bad input of `bad_inputs.CASES`, run as a user runs it (`python -m`, each in a
process of its own, forked from a warm interpreter: `tests.nas.harness.warm`): one line
naming the value or file, exit status 1, no traceback, and the recorded study beside it
unchanged."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from tests.nas.harness.bad_inputs import CASES, Case, markdown
from tests.nas.harness.warm import WarmPython

STUDY = "kept"
DOCS = Path(__file__).resolve().parents[3] / "docs" / "bad-inputs.md"
# what `python -m nas` imports before it refuses an input, paid once by the warm interpreter
WARM_IMPORTS = ["torch", "optuna", "hydra", "nas.cli", "nas.study.run", "nas.retrain.stage"]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A studies folder holding a study with three recorded trials."""
    studies = tmp_path_factory.mktemp("recorded") / "studies"
    studies.mkdir()
    study = optuna.create_study(study_name=STUDY, storage=f"sqlite:///{studies}/{STUDY}.db")
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=3)
    return studies


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the cases write their files (an exported model is made once for all)."""
    return tmp_path_factory.mktemp("inputs")


def _recorded(folder: Path) -> tuple[object, ...]:
    """What the folder records: the study's trials as Optuna reads them (SQLite may rewrite
    its file's header on opening it, changing no record), every other file's bytes."""
    study = optuna.load_study(study_name=STUDY, storage=f"sqlite:///{folder}/{STUDY}.db")
    trials = [
        (t.number, t.state, t.params, t.values, t.user_attrs, t.system_attrs)
        for t in study.get_trials()
    ]
    files = {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith(f"{STUDY}.db")
    }
    return trials, study.user_attrs, files


@pytest.fixture(scope="module")
def python(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmPython]:
    """`python -m` with the CLI's imports paid once (each case still its own process)."""
    warm = WarmPython(WARM_IMPORTS, tmp_path_factory.mktemp("warm"))
    yield warm
    warm.close()


def _argv(case: Case, made: Path, recorded: Path, run: Path) -> list[str]:
    argv = case.argv(made)
    if case.module != "nas":
        return argv
    given = {arg.split("=", 1)[0].lstrip("+~") for arg in argv}
    ours = {"studies_dir": str(recorded), "study.name": STUDY, "hydra.run.dir": str(run)}
    return [*argv, *(f"{k}={v}" for k, v in ours.items() if k not in given)]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_a_bad_input_ends_in_one_line_naming_it(
    case: Case, made: Path, recorded: Path, tmp_path: Path, python: WarmPython
) -> None:
    before = _recorded(recorded)
    done = python.run(case.module, _argv(case, made, recorded, tmp_path / "run"), tmp_path)
    printed = done.stdout + done.stderr
    assert done.returncode == 1 and "Traceback" not in printed, printed[-3000:]
    if case.module == "nas":
        errors = [line for line in printed.splitlines() if "[ERROR]" in line]
        assert len(errors) == 1 and printed.strip().splitlines()[-1] == errors[0], printed[-3000:]
    else:
        errors = done.stderr.strip().splitlines()
        assert len(errors) == 1, printed[-3000:]
    assert case.names in errors[0], errors[0]
    assert _recorded(recorded) == before


def test_the_documented_table_is_the_cases() -> None:
    assert DOCS.read_text() == markdown(), (
        "python -m tests.nas.harness.bad_inputs > docs/bad-inputs.md"
    )
