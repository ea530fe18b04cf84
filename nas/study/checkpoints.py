"""A training run's checkpoints and step history, so that a run killed part way goes on.

A search trial measured at the full budget (`nas.study.candidate`, `study.checkpoint_every`)
and a retraining run (`nas.retrain`, `retrain.checkpoint_every`) are minutes of training
each; a worker killed during one would lose them all. `RunCheckpoints` keeps, in the run's
folder:

    run.json            the fingerprint the run trains under (a digest of how it trains:
                        a folder of another fingerprint is emptied, never resumed)
    history.jsonl       one line per step, appended as the step ends, before its
                        checkpoint is saved (a line cut short by a kill is left out)
    step-<8 digits>/    the newest checkpoint (`ElasticPipeline.save_checkpoint`: weights,
                        optimizer and lr schedule state, step), every `every` steps but the
                        last; the one before it is removed once it is whole

Run again with the same folder and fingerprint (a retraining started again, a trial's retry
after its worker died), the run resumes from the newest checkpoint, on a new pipeline or a
reconfigured one (`options()`: `CheckpointOptions(resume_from=...)`), with its history up to
that step (the history file is cut back to it: later steps are trained again). Its owner
removes the folder once the finished run is recorded (`remove`).

Every method runs on every rank, in order; rank 0 alone touches the files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nas.study.phases import Phase, timed
from pipeline import CheckpointOptions, ElasticPipeline
from pipeline.distributed.comm import Comm
from pipeline.pure.checkpoint_format import checkpoint_name

__all__ = ["RunCheckpoints", "fingerprint", "plain", "write_whole"]

logger = logging.getLogger(__name__)
_STAMP, _HISTORY = "run.json", "history.jsonl"


class RunCheckpoints:
    """One run of `steps` steps trained as `digest` says: its checkpoints and step history
    in `folder` (module doc); `every` None or 0: none (the run starts from scratch, as
    without this). `label` names the run in the log ("trial 7", "retrain m seed 1")."""

    def __init__(
        self, folder: Path, digest: str, every: int | None, steps: int, *, label: str
    ) -> None:
        self.folder, self.digest, self.every, self.steps = folder, digest, every, steps
        self.label = label
        self._history: list[dict[str, Any]] = []

    def options(self) -> CheckpointOptions | None:
        """The pipeline's `checkpoint=` (built new or reconfigured): resume from the newest
        checkpoint here; None when there is none (the run starts from scratch). Rank 0
        reads what an unfinished earlier run left (`_found`); every rank learns it."""
        if not self.every:
            return None
        self._history, newest = Comm().agree(self._found)
        return None if newest is None else CheckpointOptions(resume_from=newest)

    def resumed(self, pipe: ElasticPipeline) -> tuple[int, list[dict[str, Any]]]:
        """The step the built pipeline goes on from (0: from scratch) and the run's history
        up to it (the history file is cut back to it: later steps are trained again)."""
        start = pipe.step
        history = [entry for entry in self._history if entry["step"] <= start]
        if self.every and pipe.rank == 0:
            write_whole(self.folder / _HISTORY, "".join(_line(entry) for entry in history))
        if start and pipe.rank == 0:
            logger.info(
                "%s: resumed from its checkpoint at step %d (%d history steps)",
                self.label,
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
        with timed(Phase.CHECKPOINT):
            if pipe.rank == 0:
                with (self.folder / _HISTORY).open("a", encoding="utf-8") as file:
                    file.write(_line(entry))
            if pipe.step % self.every == 0 and pipe.step < self.steps:
                saved = pipe.save_checkpoint(self.folder / checkpoint_name(pipe.step))
                if pipe.rank == 0:
                    for path in self.folder.glob("step-*"):
                        if path != saved and path.is_dir():
                            shutil.rmtree(path, ignore_errors=True)

    def remove(self) -> None:
        """(Rank 0) The run is recorded: nothing of it is left to resume."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def _found(self) -> tuple[list[dict[str, Any]], str | None]:
        """(Rank 0) The history an unfinished run trained as `digest` logged and its newest
        checkpoint, kept to resume from; anything else here is removed: ([], None)."""
        try:
            stamp = json.loads((self.folder / _STAMP).read_text())
        except (OSError, ValueError):
            stamp = None
        if isinstance(stamp, dict) and stamp.get("fingerprint") == self.digest:
            saved = sorted(p for p in self.folder.glob("step-*") if p.is_dir())
            newest = str(saved[-1]) if saved else None
            return _read_history(self.folder / _HISTORY), newest
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        write_whole(self.folder / _STAMP, json.dumps({"fingerprint": self.digest}))
        return [], None


def fingerprint(architecture: str, steps: int, training: Mapping[str, Any]) -> str:
    """What makes two runs of one model and seed the same run: a digest of how it trains."""
    document = json.dumps(
        {"architecture": architecture, "steps": steps, **training}, sort_keys=True, default=str
    )
    return hashlib.sha256(document.encode()).hexdigest()[:16]


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` beside, then rename it into place (a kill leaves no half)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)


def plain(value: Any) -> Any:
    """JSON for what a run's record holds besides JSON types (numpy and torch scalars):
    `json.dumps(..., default=plain)`."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"a run's record cannot hold {type(value).__name__}")


def _line(entry: Mapping[str, Any]) -> str:
    return json.dumps(dict(entry), default=plain) + "\n"


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
