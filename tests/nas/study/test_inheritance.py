"""`nas.study.inheritance`'s pure parts: the weights file every stage process reads, the
bank of trained weights a stage process keeps, and the study's store of them under faults
(no processes)."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest
import torch

from nas.search.lineage import passed_over
from nas.settings import NasSettings
from nas.study.inheritance import (
    INHERITED_FROM,
    WEIGHTS_ARTIFACT,
    WEIGHTS_NOT_KEPT,
    WEIGHTS_SHA256,
    TrialWeights,
    WeightBank,
    WeightsError,
    inherited_attrs,
    late_weights_key,
    load_snapshot,
    refused_weights_key,
    save_weights,
    sha256_of,
)
from pipeline import WeightSnapshot


def state() -> dict[str, dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed": {"weight": torch.randn(5, 3, generator=g)},
        "enc.block0.left": {
            "linear.weight": torch.randn(3, 3, generator=g),
            "linear.bias": torch.zeros(3),
        },
        "head": {"weight": torch.randn(5, 3, generator=g)[:, :2]},  # a non-contiguous view
    }


def test_weights_round_trip_as_stage_zero_of_any_pipeline(tmp_path: Path) -> None:
    path = save_weights(state(), tmp_path / "w.safetensors")
    first = load_snapshot(path, rank=0, world_size=3)
    assert first.keys == ("embed", "enc.block0.left", "head")  # the model's layer order
    assert first.sizes == (3, 0, 0)  # stage 0 sends each layer to its owner
    for key, layer in state().items():
        for name, tensor in layer.items():
            assert torch.equal(first.states[key][name], tensor), (key, name)
    other = load_snapshot(path, rank=2, world_size=3)
    assert (other.keys, other.sizes, dict(other.states)) == (first.keys, first.sizes, {})
    kept = first.without(["enc.block0.left.linear."])  # an edited branch: afresh
    assert kept.states["enc.block0.left"] == {} and "weight" in kept.states["embed"]


def _snapshot(value: float) -> WeightSnapshot:
    layers = {"embed": {"weight": torch.full((2, 2), value)}, "enc.left": {"w": torch.ones(2)}}
    return WeightSnapshot(tuple(layers), (2,), layers)


def test_the_bank_keeps_the_last_trials_and_a_child_of_its_parent_takes_all_but_its_edit() -> None:
    bank = WeightBank(keep=2)
    for number in (3, 5, 8):
        bank.put(number, _snapshot(float(number)))
    assert bank.numbers == [5, 8]  # the oldest dropped
    assert bank.source(5) == 5 and bank.source(3) == 8  # a parent no longer kept: the last
    assert bank.source(None) == 8
    child = bank.inherited(5, parent=5, edited=("enc.left.",))
    assert child is not None and child.states["enc.left"] == {}  # its edit starts afresh
    assert torch.equal(child.states["embed"]["weight"], torch.full((2, 2), 5.0))
    other = bank.inherited(8, parent=5, edited=("enc.left.",))  # not its parent: all of it
    assert other is not None and "w" in other.states["enc.left"]
    assert inherited_attrs(8) == {INHERITED_FROM: 8}
    assert inherited_attrs(5, 1) == {INHERITED_FROM: 5, "inherited_fresh_tensors": 1}


# -- the study's store of trained weights, as faults leave it (`benchmarks/soak.py`) ----------


def _study_with_kept_weights(tmp_path: Path) -> tuple[optuna.Study, TrialWeights, Path]:
    """A study whose trial 0 completed, its weights kept in the store by one worker."""
    settings = NasSettings(studies_dir=str(tmp_path / "studies"))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    trial = study.ask()
    mine = TrialWeights(settings)
    save_weights(state(), mine.file(trial.number))
    mine.keep(trial)
    study.tell(trial, 0.5)
    store = tmp_path / "studies" / "artifacts" / trial.user_attrs[WEIGHTS_ARTIFACT]
    return study, TrialWeights(settings), store  # the other: another worker's


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
    """The repair: a child on another worker refuses its parent's damaged weights and says
    so on the study; the worker that wrote them keeps its copy again before its next trial,
    and from then on every worker's children take that copy, whole."""
    settings = NasSettings(studies_dir=str(tmp_path / "studies"))
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}")
    trial = study.ask()
    mine, theirs = TrialWeights(settings), TrialWeights(settings)
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
    other = TrialWeights(NasSettings(studies_dir=str(studies)))
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
