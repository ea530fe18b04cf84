"""`python -m nas` as a user runs it: a subprocess, Hydra's run folder, printed results."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

import nas
from nas.export.pretrained import TranslationModel
from nas.settings import task_metrics
from nas.study.trials import counted
from nas.tasks import get_task
from nas.tasks.metrics import decode_metrics
from nas.tasks.translation import Translation
from tests.nas.harness.common import SMALL, run, write_text

pytestmark = pytest.mark.multiprocess


# One trial of each task, as small as it gets: a few steps, one evaluation batch, a few
# decoded pairs (translation), short windows (the language models).
ONE_TRIAL = (
    "tracker=jsonl",
    "stages=[search]",
    "study.n_trials=1",
    "train.steps=2",
    "train.eval_every=2",
    *SMALL,
)
# The shape set by hand (one worker of one single-thread stage, one micro-batch): no
# profile of the task's seeds before the study, where the shape is not what a test is about.
FIXED_SHAPE = (
    "study.workers=1",
    "pipeline.n_stages=1",
    "pipeline.threads_per_stage=1",
    "pipeline.n_microbatches=1",
)
TASK_OPTIONS = ("task.options.seq_len=16",)  # the language models: short windows


def assert_one_complete_trial_with_its_tasks_metrics(db: Path, name: str, task: str) -> None:
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    assert [t.state for t in study.trials if counted(t)] == [optuna.trial.TrialState.COMPLETE]
    trial = next(t for t in study.trials if counted(t))
    assert set(task_metrics(task)) <= set(trial.user_attrs), sorted(trial.user_attrs)


@pytest.mark.timeout(300)
def test_one_trial_on_a_text_file_from_the_command_line(tmp_path: Path) -> None:
    """task=textfile (the language model `charlm` is the multirun's, translation the small
    study's below and tests/test_wheel.py's)."""
    corpus = write_text(tmp_path / "corpus.txt")  # 4,000 characters: 20 * (16 + 2) needed
    env = {**os.environ, "WANDB_MODE": "offline"}
    done = run(
        tmp_path,
        "task=textfile",
        "study.name=textfile",
        *ONE_TRIAL,
        *FIXED_SHAPE,
        *TASK_OPTIONS,
        f"task.options.path={corpus}",
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    db = tmp_path / "studies" / "textfile.db"
    assert_one_complete_trial_with_its_tasks_metrics(db, "textfile", "textfile")
    assert (tmp_path / "run" / "tracking" / "textfile.jsonl").exists()


def test_a_multirun_runs_one_study_per_job(tmp_path: Path) -> None:
    """One study per job, named by its swept value; the character language model's task
    on a 2-stage pipeline (2bw: steps streamed without a flush)."""
    done = run(
        tmp_path,
        "--multirun",
        "pipeline.schedule=1f1b,2bw",
        "task=charlm",
        *TASK_OPTIONS,
        "stages=[search]",
        "tracker=jsonl",
        "study.n_trials=1",
        "train.steps=2",
        "train.eval_every=2",
        *SMALL,
        "study.workers=1",
        "pipeline.n_stages=2",
        "pipeline.threads_per_stage=1",
        "pipeline.n_microbatches=2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for job, schedule in enumerate(("1f1b", "2bw")):
        name = f"nas-pipeline.schedule={schedule}"  # the swept value names the job's study
        db = tmp_path / "studies" / f"{name}.db"
        assert_one_complete_trial_with_its_tasks_metrics(db, name, "charlm")
        assert (tmp_path / "sweep" / str(job) / "optimization_history.png").exists()
        tracked = f"nas-pipeline.schedule_{schedule}.jsonl"  # its file: "=" written "_"
        assert (tmp_path / "sweep" / str(job) / "tracking" / tracked).exists()


def test_stages_started_by_torchrun_run_the_study(tmp_path: Path) -> None:
    """On a machine new to the runtime (an empty cost cache): rank 0 measures the runtime's
    overheads in processes of its own, not in torchrun's group, then chooses the shape."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "nas",
        "study.name=tr",
        "study.n_trials=2",
        "tracker=jsonl",
        "train.steps=2",
        *SMALL,
        "train.eval_every=2",
        f"hydra.run.dir={tmp_path / 'run'}",
        f"studies_dir={tmp_path / 'studies'}",
    ]
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}  # no costs measured yet
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "measuring the runtime's overheads" in (tmp_path / "run" / "elastic-nas.log").read_text()
    assert done.stdout.count("study tr: 2 trials") == 1  # rank 0 reports
    assert done.stdout.count("exported trial-") == 1  # the retraining launched again
    study = optuna.load_study(study_name="tr", storage=f"sqlite:///{tmp_path / 'studies'}/tr.db")
    assert [t.state for t in study.trials if counted(t)] == [optuna.trial.TrialState.COMPLETE] * 2
    lines = (tmp_path / "run" / "tracking" / "tr.jsonl").read_text().splitlines()
    kinds = [json.loads(line)["kind"] for line in lines]
    assert kinds.count("study_start") == 2  # the search's, then the retraining's: rank 0 tracks


