"""Read an offline W&B run back from its `.wandb` file: config, history, summary, artifacts.

Offline runs are only a binary transaction log until `wandb sync` uploads them, and wandb
0.31 ships no Python reader for it (the old `wandb.sdk.internal.datastore` is gone; the
reader lives in the Go `wandb-core`). The tests check that what the tracker logged is what
W&B stored, and a user may want a run's curves without uploading it; so this module
decodes the file itself.

The file is LevelDB's log format with a W&B header (`nas.tracking.wandb.log_format`).

From the records: `run` (id, name, project, group, job type, tags, the initial config),
`config` updates, `history` (one row per logged step: items keyed by `key` or
`nested_key`, valued by `value_json` or the typed `none`/`boolean`/`integer`/`number`/
`text`/`json` fields), `summary` updates and removals, `metric` (a `define_metric`: step
metric, summaries, hidden), `artifact` (a logged artifact: name, type, metadata, its
manifest's files) and `exit` (the exit code). A file
whose tail is cut off (a run that crashed or is still running) reads up to its last whole
record and says so (`truncated`).

wandb is imported only inside the functions that decode protobufs, so importing this
module needs no wandb.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nas.tracking.wandb.log_format import LogScanner, WandbLogError

__all__ = [
    "MetricDefinition",
    "WandbArtifact",
    "WandbRunData",
    "file_digest",
    "find_run_files",
    "read_run",
]

INTERNAL_KEYS = ("_runtime", "_timestamp", "_wandb")  # what W&B adds to history rows


@dataclass(frozen=True)
class MetricDefinition:
    """One `define_metric` as the run stored it: `name` is the metric or the glob
    ("*", "trials/*"); `summary` the aggregations ("min", "last", ...) in W&B's order."""

    name: str
    glob: bool = False
    step_metric: str = ""
    summary: tuple[str, ...] = ()
    hidden: bool = False
    step_sync: bool = False


def file_digest(path: str | Path) -> str:
    """W&B's digest of a file in an artifact's manifest: its MD5, base64-encoded."""
    md5 = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            md5.update(block)
    return base64.b64encode(md5.digest()).decode("ascii")


