"""A child takes trained weights: from a stage process's memory, or from the study's store.

A study inherits weights one of two ways (`nas.settings.study` refuses both at once):

1. `study.inherit_weights=true` (vPipe's incremental candidates): a candidate's layers that
   share a key with the trial it came from keep that trial's trained weights, tensor by
   tensor where names and shapes match, migrated to wherever the new plan puts them,
   instead of starting from scratch; when that trial is its evolution parent, the tensors
   its one edit touches start afresh (`search_spaces.edited`). The trial it came from is
   the evolution parent when the sampler names one, else the previous trial this worker
   trained. Every stage process keeps a `WeightBank`: a `pipeline.WeightSnapshot` of its
   own layers per recently trained trial (complete or pruned), at most `keep` of them,
   oldest dropped first. The bank's contents are the same list of trial numbers on every
   rank (each rank adds after every trained trial), so every rank picks the same source
   without a message.
2. `study.fidelity=inherited` (`nas.study.judging`): every complete trial keeps its final
   weights (one safetensors file of the whole model, `save_weights`) in Optuna's artifact
   store (`FileSystemArtifactStore` at `<studies_dir>/artifacts`), its id in the trial's
   `weights_artifact` attribute, so any worker on the study's storage finds them, after a
   restart too (`TrialWeights`); a child's stage processes load its parent's
   (`load_snapshot`).

Either way, a trial that started from another's weights says which (`inherited_attrs`).

The store is a folder that can fail like any other (`benchmarks/soak.py` makes it so): a
disk that fills, a folder made read-only, a file truncated or changed after it was written.
None of these stops a study:

    keep      a weights file that the store cannot take now (full, read-only) is not
              waited for, since the worker would idle for as long as the outage lasts: it
              is logged and recorded on its trial (`weights_not_kept`), the trial completes,
              and evolution passes it over as a parent until it is kept (pass over)
    late      the worker keeps the file and tries the store again before each of its next
              trials (`keep_late`); once it takes them, the study records where (its user
              attribute `weights:<trial>`: artifact and SHA-256) and every worker's children
              of that trial inherit again; meanwhile this worker's children use its own copy
    repair    a child that refused its parent's damaged weights says so on the study
              (`weights_refused:<trial>`: the artifact); a worker holding a whole copy of
              them (it wrote them, or fetched and checked them before the damage) keeps
              that copy again before its next trial, as late weights, which every worker
              prefers from then on
    fetch     a parent's file is downloaded beside its final name and moved there once
              whole, then checked against the SHA-256 recorded when it was kept
              (`weights_sha256`) and opened; one that cannot be read or does not match
              raises `WeightsError` naming the trial and the artifact, and the child trains
              from scratch with that cause recorded (`inherit_refused`); a worker that
              wrote or fetched a trial's file already uses that copy
    pass over a parent whose weights could not be kept, or that a child found refused or
              missing, is passed over by evolution while another member of its tournament
              can be a parent (`nas.search.lineage.passed_over_key`): a child of it would
              train from scratch, to the full budget; once kept, it is a parent like any
              other
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.artifacts import FileSystemArtifactStore, download_artifact, upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from nas.search.lineage import passed_over, passed_over_key
from nas.settings import NasSettings
from pipeline import ElasticPipeline, WeightSnapshot

__all__ = [
    "INHERITED_COPY",
    "INHERITED_FROM",
    "INHERIT_REFUSED",
    "WEIGHTS_ARTIFACT",
    "WEIGHTS_NOT_KEPT",
    "WEIGHTS_SHA256",
    "TrialWeights",
    "WeightBank",
    "WeightsError",
    "artifact_store",
    "check_weights",
    "inherited_attrs",
    "keep_weights",
    "late_weights_key",
    "load_snapshot",
    "refused_weights_key",
    "save_weights",
    "sha256_of",
    "weights_file",
]

INHERITED_FROM = "inherited_from"  # a trial's user attribute: the trial whose weights it took
WEIGHTS_ARTIFACT = "weights_artifact"  # a trial's user attribute: its weights' artifact id
WEIGHTS_SHA256 = "weights_sha256"  # a trial's user attribute: its weights file's SHA-256
WEIGHTS_NOT_KEPT = "weights_not_kept"  # a trial's user attribute: why the store lacks them
INHERIT_REFUSED = "inherit_refused"  # a child's: why it did not take its parent's weights
# a child's: which copy of its parent's weights it took: "own" (its worker wrote or fetched
# and checked them before) or "store" (fetched now)
INHERITED_COPY = "inherited_copy"
_SEPARATOR = "::"  # layer key and tensor name in a flat safetensors name

logger = logging.getLogger(__name__)


class WeightsError(RuntimeError):
    """A trial's kept weights cannot be fetched from the store, or are damaged: `trial`'s
    weights, kept as `artifact`."""

    def __init__(self, message: str, trial: int, artifact: str) -> None:
        super().__init__(message)
        self.trial, self.artifact = trial, artifact


def inherited_attrs(source: int, fresh_tensors: int | None = None) -> dict[str, Any]:
    """What a trial that started from trial `source`'s weights records; `fresh_tensors`:
    how many of its tensors started afresh instead (its edit's, where counted)."""
    attrs: dict[str, Any] = {INHERITED_FROM: source}
    if fresh_tensors is not None:
        attrs["inherited_fresh_tensors"] = fresh_tensors
    return attrs


class WeightBank:
    """The weights of the last `keep` trained trials, this rank's layers of each."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"a weight bank must keep at least one trial, got keep={keep}")
        self.keep = keep
        self._kept: OrderedDict[int, WeightSnapshot] = OrderedDict()

    @property
    def numbers(self) -> list[int]:
        """The trials kept, oldest first."""
        return list(self._kept)

    def source(self, parent: int | None) -> int | None:
        """The trial to start from: `parent` if kept, else the last trial trained, if any."""
        if parent is not None and parent in self._kept:
            return parent
        return next(reversed(self._kept), None)

    def get(self, number: int | None) -> WeightSnapshot | None:
        return None if number is None else self._kept.get(number)

    def inherited(
        self, number: int | None, parent: int | None, edited: tuple[str, ...]
    ) -> WeightSnapshot | None:
        """What a child of `parent` whose edit touches the tensors `edited` starts from when
        it inherits from trial `number`: its weights, tensor by tensor where names and shapes
        match, less the edited tensors when `number` is its parent (they start afresh, as
        from scratch)."""
        kept = self.get(number)
        if kept is None or number != parent or not edited:
            return kept
        return kept.without(edited)

    def add(self, number: int, pipe: ElasticPipeline) -> None:
        """Keep the weights `pipe` holds now as trial `number`'s (on every rank)."""
        self.put(number, pipe.snapshot())

    def put(self, number: int, snapshot: WeightSnapshot) -> None:
        """Keep `snapshot` (this rank's part of it) as trial `number`'s weights: a trial on
        the stage pool starts from what its job took there (`nas.study.pooled`)."""
        self._kept[number] = snapshot
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)


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