@dataclass(frozen=True)
class CliStudy:
    """One small study run from the command line as a user runs it (`cli_study`): its
    folder and what the command printed."""

    root: Path
    done: subprocess.CompletedProcess[str]

    def study(self) -> optuna.Study:
        url = f"sqlite:///{self.root / 'studies' / 'pair.db'}"
        return optuna.load_study(study_name="pair", storage=url)


@pytest.fixture(scope="module")
def cli_study(tmp_path_factory: pytest.TempPathFactory) -> CliStudy:
    """Search, retrain and export from the command line, on two local workers (each one
    single-stage process): read by the two tests after it."""
    root = tmp_path_factory.mktemp("cli")
    done = run(
        root,
        "study.name=pair",
        "study.n_trials=4",
        "study.workers=2",
        "pipeline.n_stages=1",
        "pipeline.threads_per_stage=1",
        "stages=[search,retrain]",
        "tracker=jsonl",
        "train.steps=4",
        *SMALL,
        "train.eval_every=2",
        "retrain.top_k=1",
        "retrain.seeds=[0,1,2]",
        "retrain.steps=4",
        f"retrain.models_dir={root / 'models'}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return CliStudy(root, done)


def test_a_small_study_from_the_command_line(cli_study: CliStudy) -> None:
    """Search, retrain and export; the exported model, loaded alone (here: this process ran
    no part of the study), scores as reported."""
    done, root = cli_study.done, cli_study.root
    assert "study pair: 4 trials" in done.stdout, done.stdout[-4000:]
    [folder] = (root / "models" / "pair").iterdir()
    assert folder.name.startswith("trial-") and f"exported {folder.name}" in done.stdout
    assert "TranslationModel.from_pretrained(" in done.stdout and "nas.load_model(" in done.stdout
    metrics = json.loads((folder / "metrics.json").read_text())
    # its greedy translations of the pairs the retraining's final evaluation decoded
    model, task = nas.load_model(folder), get_task("translation")
    assert isinstance(model, TranslationModel) and isinstance(task, Translation)
    pairs = [task.pairs("validation")[i] for i in task.decode_subset("validation", 8)]
    scores = decode_metrics(model.translate([src for src, _ in pairs]), [tgt for _, tgt in pairs])
    assert scores["chrf"] == pytest.approx(metrics["chrf"], abs=1e-9)
    assert scores["exact_match"] == pytest.approx(metrics["exact_match"], abs=1e-9)
    best = next(line for line in done.stdout.splitlines() if "best architecture" in line)
    assert " enc 1x[" in best  # the whole summary: brackets are not taken for markup
    assert (root / "run" / "optimization_history.png").stat().st_size > 0
    for trial in cli_study.study().get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        assert set(task_metrics("translation")) <= set(trial.user_attrs), sorted(trial.user_attrs)
    assert f"optuna-dashboard sqlite:///{root / 'studies' / 'pair.db'}" in done.stdout


def test_workers_started_by_the_cli_finish_one_study_together(cli_study: CliStudy) -> None:
    """`study.workers=2`: two local workers, each its own single-stage process, train one
    study: exactly `n_trials` trials, each recorded once, one bar and one report; then they
    share the retraining, each run trained once."""
    done, root = cli_study.done, cli_study.root
    assert done.stdout.count("study pair: 4 trials") == 1, done.stdout[-4000:]  # one report
    study = cli_study.study()
    recorded = [t for t in study.trials if counted(t)]
    assert len(recorded) == 4 and all(t.state.is_finished() for t in study.trials)
    owners = {t.user_attrs["owner"] for t in recorded}
    assert len(owners) == 2, owners  # both workers trained
    for trial in recorded:  # the shape and its prediction beside the measured throughput
        assert trial.user_attrs["shape"].startswith("2 workers x 1 stage x 1 thread")
        assert trial.user_attrs["predicted_samples_per_s"] > 0
        assert trial.user_attrs["samples_per_s"] > 0
    logged = [
        json.loads(line)
        for path in sorted((root / "run").glob("worker-*/tracking/*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    ends = [r["trial"] for r in logged if r["kind"] == "trial_end" and r.get("job") != "retrain"]
    assert sorted(ends) == sorted(t.number for t in recorded)  # each trial tracked once
    log = (root / "run" / "elastic-nas.log").read_text()
    assert "retrain: 2 workers started" in log
    trained = re.findall(r"retrain (\S+) seed (\d): claimed by \S+, trained here", log)
    assert sorted(seed for _, seed in trained) == ["0", "1", "2"], log[-3000:]  # each once
    best = min(recorded, key=lambda t: t.values[0]).number
    assert {name for name, _ in trained} == {f"trial-{best}"}
    metrics = json.loads((root / "models" / "pair" / f"trial-{best}" / "metrics.json").read_text())
    assert [entry["seed"] for entry in metrics["per_seed"]] == [0, 1, 2]
    retrained = [r for r in logged if r["kind"] == "trial_end" and r.get("job") == "retrain"]
    assert len(retrained) == 3  # each run tracked once, by the worker that trained it
