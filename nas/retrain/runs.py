"""Finished retraining runs kept on disk, so that a stopped retraining resumes where it stopped.

Retraining trains every chosen model once per training seed at the full budget: tens of
minutes on a small machine. A run that finished is written beside its model's export,

    <retrain.models_dir>/<study>/<model>/runs/seed-<seed>.json

after the export was brought up to date (the model's best seed so far is exported as soon
as it is known), so a retraining killed at any point leaves every recorded run's weights
behind it. Run again, the retraining reads the records back and trains only the runs that
are missing. A record is reused only when it was trained the same way: the same
architecture, steps, training settings and task (its `fingerprint`); anything else is
trained again. Records are plain JSON (the run's figures and history), written whole and
renamed into place, so a crash mid-write leaves no half record.

A run that has not finished yet resumes too (`retrain.checkpoint_every`; `RunCheckpoints`,
on every rank): every N steps the pipeline is saved (weights, optimizer and lr schedule,
step; `ElasticPipeline.save_checkpoint`) into

    <retrain.models_dir>/<study>/<model>/checkpoints/seed-<seed>/step-<8 digits>/

(but not at the run's last step: the finished run is recorded instead) and the
checkpoint before removed, beside `run.json` (the fingerprint the run trains under:
checkpoints of another fingerprint are removed, never resumed) and `history.jsonl` (one line
per step, appended as the step ends, before its checkpoint is saved). Run again, the run
resumes from its newest checkpoint (the runtime's `resume_from="latest"`) with its history up
to that step; the folder is deleted once the finished run is recorded (`save`).

Several workers retraining one study at once train each run once: a run is claimed beside
its record (`runs/seed-<seed>.claim`) before it trains (`nas.retrain.claims`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline import CheckpointOptions, ElasticPipeline
from pipeline.distributed.comm import Comm
from pipeline.pure.checkpoint_format import checkpoint_name

__all__ = [
    "RunCheckpoints",
    "checkpoint_folder",
    "fingerprint",
    "load",
    "mark_tracked",
    "record_path",
    "save",
]

logger = logging.getLogger(__name__)
_STAMP, _HISTORY = "run.json", "history.jsonl"  # in a run's checkpoint folder


def fingerprint(architecture: str, steps: int, training: Mapping[str, Any]) -> str:
    """What makes two runs of one model and seed the same run: a digest of how it trains."""
    document = json.dumps(
        {"architecture": architecture, "steps": steps, **training}, sort_keys=True, default=str
    )
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def record_path(model_folder: Path, seed: int) -> Path:
    return model_folder / "runs" / f"seed-{seed}.json"


def save(
    model_folder: Path, seed: int, digest: str, run: Mapping[str, Any], *, tracked: bool = False
) -> Path:
    """Write one finished run's record (atomically: written beside, then renamed);
    `tracked`: whether its tracker run was written already."""
    path = record_path(model_folder, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".json.partial")
    record = {"fingerprint": digest, "tracked": tracked, "run": dict(run)}
    partial.write_text(json.dumps(record, default=_plain))
    os.replace(partial, path)
    _remove_checkpoints(model_folder, seed)  # finished and recorded: nothing to resume
    return path


def load(model_folder: Path, seed: int, digest: str) -> tuple[dict[str, Any], bool] | None:
    """The recorded run of this model and seed, and whether it was tracked, if it was
    trained as `digest` says; None when there is none, it was trained otherwise, or it
    cannot be read."""
    path = record_path(model_folder, seed)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("fingerprint") != digest:
        return None
    run = record.get("run")
    return (run, bool(record.get("tracked"))) if isinstance(run, dict) else None


def mark_tracked(model_folder: Path, seed: int, digest: str) -> None:
    """Note that the recorded run's tracker run was written (a resumed retraining skips it)."""
    found = load(model_folder, seed, digest)
    if found is not None:
        save(model_folder, seed, digest, found[0], tracked=True)


def checkpoint_folder(model_folder: Path, seed: int) -> Path:
    """Where the unfinished run of this model and seed keeps its checkpoints (module doc)."""
    return model_folder / "checkpoints" / f"seed-{seed}"


