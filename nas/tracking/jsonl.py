"""A local mirror of everything tracked, as JSON lines: readable with no service and no login.

W&B runs offline by default and its files are a binary log; this mirror is the plain-text
record of a study that `grep`, `jq` and pandas read directly, and the one the tests compare
W&B against. One file per study, `<directory>/<study name>.jsonl` (every trial of the study
in order, so one file answers "what happened in this study"; a resumed study appends to the
same file). Each line is one record, written with a single `write` call on a file opened
for appending, so a crash loses at most the record being written and several processes can
append to one study's file.

Records (keys in this order; "time" is the Unix time of writing)::

    {"kind": "study_start", "study", "time", "config"}
    {"kind": "trial_start", "study", "trial", "time", "params", "config"}
    {"kind": "step",        "study", "trial", "step", "time", "metrics"}
    {"kind": "event",       "study", "trial", "step", "time", "event"}
    {"kind": "model",       "study", "trial", "time", "name", "folder", "files", "metadata"}
    {"kind": "trial_end",   "study", "trial", "time", "state", "error", "summary"}
    {"kind": "study_end",   "study", "time", "trials", "pareto_front", "summary"}

The records of a run that is not a search trial (a retrain run: its `trial_start` config has
`job_type`) carry that as `"job"` after `"trial"`, so a reader tells them apart from the
trials with the same index. A `model` record is an exported model logged in the run
(`log_model`): its folder (absolute) and its files as {relative path: bytes}. A run's id
(`run_id`) is `<study>/<run name>`: the run name is the `run_name` of its `trial_start`
config, else `trial-<number>`, so it is stable and names one run of the file. Values are
strict JSON (`json_safe`): tuples become lists, NaN and infinities null. Step metrics leave
out None values (not measured), so a null among a step's metrics is a non-finite number.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nas.tracking.base import Metrics, Rows, Summary, TrialEnd, clean_metrics, json_safe
from nas.tracking.lifecycle import LifecycleTracker

__all__ = ["RECORD_KINDS", "JsonlTracker", "read_jsonl", "study_file_name"]

RECORD_KINDS = ("study_start", "trial_start", "step", "event", "model", "trial_end", "study_end")


def study_file_name(study_name: str) -> str:
    """The file a study's records go to: its name with anything but letters, digits, '.',
    '_' and '-' replaced by '_', plus '.jsonl'."""
    if not isinstance(study_name, str) or not study_name.strip():
        raise ValueError(f"a study name must be a non-empty string, got {study_name!r}")
    return re.sub(r"[^A-Za-z0-9._-]", "_", study_name.strip()) + ".jsonl"


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a JSON-lines file, in order; an incomplete last line (a crash while
    writing it) is left out."""
    text = Path(path).read_text(encoding="utf-8")
    lines = text.split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number == len(lines) - 1:  # the unterminated tail
                break
            raise
    return records


class JsonlTracker(LifecycleTracker):
    """Writes every tracked call as one JSON line to `<directory>/<study>.jsonl` (module doc).

    `fsync=True` also forces each line to disk (survives a machine crash, not only a
    process crash; slower).
    """

    def __init__(self, directory: str | Path, *, fsync: bool = False) -> None:
        self.directory = Path(directory)
        self.fsync = fsync
        self.path: Path | None = None  # the study's file, once the study started
        self._fd: int | None = None
        self._job: str | None = None  # "retrain" while such a run is open
        self._run_id: str | None = None  # the open run's `<study>/<run name>`

    # -- writing ------------------------------------------------------------------------------
    def _write(self, kind: str, **fields: Any) -> None:
        assert self._fd is not None and self._study is not None  # the lifecycle's checks
        record = {"kind": kind, "study": self._study, **fields}
        if "trial" in fields and self._job is not None:
            record = {
                **dict(list(record.items())[:3]),
                "job": self._job,
                **dict(list(record.items())[3:]),
            }
        line = json.dumps(json_safe(record), allow_nan=False, ensure_ascii=False) + "\n"
        data = line.encode("utf-8")
        while data:  # one write for a whole line in practice; loop on a short write
            written = os.write(self._fd, data)
            data = data[written:]
        if self.fsync:
            os.fsync(self._fd)

    # -- the lifecycle (checked by LifecycleTracker) ---------------------------------------------
    def _on_start_study(self, study_name: str, config: Mapping[str, Any]) -> None:
        name = study_file_name(study_name)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / name
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._write("study_start", time=time.time(), config=config)

    def _on_start_trial(
        self, number: int, params: Mapping[str, Any], config: Mapping[str, Any]
    ) -> None:
        job = config.get("job_type")
        self._job = None if job in (None, "trial") else str(job)
        self._run_id = f"{self._study}/{config.get('run_name', f'trial-{number}')}"
        self._write("trial_start", trial=number, time=time.time(), params=params, config=config)

    def _on_step(self, step: int, metrics: Metrics) -> None:
        self._write(
            "step", trial=self._trial, step=step, time=time.time(), metrics=clean_metrics(metrics)
        )

    def _on_event(self, step: int, event: Mapping[str, Any]) -> None:
        self._write("event", trial=self._trial, step=step, time=time.time(), event=event)

    def _on_model(self, name: str, folder: Path, metadata: Mapping[str, Any]) -> None:
        files = {
            path.relative_to(folder).as_posix(): path.stat().st_size
            for path in sorted(folder.rglob("*"))
            if path.is_file()
        }
        self._write(
            "model",
            trial=self._trial,
            time=time.time(),
            name=name,
            folder=str(folder.resolve()),
            files=files,
            metadata=metadata,
        )

    @property
    def run_id(self) -> str | None:
        """`<study>/<run name>` of the open run (module doc); None outside a run."""
        return self._run_id if self._trial is not None else None

    def _on_end_trial(self, state: TrialEnd, summary: Summary, error: str | None) -> None:
        try:
            self._write(
                "trial_end",
                trial=self._trial,
                time=time.time(),
                state=state,
                error=error,
                summary=summary,
            )
        finally:
            self._job = self._run_id = None

    def _on_end_study(self, trials_table: Rows, pareto_front: Rows, summary: Summary) -> None:
        try:
            self._write(
                "study_end",
                time=time.time(),
                trials=list(trials_table),
                pareto_front=list(pareto_front),
                summary=summary,
            )
        finally:
            self._on_close()

    def _on_close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
        self._fd = None
