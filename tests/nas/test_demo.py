"""The README's main job (`python -m nas.demo`) runs end to end and its loss falls.

A real run: the demo starts two stage processes that train the compiled seed Transformer
on the pydoc character task, and the test reads what it prints.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest


@pytest.mark.multiprocess
def test_demo_trains_and_reports_throughput() -> None:
    cmd = [sys.executable, "-m", "nas.demo", "--steps", "30", "--log-every", "10",
           "--layers", "2", "--d-model", "64", "--schedule", "gpipe"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    steps = re.findall(r"step +(\d+)/30  loss (\d+\.\d+)  (\d+\.\d+) bits/char  [\d,]+ tokens/s",
                       out.stdout)  # fmt: skip
    assert [int(step) for step, _, _ in steps] == [10, 20, 30], out.stdout
    losses = [float(loss) for _, loss, _ in steps]
    assert losses[-1] < losses[0], out.stdout
    assert re.search(r"^throughput [\d,]+ tokens/s \(median step [\d.]+ ms\)$", out.stdout, re.M)
    stage_lines = re.findall(r"^  stage (\d): layers (.+); per step forward", out.stdout, re.M)
    assert [s for s, _ in stage_lines] == ["0", "1"], out.stdout
    layers = [key for _, keys in stage_lines for key in keys.split(", ")]
    assert layers == ["embed", "dec0", "head"]  # one cell holds both Transformer layers


def test_odd_layer_counts_are_refused() -> None:
    cmd = [sys.executable, "-m", "nas.demo", "--layers", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 2 and "--layers must be even" in out.stderr
