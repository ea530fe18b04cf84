"""`nas.search.fidelity`: the fidelities a trial is judged at, written and read back through
a real SQLite study (no processes)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from nas.search.fidelity import FIDELITY, Fidelity, fidelity_of, is_measured, record
from nas.settings import StudySettings


def test_each_fidelity_round_trips_through_the_storage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'fidelity.db'}"
    study = optuna.create_study(storage=url)
    for fidelity in Fidelity:
        trial = study.ask()
        for key, value in record(fidelity).items():
            trial.set_user_attr(key, value)
        study.tell(trial, 1.0)
    study.tell(study.ask(), 1.0)  # a study at full fidelity records none
    stored = optuna.load_study(study_name=study.study_name, storage=url)
    read = [fidelity_of(t) for t in stored.trials]
    assert read == [*Fidelity, Fidelity.FULL]
    assert all(type(f) is Fidelity for f in read)
    assert [is_measured(t) for t in stored.trials] == [True, False, True, True]


def test_a_study_is_set_to_judge_at_full_or_inherited_fidelity_only() -> None:
    assert Fidelity.settable() == ("full", "inherited")
    assert StudySettings(fidelity="inherited").fidelity == Fidelity.INHERITED
    with pytest.raises(ValueError, match="valid values: full, inherited"):
        StudySettings(fidelity=Fidelity.PROMOTED.value)
    with pytest.raises(ValueError, match="'rungs' is not a valid Fidelity"):
        fidelity_of({FIDELITY: "rungs"})
