"""`python -m nas` as a user runs it: a subprocess, Hydra's run folder, printed results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.multiprocess


def run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "nas", *overrides, f"hydra.run.dir={tmp_path / 'run'}",
           f"studies_dir={tmp_path / 'studies'}"]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path)


def test_a_small_study_from_the_command_line(tmp_path: Path) -> None:
    done = run(tmp_path, "study.name=cli", "study.n_trials=2", "tracker=none", "train.steps=4",
               "train.eval_every=2", "train.eval_batches=1", "train.batch_size=16",
               "search_space.d_model=[32]", "search_space.max_cells=1")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "study cli: 2 trials finished" in done.stdout
    assert (tmp_path / "run" / "optimization_history.png").stat().st_size > 0
    assert (tmp_path / "studies" / "cli.db").exists()
    assert f"optuna-dashboard sqlite:///{tmp_path / 'studies' / 'cli.db'}" in done.stdout


def test_the_composed_config_prints_and_bad_overrides_name_the_key(tmp_path: Path) -> None:
    shown = run(tmp_path, "--cfg", "job", "sampler=nsga2")
    assert shown.returncode == 0 and "name: nsga2" in shown.stdout
    bad = run(tmp_path, "sampler=annealing")
    assert bad.returncode != 0
    assert "Could not find 'sampler/annealing'" in bad.stderr and "evolution" in bad.stderr
