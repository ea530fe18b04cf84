"""What the tracking tests share: a W&B sealed inside a test's folder, and a model folder.

`seal_wandb` confines a real W&B session to a folder and offline: its home folders under
it, its server URL at a closed local port, its error reporting off, and every Python-side
connection to a network address refused and recorded (Unix sockets to W&B's own service
process are allowed). `child_wandb_processes` finds W&B processes left behind.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from pipeline.distributed import procfs

__all__ = ["child_wandb_pids", "child_wandb_processes", "manifest_of", "model_folder", "seal_wandb"]


def seal_wandb(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[Any]:
    """W&B confined to `root` and offline (module doc); returns the list that collects the
    network addresses a connection was attempted to."""
    for name in list(os.environ):
        if name.startswith("WANDB_"):
            monkeypatch.delenv(name)
    for name, folder in [
        ("WANDB_DIR", "wandb_dir"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
    ]:
        monkeypatch.setenv(name, str(root / folder))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # refused at once if tried
    monkeypatch.setenv("NETRC", str(root / "no-netrc"))
    attempts: list[Any] = []
    connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        if self.family != socket.AF_UNIX:
            attempts.append(address)
            raise OSError(f"network connection attempted: {address!r}")
        return connect(self, address)

    monkeypatch.setattr(socket.socket, "connect", guarded)
    return attempts


def child_wandb_pids() -> list[int]:
    """This process's children that are W&B's (Linux /proc)."""
    return [c for c in procfs.children(os.getpid()) if "wandb" in procfs.command_line(c)]


def child_wandb_processes() -> list[str]:
    """The command lines of this process's children that are W&B's."""
    return [procfs.command_line(pid) for pid in child_wandb_pids()]


def model_folder(path: Path) -> Path:
    """A small exported-model-like folder, with a subfolder."""
    (path / "runs").mkdir(parents=True)
    (path / "model.safetensors").write_bytes(bytes(range(256)) * 8)
    (path / "metrics.json").write_text('{"seed": 0, "validation_loss": 0.6}\n')
    (path / "runs" / "seed-0.json").write_text("{}\n")
    return path


def manifest_of(folder: Path) -> dict[str, tuple[int, str]]:
    """{relative path: (bytes, base64 MD5)}: what W&B's manifest says of each file."""
    return {
        p.relative_to(folder).as_posix(): (
            p.stat().st_size,
            base64.b64encode(hashlib.md5(p.read_bytes()).digest()).decode(),
        )
        for p in folder.rglob("*")
        if p.is_file()
    }
