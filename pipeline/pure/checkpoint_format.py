"""What a pipeline checkpoint holds and how its entries are named: the part without files.

A checkpoint is a folder (`pipeline.distributed.checkpoint` writes it):

    <name>/
        .metadata, __<rank>_0.distcp   torch Distributed Checkpoint: every rank wrote its own
                                       layers' tensors (weights, buffers, optimizer state,
                                       2BW's older weight version) and small per-layer
                                       objects (parameter-group settings, the layer's lr
                                       scheduler state) as one shard file per rank
        pipeline.json                  the `Manifest` below, written last: step, seed, layer
                                       keys, the plan in force, the cost cache, and the size
                                       and CRC-32 of every file

Entries are keyed by LAYER KEY, never by position or rank, so a checkpoint taken under one
partition, schedule or number of ranks resumes under any other: each rank loads the keys
it holds then. An entry's name is ``layers/<key>/<part>[/<tail>]`` with the key
percent-quoted (so it holds no "/"), `part` one of `PARTS`, and the tail the rest (a
parameter or buffer name, which may hold dots): `entry_name` and `split_entry` are
inverses. Names are plain strings, so torch's own tools
(`torch.distributed.checkpoint.FileSystemReader(path).read_metadata()`,
`torch.distributed.checkpoint.format_utils.dcp_to_torch_save`) list and read them.

Auto-saved checkpoints live in one directory as ``step-<8 digits>`` folders; a save goes
to a hidden sibling ``.<name>.partial`` and is renamed into place when whole, so a folder
with a visible name and a `pipeline.json` is complete (`newest`, `expired` choose among
names). Everything here is a function of its arguments (no torch, no file access).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import zip_longest
from typing import Any, Literal, get_args
from urllib.parse import quote, unquote

from pipeline.errors import PipelineError

__all__ = [
    "FORMAT",
    "MANIFEST",
    "PARTS",
    "VERSION",
    "CheckpointError",
    "FileRecord",
    "Manifest",
    "Part",
    "check_same_model",
    "checkpoint_name",
    "entry_name",
    "expired",
    "layer_prefix",
    "newest",
    "partial_name",
    "split_entry",
    "step_of",
]

FORMAT, VERSION = "elastic-nas-pipeline-checkpoint", 1
MANIFEST = "pipeline.json"  # the manifest's file name inside a checkpoint folder
Part = Literal["module", "optimizer", "group", "lr_scheduler", "previous"]
PARTS: tuple[str, ...] = get_args(Part)
_PREFIX = "layers"
_NAME = re.compile(r"^step-(\d{8,})$")


class CheckpointError(PipelineError):
    """A checkpoint cannot be written or read: a file missing or corrupt, another model's
    checkpoint, a failed write (the previous checkpoint stays whole). Raised on every rank."""


# -- entry names ---------------------------------------------------------------------------
def layer_prefix(key: str) -> str:
    """The prefix of every entry of layer `key` (ends with "/")."""
    return f"{_PREFIX}/{quote(key, safe='')}/"


def entry_name(key: str, part: Part, tail: str = "") -> str:
    """The entry of layer `key`'s `part` (and `tail`: a tensor's name inside it)."""
    if part not in PARTS:
        raise ValueError(f"unknown checkpoint part {part!r}; valid: {PARTS}")
    return layer_prefix(key) + part + (f"/{tail}" if tail else "")


def split_entry(name: str) -> tuple[str, str, str]:
    """(layer key, part, tail) of an entry name ("" tail for whole-part entries)."""
    pieces = name.split("/", 3)
    if len(pieces) < 3 or pieces[0] != _PREFIX or pieces[2] not in PARTS:
        raise ValueError(f"{name!r} is not a layer entry of a pipeline checkpoint")
    return unquote(pieces[1]), pieces[2], pieces[3] if len(pieces) == 4 else ""


# -- the manifest --------------------------------------------------------------------------
@dataclass(frozen=True)
class FileRecord:
    """One file of a checkpoint folder: its size and CRC-32, checked before it is read."""

    bytes: int
    crc32: int


@dataclass(frozen=True)
class Manifest:
    """`pipeline.json`: everything a resume needs besides the tensors (module doc).

    Dropout needs no random-number state: its masks are a pure function of (seed, step,
    micro-batch, layer key) (`pipeline.local.determinism`), so `seed` and `step` restore it.
    """

    step: int  # training steps applied when saved
    seed: int
    layers: tuple[str, ...]  # the model's layer keys, in order
    actions: tuple[str, ...]  # each layer's memory action when saved
    sizes: tuple[int, ...]  # layers per stage when saved
    schedule: str  # the schedule's name
    stages_per_rank: int
    n_ranks: int
    n_microbatches: int
    handoff: tuple[int, ...] = ()  # Bi-Partition's cut in force
    plan: Mapping[str, Any] | None = None  # `Plan.to_dict()` of the plan in force
    owners: Mapping[str, int] = field(default_factory=dict)  # layer key -> rank that wrote it
    lr_scheduler: bool = False  # whether each layer's entries hold an lr scheduler state
    versions: str | None = None  # what "previous" entries hold: "2bw", "pipemare" or none
    cost_cache: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    files: Mapping[str, FileRecord] = field(default_factory=dict)
    torch_version: str = ""

    def __post_init__(self) -> None:
        if len(self.actions) != len(self.layers) or sum(self.sizes) != len(self.layers):
            raise ValueError(
                f"a manifest of {len(self.layers)} layers has {len(self.actions)} memory "
                f"actions and stage sizes {list(self.sizes)}"
            )
        if self.step < 0:
            raise ValueError(f"a manifest's step must be >= 0, got {self.step}")

    @property
    def n_stages(self) -> int:
        return len(self.sizes)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values, with the format's name and version."""
        return {
            "format": FORMAT,
            "version": VERSION,
            "step": self.step,
            "seed": self.seed,
            "layers": list(self.layers),
            "actions": list(self.actions),
            "sizes": list(self.sizes),
            "schedule": self.schedule,
            "stages_per_rank": self.stages_per_rank,
            "n_ranks": self.n_ranks,
            "n_microbatches": self.n_microbatches,
            "handoff": list(self.handoff),
            "plan": None if self.plan is None else dict(self.plan),
            "owners": dict(self.owners),
            "lr_scheduler": self.lr_scheduler,
            "versions": self.versions,
            "cost_cache": {k: dict(v) for k, v in self.cost_cache.items()},
            "files": {n: {"bytes": r.bytes, "crc32": r.crc32} for n, r in self.files.items()},
            "torch_version": self.torch_version,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str) -> Manifest:
        """The manifest in `data` (parsed JSON); `CheckpointError` naming `where` if it is
        not one of this format and version."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CheckpointError(f"{where} is not a pipeline checkpoint manifest")
        if data.get("version") != VERSION:
            raise CheckpointError(
                f"{where} has checkpoint format version {data.get('version')!r}; this "
                f"runtime reads version {VERSION}"
            )
        try:
            return cls(
                step=int(data["step"]),
                seed=int(data["seed"]),
                layers=tuple(data["layers"]),
                actions=tuple(data["actions"]),
                sizes=tuple(data["sizes"]),
                schedule=str(data["schedule"]),
                stages_per_rank=int(data["stages_per_rank"]),
                n_ranks=int(data["n_ranks"]),
                n_microbatches=int(data["n_microbatches"]),
                handoff=tuple(data.get("handoff", ())),
                plan=data.get("plan"),
                owners=dict(data.get("owners", {})),
                lr_scheduler=bool(data.get("lr_scheduler", False)),
                versions=data.get("versions"),
                cost_cache=dict(data.get("cost_cache", {})),
                files={
                    name: FileRecord(int(r["bytes"]), int(r["crc32"]))
                    for name, r in data.get("files", {}).items()
                },
                torch_version=str(data.get("torch_version", "")),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{where} is a damaged manifest: {error!r}") from error


def check_same_model(saved: Sequence[str], keys: Sequence[str], where: str) -> None:
    """CheckpointError naming the first layer key that differs, if `saved` (the checkpoint's
    layer keys) are not `keys` (the model's), in order."""
    for position, (old, new) in enumerate(zip_longest(saved, keys)):
        if old != new:
            raise CheckpointError(
                f"{where} is a checkpoint of another model: layer {position} is {new!r} "
                f"in this model but {old!r} in the checkpoint ({len(saved)} layers there, "
                f"{len(keys)} here)"
            )


# -- names of checkpoint folders -------------------------------------------------------------
def checkpoint_name(step: int) -> str:
    """The folder an automatic save at `step` writes (`CheckpointOptions.every`)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return f"step-{step:08d}"


def partial_name(name: str) -> str:
    """The hidden sibling a save of folder `name` writes before renaming it into place."""
    return f".{name}.partial"


def step_of(name: str) -> int | None:
    """The step of an automatic checkpoint's folder name; None for any other name."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


def newest(names: Iterable[str]) -> str | None:
    """The automatic checkpoint with the highest step among `names` (complete folders)."""
    steps = {step: name for name in names if (step := step_of(name)) is not None}
    return steps[max(steps)] if steps else None


def expired(names: Iterable[str], keep_last: int | None) -> list[str]:
    """The automatic checkpoints beyond the newest `keep_last` (None: keep all), oldest first."""
    ranked = sorted((step, name) for name in names if (step := step_of(name)) is not None)
    if keep_last is None or len(ranked) <= keep_last:
        return []
    return [name for _, name in ranked[: len(ranked) - keep_last]]
