"""The process table read from /proc (`pipeline.distributed.procfs`), on a real child."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.distributed import procfs

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads Linux's /proc")


def test_a_child_is_seen_running_then_exited_before_it_is_reaped() -> None:
    child = subprocess.Popen(["sleep", "60"])
    try:
        assert child.pid in procfs.children(os.getpid())
        assert child.pid in procfs.descendants(os.getppid())  # a grandchild of our parent
        assert procfs.parents()[child.pid] == os.getpid()
        assert procfs.command_line(child.pid) == "sleep 60"
        assert procfs.running(child.pid) and not procfs.has_exited(child.pid)
        child.kill()
        deadline = time.monotonic() + 10
        while procfs.running(child.pid):  # a zombie until we reap it
            assert time.monotonic() < deadline, "the killed child never exited"
            time.sleep(0.01)
        assert procfs.has_exited(child.pid) and procfs.state(child.pid) in ("Z", "X")
    finally:
        child.wait()
    assert procfs.state(child.pid) is None and not procfs.has_exited(child.pid)
    assert procfs.command_line(child.pid) == "" and child.pid not in procfs.children(os.getpid())
