"""A killed retraining resumes: the harness's CLI retrains a stored study's best with a
checkpoint every few steps, is killed (SIGKILL, with its stage processes) once the first
checkpoint is written, and run again: the run goes on from its latest checkpoint, its
history whole, and ends exactly where an uninterrupted retraining of the same (model, seed)
ends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nas.retrain.runs import checkpoint_folder, record_path
from nas.retrain.stage import retrain
from nas.settings import RetrainSettings
from nas.study.run import run_study
from tests.nas.harness.common import TINY, tiny_settings

STEPS, EVERY = 12, 4
SETTINGS = (
    "study.name=k",
    "study.n_trials=1",
    "tracker=none",
    "train.steps=2",  # the search: one trial of 2 steps, evaluated once
    "train.eval_every=6",  # the retraining: at step 6 too
    "train.decode_pairs=0",
    "train.final_decode_pairs=0",
    "retrain.top_k=1",
    "retrain.seeds=[0]",
    f"retrain.steps={STEPS}",
    "retrain.decode_pairs=2",
)


def kill_at_the_first_checkpoint(command: list[str], cwd: Path, checkpoints: Path) -> None:
    """Run `command` (the CLI) in `cwd` and kill it, with its stage processes (SIGKILL), as
    soon as a checkpoint is complete in `checkpoints`."""
    killed = subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its stage processes die with it
    )
    deadline = time.monotonic() + 200
    while not any(checkpoints.glob("step-*/pipeline.json")):
        assert killed.poll() is None, killed.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no checkpoint was written"
        time.sleep(0.02)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_killed_retraining_resumes_from_its_checkpoint_and_ends_as_an_uninterrupted_one(
    tmp_path: Path,
) -> None:
    run_study(tiny_settings(tmp_path, *SETTINGS))  # the stored study to retrain
    models = tmp_path / "models"
    cli = [
        sys.executable,
        "-m",
        "nas",
        *TINY,
        *SETTINGS,
        "stages=[retrain]",
        f"studies_dir={tmp_path / 'studies'}",
        f"retrain.models_dir={models}",
        f"retrain.checkpoint_every={EVERY}",
    ]
    model_folder = models / "k" / "trial-0"
    checkpoints = checkpoint_folder(model_folder, 0)
    killed = [*cli, f"hydra.run.dir={tmp_path / 'killed'}"]
    kill_at_the_first_checkpoint(killed, tmp_path, checkpoints)
    assert not record_path(model_folder, 0).exists(), "the run ended before it was killed"

    again = subprocess.run(
        [*cli, f"hydra.run.dir={tmp_path / 'again'}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    log = (tmp_path / "again" / "elastic-nas.log").read_text()
    resumed = re.findall(r"retrain trial-0 seed 0: resumed from its checkpoint at step (\d+)", log)
    assert len(resumed) == 1 and int(resumed[0]) % EVERY == 0 and EVERY <= int(resumed[0]) < STEPS
    run = json.loads(record_path(model_folder, 0).read_text())["run"]
    assert not checkpoints.exists()  # finished and recorded: its checkpoints are gone

    whole = retrain(
        tiny_settings(
            tmp_path,
            *SETTINGS,
            f"retrain.models_dir={tmp_path / 'whole'}",
            "retrain.checkpoint_every=0",
        )
    ).runs[0]
    assert (whole.model, whole.seed, whole.error, run["error"]) == ("trial-0", 0, None, None)
    assert run["metrics"]["validation_loss"] == pytest.approx(
        whole.metrics["validation_loss"], abs=1e-6
    )
    assert [entry["step"] for entry in run["history"]] == list(range(1, STEPS + 1))
    for entry, reference in zip(run["history"], whole.history, strict=True):
        assert entry.keys() == reference.keys()
        assert entry["loss"] == pytest.approx(reference["loss"], abs=1e-6)
        assert entry["lr"] == reference["lr"]


def test_checkpoint_every_is_a_step_count_or_off() -> None:
    assert RetrainSettings().checkpoint_every == 100
    assert RetrainSettings(checkpoint_every=0).checkpoint_every == 0
    with pytest.raises(ValueError, match="retrain.checkpoint_every=-1 is not valid"):
        RetrainSettings(checkpoint_every=-1)
