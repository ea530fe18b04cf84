"""The study's store of trained weights at inherited fidelity, and the faults it survives.

Every complete trial keeps its final weights (`nas.study.inheritance.save_weights`) in
Optuna's artifact store (`FileSystemArtifactStore` at `<studies_dir>/artifacts`), their id
and SHA-256 in the trial's `weights_artifact` and `weights_sha256` attributes, so any worker
on the study's storage finds them, after a restart too (`TrialWeights`).

The store is a folder that can fail like any other (`benchmarks/soak.py` makes it so): a
disk that fills, a folder made read-only, a file truncated or changed after it was written.
None of these stops a study:

    copies    each trial's weights are written, and parents' fetched, to this machine's
              copies (`<studies_dir>/weights/<study>/`, `machine_copies`), shared by the
              machine's workers and kept across their restarts: a file appears there whole
              (written beside and moved) and is used only while its SHA-256 is the one the
              trial recorded, so a child on this machine takes its parent's weights from
              there, whatever the store went through since; the newest 64 files stay
    keep      a weights file that the store cannot take now (full, read-only) is not
              waited for, since the worker would idle for as long as the outage lasts: it
              is logged and recorded on its trial (`weights_not_kept`), the trial completes,
              and evolution passes it over as a parent until it is kept (pass over)
    late      the worker keeps the file and tries the store again before each of its next
              trials (`keep_late`); once it takes them, the study records where (its user
              attribute `weights:<trial>`: artifact and SHA-256) and every worker's children
              of that trial inherit again; meanwhile this machine's children use its copy. A
              worker that starts takes over the late weights of the copies a killed one left
    repair    a child that refused its parent's damaged weights says so on the study
              (`weights_refused:<trial>`: the artifact); a worker on a machine holding a
              whole copy of them keeps that copy again before its next trial, as late
              weights, which every worker prefers from then on
    fetch     a parent's file is downloaded beside its final name and moved there once
              whole, then checked against the SHA-256 recorded when it was kept
              (`weights_sha256`) and opened; one that cannot be read or does not match
              raises `WeightsError` naming the trial and the artifact, and the child trains
              from scratch with that cause recorded (`inherit_refused`)
    pass over a parent whose weights could not be kept, or that a child found refused or
              missing, is passed over by evolution while another member of the population
              can be a parent (`nas.search.lineage.passed_over_key`): a child of it would
              train from scratch, to the full budget; once kept, it is a parent like any
              other
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import optuna
import torch
from optuna.artifacts import FileSystemArtifactStore, download_artifact, upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound
from optuna.trial import FrozenTrial, TrialState
from safetensors import SafetensorError, safe_open

from nas.search.lineage import passed_over, passed_over_key
from nas.settings import NasSettings
from nas.study.inheritance import save_weights

__all__ = [
    "INHERITED_COPY",
    "INHERIT_REFUSED",
    "WEIGHTS_ARTIFACT",
    "WEIGHTS_NOT_KEPT",
    "WEIGHTS_SHA256",
    "TrialWeights",
    "WeightsError",
    "artifact_store",
    "check_weights",
    "keep_weights",
    "late_weights_key",
    "machine_copies",
    "refused_weights_key",
    "sha256_of",
    "weights_file",
    "write_copy",
]

WEIGHTS_ARTIFACT = "weights_artifact"  # a trial's user attribute: its weights' artifact id
WEIGHTS_SHA256 = "weights_sha256"  # a trial's user attribute: its weights file's SHA-256
WEIGHTS_NOT_KEPT = "weights_not_kept"  # a trial's user attribute: why the store lacks them
INHERIT_REFUSED = "inherit_refused"  # a child's: why it did not take its parent's weights
# a child's: which copy of its parent's weights it took: "own" (its machine's, written or
# fetched and checked there before) or "store" (fetched now)
INHERITED_COPY = "inherited_copy"
Copy = Literal["own", "store"]
COPIES_KEPT = 64  # weights files a machine's copies hold at most, the newest (module doc)

logger = logging.getLogger(__name__)


class WeightsError(RuntimeError):
    """A trial's kept weights cannot be fetched from the store, or are damaged: `trial`'s
    weights, kept as `artifact`."""

    def __init__(self, message: str, trial: int, artifact: str) -> None:
        super().__init__(message)
        self.trial, self.artifact = trial, artifact


def artifact_store(settings: NasSettings) -> FileSystemArtifactStore:
    """The study's artifact store: `<studies_dir>/artifacts` (shared by the workers that
    share the study's storage on one machine or one file system). A folder that cannot be
    made now is logged: each weights file is then not kept, with its cause (module doc)."""
    base = Path(settings.studies_dir) / "artifacts"
    try:
        base.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        logger.warning("the artifact store %s cannot be made now: %s", base, error)
    return FileSystemArtifactStore(str(base))


def keep_weights(trial: optuna.Trial, store: FileSystemArtifactStore, path: Path) -> str:
    """Upload `path` as `trial`'s weights (before it is told), its SHA-256 recorded first
    (every copy is checked against it, module doc: copies); their artifact id."""
    trial.set_user_attr(WEIGHTS_SHA256, sha256_of(path))
    artifact = upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial)
    trial.set_user_attr(WEIGHTS_ARTIFACT, artifact)
    return artifact


def sha256_of(path: Path) -> str:
    """The SHA-256 of the file at `path`, hexadecimal."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_weights(path: Path, sha256: str | None) -> None:
    """Raise `ValueError` unless the weights file at `path` has the SHA-256 `sha256` (when
    one was recorded) and opens as the weights `save_weights` writes, every tensor read."""
    if sha256 is not None and (found := sha256_of(path)) != sha256:
        raise ValueError(f"its SHA-256 is {found[:12]}..., {sha256[:12]}... was recorded")
    try:
        with safe_open(str(path), framework="pt") as f:
            json.loads((f.metadata() or {})["keys"])
            for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                f.get_tensor(name)
    except (SafetensorError, KeyError, json.JSONDecodeError) as error:
        raise ValueError(f"it is not a whole weights file ({error})") from error


