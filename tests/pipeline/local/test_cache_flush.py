"""The flush before a timed pass is sized from the machine's caches (sysfs's layout)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pipeline.local.cache_flush import MAX_FLUSH_BYTES, cache_flusher, flush_bytes


def _caches(root: Path, levels: list[tuple[str, str]]) -> Path:
    """A sysfs-like cache listing: one index<i> folder per (type, size)."""
    for i, (kind, size) in enumerate(levels):
        folder = root / f"index{i}"
        folder.mkdir(parents=True)
        (folder / "type").write_text(kind + "\n")
        (folder / "size").write_text(size + "\n")
    return root


DESKTOP = [("Data", "48K"), ("Instruction", "32K"), ("Unified", "2048K"), ("Unified", "32M")]
SERVER = [("Data", "48K"), ("Instruction", "32K"), ("Unified", "2048K"), ("Unified", "307200K")]


@pytest.mark.parametrize(
    ("levels", "expected"),
    [
        (DESKTOP, 64 << 20),  # twice the L3
        (SERVER, 4 << 20),  # the L3 cannot be evicted: twice the L2
        ([("Data", "48K"), ("Unified", "1M")], 2 << 20),
        ([("Instruction", "300M")], MAX_FLUSH_BYTES),  # only data caches count
        ([("Data", "oops"), ("Unified", "")], MAX_FLUSH_BYTES),  # unreadable sizes skipped
    ],
)
def test_flush_is_twice_the_largest_cache_it_can_evict(
    tmp_path: Path, levels: list[tuple[str, str]], expected: int
) -> None:
    assert flush_bytes(_caches(tmp_path, levels)) == expected


def test_no_listing_flushes_the_most(tmp_path: Path) -> None:
    assert flush_bytes(tmp_path / "missing") == MAX_FLUSH_BYTES


def test_this_machine_flushes_at_most_the_cap() -> None:
    assert 0 < flush_bytes() <= MAX_FLUSH_BYTES


def test_a_flush_writes_its_buffer_and_is_a_no_op_off_the_cpu() -> None:
    flush = cache_flusher(torch.device("cpu"), n_bytes=1 << 12)
    flush()
    flush()  # repeated flushes keep writing the same buffer
    assert cache_flusher(torch.device("meta"))() is None
