"""`nas.study.kept_weights`: the study's store of trained weights and a machine's copies of
them, as faults leave them (`benchmarks/soak.py`; no processes). Two workers on different
machines have different copies folders; on one machine, the same."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import optuna
import pytest
import torch

from nas.search.lineage import passed_over
from nas.settings import NasSettings
from nas.study.inheritance import load_snapshot, save_weights
from nas.study.kept_weights import (
    COPIES_KEPT,
    WEIGHTS_ARTIFACT,
    WEIGHTS_NOT_KEPT,
    WEIGHTS_SHA256,
    TrialWeights,
    WeightsError,
    late_weights_key,
    refused_weights_key,
    sha256_of,
    write_copy,
)
from tests.nas.study.test_inheritance import state


def _study_with_kept_weights(tmp_path: Path) -> tuple[optuna.Study, TrialWeights, Path]:
    """A study whose trial 0 completed, its weights kept in the store by one worker."""
    settings = NasSettings(studies_dir=str(tmp_path / "studies"))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    trial = study.ask()
    mine = TrialWeights(settings, tmp_path / "machine-a")
    save_weights(state(), mine.file(trial.number))
    mine.keep(trial)
    study.tell(trial, 0.5)
    store = tmp_path / "studies" / "artifacts" / trial.user_attrs[WEIGHTS_ARTIFACT]
    return study, TrialWeights(settings, tmp_path / "machine-b"), store  # another machine's


def test_kept_weights_come_back_whole_to_another_worker(tmp_path: Path) -> None:
    study, theirs, _ = _study_with_kept_weights(tmp_path)
    parent = study.get_trials()[0]
    assert len(parent.user_attrs[WEIGHTS_SHA256]) == 64
    path = theirs.download(parent)
    assert path is not None and theirs.download(parent) == path  # fetched once
    back = load_snapshot(path, rank=0, world_size=1)
    assert torch.equal(back.states["embed"]["weight"], state()["embed"]["weight"])


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "removed"])
def test_damaged_weights_are_refused_naming_the_trial_and_nothing_is_left(
    tmp_path: Path, damage: str
) -> None:
    study, theirs, store = _study_with_kept_weights(tmp_path)
    size = store.stat().st_size
    if damage == "truncated":
        with store.open("r+b") as f:
            f.truncate(size // 2)
    elif damage == "overwritten":  # the same size: only the checksum tells
        with store.open("r+b") as f:
            f.seek(size // 2)
            f.write(bytes(64))
    else:
        store.unlink()
    parent = study.get_trials()[0]
    with pytest.raises(WeightsError, match=f"trial 0's weights \\(artifact {store.name}\\)"):
        theirs.download(parent)
    assert list(theirs.file(0).parent.iterdir()) == []  # no partial file to be taken later


def test_weights_refused_as_damaged_are_kept_again_by_a_worker_with_a_whole_copy(
    tmp_path: Path,
) -> None:
    """The repair: a child on another machine refuses its parent's damaged weights and says
    so on the study; a worker on the machine that wrote them keeps its copy again before its
    next trial, and from then on every worker's children take that copy, whole."""
    settings = NasSettings(studies_dir=str(tmp_path / "studies"))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    trial = study.ask()
    mine = TrialWeights(settings, tmp_path / "machine-a")
    theirs = TrialWeights(settings, tmp_path / "machine-b")
    save_weights(state(), mine.file(trial.number))
    mine.keep(trial)
    study.tell(trial, 0.5)
    parent = study.get_trials()[0]
    store = tmp_path / "studies" / "artifacts" / parent.user_attrs[WEIGHTS_ARTIFACT]
    store.write_bytes(store.read_bytes()[:100])  # truncated
    with pytest.raises(WeightsError) as refused:
        theirs.download(parent)
    theirs.refused(study, refused.value)
    assert study.user_attrs[refused_weights_key(0)] == store.name
    assert passed_over(study.user_attrs, 0)  # evolution picks other parents meanwhile
    theirs.keep_late(study)  # no copy of its own: nothing to keep
    assert late_weights_key(0) not in study.user_attrs
    mine.keep_late(study)
    again = study.user_attrs[late_weights_key(0)]
    assert not passed_over(study.user_attrs, 0)  # a parent like any other again
    assert again["artifact"] != store.name and mine.not_kept == ()
    fetched = theirs.download(parent, again)
    assert fetched is not None and sha256_of(fetched) == parent.user_attrs[WEIGHTS_SHA256]
    mine.keep_late(study)  # kept again once: not again
    assert study.user_attrs[late_weights_key(0)] == again