def late_weights_key(number: int) -> str:
    """The study's user attribute where trial `number`'s weights, kept after it was told,
    are found: {"artifact": id, "sha256": digest} (module doc: late)."""
    return f"weights:{number}"


def refused_weights_key(number: int) -> str:
    """The study's user attribute naming the artifact of trial `number`'s weights that a
    child refused as damaged (module doc: repair)."""
    return f"weights_refused:{number}"


def weights_file(folder: Path, number: int) -> Path:
    """Where a machine keeps trial `number`'s weights file in `folder`."""
    return folder / f"trial-{number}.safetensors"


def write_copy(state: Mapping[str, Mapping[str, torch.Tensor]], path: Path) -> dict[str, str]:
    """Write a trial's weights (`save_weights`) to this machine's copies at `path`; a disk
    that cannot take them fails no trial: what it records says why (module doc: keep)."""
    try:
        save_weights(state, path)
    except OSError as error:
        logger.warning("trial weights not written to %s: %s", path, error)
        return {WEIGHTS_NOT_KEPT: f"{type(error).__name__}: {error}"}
    return {}


def machine_copies(settings: NasSettings) -> Path:
    """The folder of this machine's copies of the study's weights (module doc: copies)."""
    return Path(settings.studies_dir) / "weights" / settings.study.name