@dataclass(frozen=True)
class WandbArtifact:
    """One logged artifact: `files` maps each path in it to (size in bytes, W&B's digest:
    `file_digest`)."""

    name: str
    type: str
    digest: str = ""
    metadata: dict[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    files: dict[str, tuple[int, str]] = field(default_factory=dict)

    def differences(self, folder: str | Path) -> list[str]:
        """The paths where `folder` and the artifact differ (a file in only one of them, or
        with another size or digest), sorted; [] when the artifact holds the folder as is."""
        root = Path(folder)
        here = {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()}
        return sorted(
            path
            for path in here.keys() | self.files.keys()
            if path not in here
            or path not in self.files
            or self.files[path] != (here[path].stat().st_size, file_digest(here[path]))
        )


@dataclass
class WandbRunData:
    """One run as its `.wandb` file holds it.

    `history`: one dict per logged step, in order, with W&B's own keys (`_step`,
    `_runtime`, `_timestamp`) beside the logged ones; `metrics()` leaves out all but
    `_step`. `summary` and `config`: the final values after every update. `exit_code`: None
    when the file has no exit record (the run crashed or is still running). `truncated`:
    the file ends inside a record. `metric_definitions`: the run's `define_metric`s by name
    (a later one for the same name replaces it); `artifacts`: what the run logged, in order.
    """

    path: Path  # the .wandb file
    run_id: str = ""
    name: str = ""
    project: str = ""
    entity: str = ""
    group: str = ""
    job_type: str = ""
    tags: tuple[str, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    truncated: bool = False
    metric_definitions: dict[str, MetricDefinition] = field(default_factory=dict)
    artifacts: list[WandbArtifact] = field(default_factory=list)

    @property
    def directory(self) -> Path:
        """The run's folder (what `wandb sync` takes)."""
        return self.path.parent

    def metrics(self) -> list[dict[str, Any]]:
        """The history rows with W&B's bookkeeping keys left out (`_step` kept), and the
        tracker's step metric `step` where it only repeats `_step`."""
        return [
            {
                k: v
                for k, v in row.items()
                if (k == "_step" or not k.startswith("_"))
                and not (k == "step" and v == row.get("_step"))
            }
            for row in self.history
        ]

    def table(self, key: str) -> dict[str, Any]:
        """A `wandb.Table` logged (or put in the summary) under `key`, read back from the
        run's files: {"columns": [...], "data": [[...], ...]}."""
        value = self.summary.get(key)
        if not isinstance(value, dict) or "path" not in value:
            raise KeyError(f"the run's summary has no table under {key!r}")
        path = self.directory / "files" / value["path"]
        table: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return table


def _set(target: dict[str, Any], path: Sequence[str], value: Any) -> None:
    for key in path[:-1]:
        child = target.get(key)
        if not isinstance(child, dict):
            child = target[key] = {}
        target = child
    target[path[-1]] = value


def _apply(target: dict[str, Any], updates: Iterable[Any], removals: Iterable[Any] = ()) -> None:
    """A record's updates (items with a key path and a JSON value), then its removals."""
    for item in updates:
        _set(target, _item_path(item), _item_value(item))
    for item in removals:
        _remove(target, _item_path(item))


def _remove(target: dict[str, Any], path: Sequence[str]) -> None:
    for key in path[:-1]:
        child = target.get(key)
        if not isinstance(child, dict):
            return
        target = child
    target.pop(path[-1], None)


def _item_path(item: Any) -> list[str]:
    path = list(item.nested_key) or [item.key]
    if not all(path):
        raise WandbLogError(f"an item with an empty key: {item}")
    return path


def _item_value(item: Any) -> Any:
    """An item's value: `value_json`, or (history items) the typed oneof `value`."""
    which = item.WhichOneof("value") if "value" in item.DESCRIPTOR.oneofs_by_name else None
    if which is not None:
        if which == "none":
            return None
        if which == "json":
            return json.loads(item.json)
        return getattr(item, which)
    return json.loads(item.value_json) if item.value_json else None


def read_run(path: str | Path) -> WandbRunData:
    """Decode one run: `path` is its `.wandb` file or its folder (which holds one)."""
    from wandb.proto.wandb_internal_pb2 import Record  # type: ignore[attr-defined]

    path = Path(path)
    if path.is_dir():
        files = sorted(path.glob("*.wandb"))
        if len(files) != 1:
            raise FileNotFoundError(f"{path}: expected one .wandb file, found {len(files)}")
        path = files[0]
    data = path.read_bytes()
    run = WandbRunData(path=path)
    scanner = LogScanner(data, str(path))
    for raw in scanner.records():
        record = Record()
        record.ParseFromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            info = record.run
            run.run_id = info.run_id or run.run_id
            run.name = info.display_name or run.name
            run.project = info.project or run.project
            run.entity = info.entity or run.entity
            run.group = info.run_group or run.group
            run.job_type = info.job_type or run.job_type
            if info.tags:
                run.tags = tuple(info.tags)
            _apply(run.config, info.config.update)
            _apply(run.summary, info.summary.update)
        elif kind == "config":
            _apply(run.config, record.config.update, record.config.remove)
        elif kind == "history":
            row: dict[str, Any] = {}
            for item in record.history.item:
                _set(row, _item_path(item), _item_value(item))
            if "_step" not in row and record.history.HasField("step"):
                row["_step"] = record.history.step.num
            run.history.append(row)
        elif kind == "summary":
            _apply(run.summary, record.summary.update, record.summary.remove)
        elif kind == "metric":
            definition = _metric(record.metric)
            run.metric_definitions[definition.name] = definition
        elif kind == "artifact":
            run.artifacts.append(_artifact(record.artifact))
        elif kind == "exit":
            run.exit_code = record.exit.exit_code
    run.truncated = scanner.truncated
    return run


_SUMMARIES = ("min", "max", "mean", "first", "last", "best", "none", "copy")


def _metric(record: Any) -> MetricDefinition:
    """A `MetricRecord` (a `define_metric`)."""
    summary = tuple(s for s in _SUMMARIES if getattr(record.summary, s, False))
    return MetricDefinition(
        name=record.name or record.glob_name,
        glob=not record.name,
        step_metric=record.step_metric,
        summary=summary,
        hidden=record.options.hidden,
        step_sync=record.options.step_sync,
    )


def _artifact(record: Any) -> WandbArtifact:
    """An `ArtifactRecord` (a `log_artifact`), its manifest's files included."""
    return WandbArtifact(
        name=record.name,
        type=record.type,
        digest=record.digest,
        metadata=json.loads(record.metadata) if record.metadata else {},
        aliases=tuple(record.aliases),
        files={e.path: (e.size, e.digest) for e in record.manifest.contents},
    )


def find_run_files(directory: str | Path) -> list[Path]:
    """Every run's `.wandb` file under `directory`, oldest run folder first (W&B names
    folders `<offline->run-<date>_<time>-<id>`; `latest-run` links are skipped)."""
    found = [p for p in Path(directory).rglob("*.wandb") if "latest-run" not in p.parts]
    return sorted(found, key=lambda p: (p.parent.name.split("-")[-2:-1], p.parent.name))