def save_weights(state: Mapping[str, Mapping[str, torch.Tensor]], path: Path) -> Path:
    """`{layer key: state dict}` (`ElasticPipeline.full_state_dict`) as one safetensors file,
    the layer order in its metadata."""
    flat = {
        f"{key}{_SEPARATOR}{name}": tensor.detach().cpu().contiguous().clone()
        for key, layer in state.items()
        for name, tensor in layer.items()
    }
    save_file(flat, str(path), metadata={"keys": json.dumps(list(state))})
    return path


def load_snapshot(path: str | Path, rank: int, world_size: int) -> WeightSnapshot:
    """A `WeightSnapshot` of the weights in `path` for the pipeline's rank `rank`: as if
    stage 0 held every layer (it sends each to its owner when a model inherits them)."""
    with safe_open(str(path), framework="pt") as f:
        keys = tuple(json.loads((f.metadata() or {})["keys"]))
        states: dict[str, dict[str, torch.Tensor]] = {}
        if rank == 0:
            states = {key: {} for key in keys}
            for flat in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                key, name = flat.split(_SEPARATOR, 1)
                states[key][name] = f.get_tensor(flat)
    sizes = (len(keys),) + (0,) * (world_size - 1)
    return WeightSnapshot(keys, sizes, states)


def keep_weights(trial: optuna.Trial, store: FileSystemArtifactStore, path: Path) -> str:
    """Upload `path` as `trial`'s weights (before it is told), its SHA-256 beside; its
    artifact id."""
    digest = sha256_of(path)
    artifact = upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=trial)
    trial.set_user_attr(WEIGHTS_SHA256, digest)
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
    """Where a worker keeps trial `number`'s weights file in `folder`."""
    return folder / f"trial-{number}.safetensors"


