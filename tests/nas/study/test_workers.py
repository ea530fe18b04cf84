"""`nas.study.workers`: the local workers of one command end with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nas.settings import NasSettings
from pipeline.distributed import procfs

pytestmark = pytest.mark.multiprocess

ROOT = Path(__file__).resolve().parents[3]


def wait_forever(settings: NasSettings, number: int) -> None:
    """A worker's work that never ends on its own (module-level: pickled by name); it says
    its pid in its run folder first."""
    folder = Path(settings.output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "worker.pid").write_text(str(os.getpid()))
    time.sleep(600)


CALLER = """
import dataclasses, sys
from nas.settings import NasSettings
from nas.study.workers import WorkerJob, run_workers
from tests.nas.study.test_workers import wait_forever
plain = NasSettings(output_dir=sys.argv[1])
shape = dataclasses.replace(plain.pipeline, n_stages=1, threads_per_stage=1, n_microbatches=1)
study = dataclasses.replace(plain.study, workers=1)
settings = dataclasses.replace(plain, study=study, pipeline=shape)
run_workers(WorkerJob("wait", settings, wait_forever), ("waiting", 1, lambda: 0))
"""


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
def test_the_workers_of_a_killed_command_end_with_it(tmp_path: Path) -> None:
    """SIGKILL to the command (as a supervisor or a user's kill -9 sends it): its workers
    see their caller gone and end, so a command started again trains beside no ghost."""
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER, str(tmp_path), ""],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        said = tmp_path / "worker-0" / "worker.pid"
        deadline = time.monotonic() + 30
        while not said.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert said.exists(), "the command started no worker"
        worker = int(said.read_text())
        family = procfs.descendants(caller.pid)  # the worker, and the server it forked from
        assert worker in family
        caller.send_signal(signal.SIGKILL)
        caller.wait()
        deadline = time.monotonic() + 10
        while any(procfs.running(p) for p in family) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(procfs.running(p) for p in family), "a worker outlived its command"
    finally:
        caller.kill()
        for process in procfs.descendants(caller.pid):
            os.kill(process, signal.SIGKILL)