class TrialWeights:
    """Rank 0's weights at inherited fidelity: the study's artifact store (complete trials
    keep their weights there) and this machine's copies (`copies`, default
    `machine_copies`), where each trial's weights are written and parents' fetched."""

    def __init__(self, settings: NasSettings, copies: Path | None = None) -> None:
        self._store = artifact_store(settings)
        self._folder = copies or machine_copies(settings)
        self._temporary = False
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # this worker's own folder instead, removed at its end
            self._folder, self._temporary = Path(tempfile.mkdtemp(prefix="nas-weights-")), True
            logger.warning("weights are written to %s: %s", self._folder, error)
        self._late: list[int] = []  # trials whose weights the store could not take yet
        self._taken_over = False  # the late weights of killed workers (module doc: late)
        self._copies: dict[int, Copy] = {}  # which copy each parent came from

    @property
    def not_kept(self) -> tuple[int, ...]:
        """The trials whose weights this worker still has to keep (module doc: late)."""
        return tuple(self._late)

    def file(self, number: int) -> Path:
        """Where trial `number`'s weights are written (and a parent's downloaded)."""
        return weights_file(self._folder, number)

    def copy_of(self, number: int) -> Copy:
        """Which copy of trial `number`'s weights `download` gave last (`INHERITED_COPY`)."""
        return self._copies.get(number, "store")

    def download(self, trial: FrozenTrial, late: Mapping[str, str] | None = None) -> Path | None:
        """The local file of a trial's weights: this machine's copy, or its kept weights
        (`late`: where they were kept after the trial was told) downloaded and checked once;
        None when there are none; `WeightsError` when they cannot be fetched or are damaged
        (module doc: copies, fetch)."""
        path = self.file(trial.number)
        artifact = trial.user_attrs.get(WEIGHTS_ARTIFACT)
        sha256 = trial.user_attrs.get(WEIGHTS_SHA256)
        if late is not None:  # kept after the trial was told, or kept again: the newer
            artifact, sha256 = late["artifact"], late["sha256"]
        if _is_copy(path, sha256, touch=True):  # the newest again: pruned after its child
            self._copies[trial.number] = "own"
            return path
        if artifact is None:
            return None
        part = path.with_name(f"{path.name}.part-{os.getpid()}")
        try:
            download_artifact(artifact_store=self._store, file_path=str(part), artifact_id=artifact)
            check_weights(part, sha256)
            part.replace(path)
        except (OSError, ArtifactNotFound, ValueError) as error:
            raise WeightsError(
                f"trial {trial.number}'s weights (artifact {artifact}) cannot be used: {error}",
                trial.number,
                artifact,
            ) from error
        finally:
            part.unlink(missing_ok=True)
        self._copies[trial.number] = "store"
        return path

    def keep(self, trial: optuna.Trial) -> None:
        """Keep a complete trial's weights in the store, if it wrote them; a store that
        cannot take them now is not waited for: the loss is logged and recorded on the
        trial, evolution passes it over as a parent, and the worker tries again before its
        next trial (module doc: keep, late)."""
        weights = self.file(trial.number)
        if not weights.exists():
            return
        try:
            keep_weights(trial, self._store, weights)
        except OSError as error:
            logger.warning(
                "trial %d's weights are not kept now (tried again before the next trial): %s",
                trial.number,
                error,
            )
            trial.set_user_attr(WEIGHTS_NOT_KEPT, f"{type(error).__name__}: {error}")
            self._late.append(trial.number)
            self.pass_over(trial.study, trial.number)
        self._prune()

    def refused(self, study: optuna.Study, error: WeightsError) -> None:
        """A child refused the damaged weights `error` names: say so on the study, for a
        worker with a whole copy to keep them again (module doc: repair)."""
        study.set_user_attr(refused_weights_key(error.trial), error.artifact)
        self.pass_over(study, error.trial)

    def pass_over(self, study: optuna.Study, number: int) -> None:
        """No child can start from trial `number`'s weights for now: evolution passes it
        over as a parent until they are kept again (`nas.search.lineage.passed_over_key`)."""
        study.set_user_attr(passed_over_key(number), True)

    def keep_late(self, study: optuna.Study) -> None:
        """Try the store once more with the weights it could not take, those a killed worker
        on this machine could not (module doc: late) and this machine's copies of weights
        refused as damaged (module doc: repair); those it takes now are recorded on the
        study, the others wait for the next try."""
        attrs = study.user_attrs
        for number in self._repairable(study, attrs):
            if number not in self._late:
                self._late.append(number)
        for number in list(self._late):
            path = self.file(number)
            if not path.exists():  # pruned, by another worker on this machine
                self._late.remove(number)
                continue
            try:
                digest = sha256_of(path)
                artifact = upload_artifact(
                    artifact_store=self._store, file_path=str(path), study_or_trial=study
                )
            except OSError as error:
                logger.debug("trial %d's weights are not kept yet: %s", number, error)
                continue
            study.set_user_attr(late_weights_key(number), {"artifact": artifact, "sha256": digest})
            if passed_over(attrs, number):  # its children can start from them again
                study.set_user_attr(passed_over_key(number), False)
            self._late.remove(number)
            logger.info("trial %d's weights are kept now (artifact %s)", number, artifact)

    def _repairable(self, study: optuna.Study, attrs: Mapping[str, Any]) -> list[int]:
        """The trials whose weights this machine holds a whole copy of (the SHA-256 their
        trial recorded) that no worker kept: refused as damaged and not kept again since;
        and once, when this worker starts, complete but not kept in the store."""
        local = list(self._local())
        wanted = [n for n in local if _refused_not_kept_again(attrs, n)]
        if not self._taken_over:
            self._taken_over = True
            wanted += [n for n in local if n not in wanted and late_weights_key(n) not in attrs]
        if not wanted:
            return []
        trials = {t.number: t for t in study.get_trials(deepcopy=False)}
        return [n for n in wanted if n in trials and self._whole_copy(trials[n], attrs)]

    def _whole_copy(self, trial: FrozenTrial, attrs: Mapping[str, Any]) -> bool:
        """Whether trial's weights are this machine's whole copy to keep late: it completed,
        recorded their SHA-256 and, unless a child refused them, could not keep them."""
        refused = attrs.get(refused_weights_key(trial.number)) is not None
        return (
            trial.state == TrialState.COMPLETE
            and (refused or WEIGHTS_NOT_KEPT in trial.user_attrs)
            and _is_copy(self.file(trial.number), trial.user_attrs.get(WEIGHTS_SHA256))
        )

    def _prune(self) -> None:
        """Keep the newest `COPIES_KEPT` weights files of this machine (module doc: copies)
        and every file this worker has still to keep."""
        files = sorted(self._local().items(), key=lambda item: _modified(item[1]), reverse=True)
        for number, path in files[COPIES_KEPT:]:
            if number not in self._late:
                path.unlink(missing_ok=True)

    def _local(self) -> dict[int, Path]:
        """This machine's weights files, by trial (`weights_file`'s names)."""
        return {
            int(path.stem.removeprefix("trial-")): path
            for path in self._folder.glob("trial-*.safetensors")
        }

    def remove(self) -> None:
        """Remove this worker's own folder, if it had to make one (this machine's copies
        stay: its other workers and a restarted one use them)."""
        if self._temporary:
            shutil.rmtree(self._folder, ignore_errors=True)


def _refused_not_kept_again(attrs: Mapping[str, Any], number: int) -> bool:
    refused = attrs.get(refused_weights_key(number))
    late = attrs.get(late_weights_key(number))
    return refused is not None and (late is None or late["artifact"] == refused)


def _is_copy(path: Path, sha256: str | None, touch: bool = False) -> bool:
    """Whether `path` holds the weights whose SHA-256 is `sha256` (None: none recorded);
    `touch`: if so, its time made now (the newest of the copies, `TrialWeights._prune`)."""
    try:
        if sha256 is None or sha256_of(path) != sha256:
            return False
        if touch:
            os.utime(path)
    except OSError:  # absent, or pruned meanwhile
        return False
    return True


def _modified(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