class TrialWeights:
    """Rank 0's weights at inherited fidelity: the study's artifact store (complete trials
    keep their weights there) and a local folder where each trial's weights are written,
    and parents' downloaded, until `remove`."""

    def __init__(self, settings: NasSettings) -> None:
        self._store = artifact_store(settings)
        self._folder = Path(tempfile.mkdtemp(prefix="nas-weights-"))
        self._late: list[int] = []  # trials whose weights the store could not take yet

    @property
    def not_kept(self) -> tuple[int, ...]:
        """The trials whose weights this worker still has to keep (module doc: late)."""
        return tuple(self._late)

    def file(self, number: int) -> Path:
        """Where trial `number`'s weights are written (and a parent's downloaded)."""
        return weights_file(self._folder, number)

    def copy_of(self, number: int) -> str:
        """Which copy of trial `number`'s weights `download` gives (`INHERITED_COPY`)."""
        return "own" if self.file(number).exists() else "store"

    def download(
        self, trial: optuna.trial.FrozenTrial, late: Mapping[str, str] | None = None
    ) -> Path | None:
        """The local file of a trial's weights: this worker's own copy, or its kept weights
        (`late`: where they were kept after the trial was told) downloaded and checked once;
        None when there are none; `WeightsError` when they cannot be fetched or are damaged
        (module doc: fetch)."""
        path = self.file(trial.number)
        if path.exists():
            return path
        artifact = trial.user_attrs.get(WEIGHTS_ARTIFACT)
        sha256 = trial.user_attrs.get(WEIGHTS_SHA256)
        if late is not None:  # kept after the trial was told, or kept again: the newer
            artifact, sha256 = late["artifact"], late["sha256"]
        if artifact is None:
            return None
        part = path.with_name(path.name + ".part")
        part.unlink(missing_ok=True)
        try:
            download_artifact(artifact_store=self._store, file_path=str(part), artifact_id=artifact)
            check_weights(part, sha256)
        except (OSError, ArtifactNotFound, ValueError) as error:
            part.unlink(missing_ok=True)
            raise WeightsError(
                f"trial {trial.number}'s weights (artifact {artifact}) cannot be used: {error}",
                trial.number,
                artifact,
            ) from error
        part.replace(path)
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
        """Try the store once more with the weights it could not take (module doc: late)
        and with this worker's copies of weights refused as damaged (module doc: repair);
        those it takes now are recorded on the study, the others wait for the next try."""
        attrs = study.user_attrs
        for number in self._repairable(attrs):
            if number not in self._late:
                self._late.append(number)
        for number in list(self._late):
            path = self.file(number)
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

    def _repairable(self, attrs: Mapping[str, Any]) -> list[int]:
        """The trials whose weights a child refused as damaged, not kept again since, of
        which this worker holds a whole copy."""
        found = []
        for path in self._folder.glob("trial-*.safetensors"):
            number = int(path.stem.removeprefix("trial-"))
            refused = attrs.get(refused_weights_key(number))
            late = attrs.get(late_weights_key(number))
            if refused is not None and (late is None or late["artifact"] == refused):
                found.append(number)
        return found

    def remove(self) -> None:
        """Remove the local folder (the store keeps what counts)."""
        shutil.rmtree(self._folder, ignore_errors=True)
