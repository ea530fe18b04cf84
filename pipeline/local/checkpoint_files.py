"""A checkpoint folder on disk: written aside and renamed into place, checked before it is read.

`pipeline.distributed.checkpoint` runs the collective parts of a save and a load; the file
work of one process is here, so a crash anywhere leaves the last good checkpoint whole:

    prepare(partial)        (rank 0) the hidden sibling `.<name>.partial`, emptied of a
                            crashed save's leftovers
    records(folder, names)  size and CRC-32 of the files a rank wrote (its shards)
    publish(partial, final, manifest)
                            (rank 0, after every rank wrote) `pipeline.json` written and
                            synced last, then the rename: an existing checkpoint of the same
                            name is moved aside first and deleted after, so at every moment
                            one whole checkpoint holds the name (or, between the two
                            renames, its `.old` sibling)
    read_manifest(folder)   the manifest, or a `CheckpointError` naming what is missing
    verify(folder, names, manifest)
                            every file a rank is about to read exists with its recorded
                            size and CRC-32, or a `CheckpointError` naming the file
    resolve(path)           a checkpoint folder, or a directory's newest one
    prune(directory, keep_last)
                            (rank 0) delete the automatic checkpoints beyond the newest
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from collections.abc import Iterable
from pathlib import Path

from pipeline.pure.checkpoint_format import (
    MANIFEST,
    CheckpointError,
    FileRecord,
    Manifest,
    expired,
    newest,
)

__all__ = [
    "crc32",
    "prepare",
    "prune",
    "publish",
    "read_manifest",
    "records",
    "remove",
    "resolve",
    "verify",
]

_CHUNK = 16 << 20


def crc32(path: Path) -> int:
    """The CRC-32 of a file's bytes (read in chunks)."""
    value = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            value = zlib.crc32(chunk, value)
    return value


def prepare(partial: Path) -> None:
    """An empty `partial` folder (a crashed save's leftovers removed)."""
    remove(partial)
    partial.mkdir(parents=True)


def remove(folder: Path) -> None:
    """Delete `folder` and everything in it, if it exists."""
    if folder.exists():
        shutil.rmtree(folder)


def records(folder: Path, names: Iterable[str]) -> dict[str, FileRecord]:
    """{name: size and CRC-32} of the named files in `folder`."""
    return {
        name: FileRecord((folder / name).stat().st_size, crc32(folder / name)) for name in names
    }


def publish(partial: Path, final: Path, manifest: Manifest) -> None:
    """Write the manifest into `partial` and rename it to `final` (module doc)."""
    target = partial / MANIFEST
    with target.open("w") as f:
        json.dump(manifest.to_dict(), f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    old = final.parent / f".{final.name}.old"
    remove(old)
    if final.exists():
        final.rename(old)
    partial.rename(final)
    _sync_dir(final.parent)
    remove(old)


def read_manifest(folder: Path) -> Manifest:
    """The manifest of the checkpoint in `folder` (CheckpointError if there is none)."""
    path = folder / MANIFEST
    if not folder.is_dir():
        raise CheckpointError(f"no checkpoint at {folder}: not a folder")
    if not path.is_file():
        raise CheckpointError(
            f"{folder} is not a complete checkpoint: {MANIFEST} is missing (a save that "
            "did not finish writes to a hidden .partial folder, never here)"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path} cannot be read: {error}") from error
    return Manifest.from_dict(data, str(path))


def verify(folder: Path, names: Iterable[str], manifest: Manifest) -> None:
    """Each named file is in `folder` with the size and CRC-32 the manifest records."""
    for name in sorted(set(names)):
        path = folder / name
        record = manifest.files.get(name)
        if record is None:
            raise CheckpointError(f"checkpoint file {path} is not listed in its {MANIFEST}")
        if not path.is_file():
            raise CheckpointError(f"checkpoint file {path} is missing")
        size = path.stat().st_size
        if size != record.bytes:
            raise CheckpointError(
                f"checkpoint file {path} is corrupt: {size} bytes, {record.bytes} were written"
            )
        if crc32(path) != record.crc32:
            raise CheckpointError(f"checkpoint file {path} is corrupt: its CRC-32 differs")


def resolve(path: Path) -> Path | None:
    """`path` if it is a checkpoint folder; else the newest automatic checkpoint in the
    directory `path`; None if it holds none."""
    if (path / MANIFEST).is_file():
        return path
    if not path.is_dir():
        return None
    complete = [p.name for p in path.iterdir() if (p / MANIFEST).is_file()]
    name = newest(complete)
    return None if name is None else path / name


def prune(directory: Path, keep_last: int | None) -> list[str]:
    """Delete the automatic checkpoints in `directory` beyond the newest `keep_last`."""
    complete = [p.name for p in directory.iterdir() if (p / MANIFEST).is_file()]
    gone = expired(complete, keep_last)
    for name in gone:
        remove(directory / name)
    return gone


def _sync_dir(folder: Path) -> None:
    """Make a rename in `folder` durable (where the platform allows opening a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