def test_a_store_that_cannot_take_weights_is_recorded_and_the_trial_completes(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("the studies folder is a file")  # the store cannot be made there
    weights = TrialWeights(NasSettings(studies_dir=str(blocker)))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    trial = study.ask()
    save_weights(state(), weights.file(trial.number))
    weights.keep(trial)
    study.tell(trial, 0.5)
    done = study.get_trials()[0]
    assert done.state == optuna.trial.TrialState.COMPLETE
    assert "Not a directory" in done.user_attrs[WEIGHTS_NOT_KEPT]
    assert weights.not_kept == (0,)  # tried again before this worker's next trial
    assert weights.download(done) == weights.file(0)  # this worker's children: its own copy
    other = TrialWeights(NasSettings(studies_dir=str(tmp_path / "elsewhere")))
    assert other.download(done) is None  # another worker's children train from scratch


def test_weights_the_store_could_not_take_are_kept_before_the_next_trial(
    tmp_path: Path,
) -> None:
    """A store full or read-only for a while (the soak's store faults) is not waited for:
    the trial completes at once without its weights kept, and evolution passes it over as
    a parent; once the store heals, the worker keeps them before its next trial, on the
    study, and another worker's children inherit them, checked."""
    studies, weights, folder = _blocked_store(tmp_path)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    trial = study.ask()
    save_weights(state(), weights.file(trial.number))
    weights.keep(trial)  # returns at once: study.storage_wait_s (60) is not waited
    study.tell(trial, 0.5)
    assert passed_over(study.user_attrs, 0)
    weights.keep_late(study)  # still down: it waits for the next try
    assert weights.not_kept == (0,) and late_weights_key(0) not in study.user_attrs
    folder.unlink()
    folder.mkdir()
    weights.keep_late(study)
    assert weights.not_kept == () and not passed_over(study.user_attrs, 0)
    late = study.user_attrs[late_weights_key(0)]
    assert (folder / late["artifact"]).is_file()
    other = TrialWeights(NasSettings(studies_dir=str(studies)), tmp_path / "machine-b")
    done = study.get_trials()[0]
    assert other.download(done) is None  # the trial itself names no artifact
    fetched = other.download(done, late)
    assert fetched is not None and sha256_of(fetched) == late["sha256"]


def _blocked_store(tmp_path: Path) -> tuple[Path, TrialWeights, Path]:
    """A studies folder whose artifact store refuses every write (a file is in its way
    until the test heals it), a worker's weights on it, the store folder."""
    studies = tmp_path / "studies"
    studies.mkdir()
    weights = TrialWeights(NasSettings(studies_dir=str(studies)))
    folder = studies / "artifacts"
    shutil.rmtree(folder, ignore_errors=True)
    folder.write_text("in the way")
    return studies, weights, folder


def test_workers_on_one_machine_share_its_copies_checked_against_the_recorded_sha256(
    tmp_path: Path,
) -> None:
    """A child on another worker of the same machine takes the machine's copy of its
    parent's weights, whatever happened to the store's since; a file there that is not the
    trial's weights (another study's of the same name, say) is never taken."""
    study, _, store = _study_with_kept_weights(tmp_path)
    settings = NasSettings(studies_dir=str(tmp_path / "studies"))
    neighbour = TrialWeights(settings, tmp_path / "machine-a")
    store.write_bytes(store.read_bytes()[:100])  # the store's copy truncated
    parent = study.get_trials()[0]
    assert neighbour.download(parent) == neighbour.file(0)
    assert neighbour.copy_of(0) == "own"
    other = TrialWeights(settings, tmp_path / "machine-c")
    save_weights({"embed": {"weight": torch.zeros(1)}}, other.file(0))  # not trial 0's
    with pytest.raises(WeightsError):  # not taken: fetched, and the store's is damaged
        other.download(parent)


def test_a_restarted_worker_keeps_the_weights_its_killed_predecessor_could_not(
    tmp_path: Path,
) -> None:
    """A worker killed while its store was full leaves its trial's weights in the machine's
    copies; the worker started in its place keeps them before its first trial, and the
    trial is a parent again."""
    studies, _, folder = _blocked_store(tmp_path)
    settings = NasSettings(studies_dir=str(studies))
    killed = TrialWeights(settings)
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    trial = study.ask()
    save_weights(state(), killed.file(trial.number))
    killed.keep(trial)
    study.tell(trial, 0.5)
    assert passed_over(study.user_attrs, 0)
    del killed  # killed: whatever it meant to do again is gone with it
    folder.unlink()
    folder.mkdir()
    restarted = TrialWeights(settings)  # the same machine's copies
    restarted.keep_late(study)
    late = study.user_attrs[late_weights_key(0)]
    assert late["sha256"] == study.get_trials()[0].user_attrs[WEIGHTS_SHA256]
    assert not passed_over(study.user_attrs, 0)
    fetched = TrialWeights(settings, tmp_path / "machine-b").download(study.get_trials()[0], late)
    assert fetched is not None and sha256_of(fetched) == late["sha256"]


def test_a_disk_that_cannot_take_the_weights_file_fails_no_trial(tmp_path: Path) -> None:
    (tmp_path / "copies").write_text("a file where the folder would be")
    assert WEIGHTS_NOT_KEPT in write_copy(state(), tmp_path / "copies" / "trial-0.safetensors")
    assert write_copy(state(), tmp_path / "trial-0.safetensors") == {}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["copies", "trial-0.safetensors"]


def test_a_machines_copies_keep_the_newest_files(tmp_path: Path) -> None:
    weights = TrialWeights(NasSettings(studies_dir=str(tmp_path / "studies")), tmp_path / "m")
    for number in range(COPIES_KEPT + 2):  # older copies, oldest first
        weights.file(number).write_bytes(b"")
        os.utime(weights.file(number), (number, number))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    for _ in range(COPIES_KEPT + 3):
        trial = study.ask()
    save_weights(state(), weights.file(trial.number))
    weights.keep(trial)  # the newest: the 3 oldest go
    left = sorted(int(p.stem.removeprefix("trial-")) for p in (tmp_path / "m").iterdir())
    assert left == [*range(3, COPIES_KEPT + 2), trial.number]