class RunCheckpoints:
    """One (model, seed) run of `steps` steps: its checkpoints and step history, on every
    rank (module doc); `every` None or 0: none (the run starts from scratch, as without
    this). None is saved at the last step: the run is recorded then, and its checkpoints
    deleted."""

    def __init__(
        self, model_folder: Path, seed: int, digest: str, every: int | None, steps: int
    ) -> None:
        self.folder = checkpoint_folder(model_folder, seed)
        self.model, self.seed, self.digest, self.every = model_folder.name, seed, digest, every
        self.steps = steps
        self._history: list[dict[str, Any]] = []

    def options(self) -> CheckpointOptions | None:
        """The pipeline's `checkpoint=`, before it is built: resume from the newest checkpoint
        here. Rank 0 reads what an unfinished earlier run left (`_found`); every rank learns
        its history."""
        if not self.every:
            return None
        self._history = Comm().agree(self._found)
        return CheckpointOptions(directory=self.folder, resume_from="latest")

    def resumed(self, pipe: ElasticPipeline) -> tuple[int, list[dict[str, Any]]]:
        """The step the built pipeline goes on from (0: from scratch) and the run's history
        up to it (the history file is cut back to it: later steps are trained again)."""
        start = pipe.step
        history = [entry for entry in self._history if entry["step"] <= start]
        if self.every and pipe.rank == 0:
            _write_whole(self.folder / _HISTORY, "".join(_line(entry) for entry in history))
        if start and pipe.rank == 0:
            logger.info(
                "retrain %s seed %d: resumed from its checkpoint at step %d (%d history steps)",
                self.model,
                self.seed,
                start,
                len(history),
            )
        return start, history

    def stepped(self, pipe: ElasticPipeline, entry: Mapping[str, Any]) -> None:
        """After each step, its history `entry` complete: rank 0 logs it; every `every` steps
        but the last every rank saves the pipeline (not the runtime's own `every`, which would
        save before the entry is logged), then rank 0 removes the checkpoint before."""
        if not self.every:
            return
        if pipe.rank == 0:
            with (self.folder / _HISTORY).open("a", encoding="utf-8") as file:
                file.write(_line(entry))
        if pipe.step % self.every == 0 and pipe.step < self.steps:
            saved = pipe.save_checkpoint(self.folder / checkpoint_name(pipe.step))
            if pipe.rank == 0:
                for path in self.folder.glob("step-*"):
                    if path != saved and path.is_dir():
                        shutil.rmtree(path, ignore_errors=True)

    def _found(self) -> list[dict[str, Any]]:
        """(Rank 0) The history an unfinished run trained as `digest` logged, its checkpoints
        kept to resume from; anything else here is removed, and [] returned."""
        try:
            stamp = json.loads((self.folder / _STAMP).read_text())
        except (OSError, ValueError):
            stamp = None
        if isinstance(stamp, dict) and stamp.get("fingerprint") == self.digest:
            return _read_history(self.folder / _HISTORY)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        _write_whole(self.folder / _STAMP, json.dumps({"fingerprint": self.digest}))
        return []


def _line(entry: Mapping[str, Any]) -> str:
    return json.dumps(dict(entry), default=_plain) + "\n"


def _read_history(path: Path) -> list[dict[str, Any]]:
    """The entries of a history file, in order; a line cut short by a kill is left out."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    entries = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and isinstance(entry.get("step"), int):
            entries.append(entry)
    return entries


def _remove_checkpoints(model_folder: Path, seed: int) -> None:
    folder = checkpoint_folder(model_folder, seed)
    shutil.rmtree(folder, ignore_errors=True)
    if folder.parent.is_dir() and not any(folder.parent.iterdir()):
        # the model's last unfinished run (unless another worker starts one: it stays)
        with contextlib.suppress(OSError):
            folder.parent.rmdir()


def _write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` beside, then rename it into place."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def _plain(value: Any) -> Any:
    """JSON for what a run holds besides JSON types (numpy and torch scalars)."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a retraining record cannot hold {type(value).__name__}")
