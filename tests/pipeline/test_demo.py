"""The README's main job (the demo) runs end to end and its loss falls."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.multiprocess
def test_demo_trains_and_reports_throughput() -> None:
    cmd = [sys.executable, "-m", "pipeline.demo", "--steps", "30", "--log-every", "10",
           "--layers", "2", "--d-model", "64", "--schedule", "gpipe"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out.stdout)]
    assert len(losses) == 3 and losses[-1] < losses[0], out.stdout
    assert "tokens/s" in out.stdout and "stage 1: layers" in out.stdout
