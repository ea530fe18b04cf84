"""A real offline W&B session: what the tracker logs is what W&B stores.

Two trials and a study go through `CompositeTracker(JsonlTracker, WandbTracker)` once per
module (`session`); each test reads one part of it back: the runs' `.wandb` files decoded
with `nas.tracking.wandb.read_run` and compared with the JSONL mirror, the metric
definitions (summaries, step metrics), the run ids, a model folder logged as an artifact,
the study run's tables. The environment is sealed (`tests.nas.tracking.common.seal_wandb`):
the Python side opens no network connection, and W&B's service process is gone after
`close`.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nas.tracking import CompositeTracker, JsonlTracker, json_safe, read_jsonl
from nas.tracking.wandb import WandbRunData, WandbTracker, metric_summary, read_run, sync_command
from tests.nas.tracking.common import (
    child_wandb_processes,
    manifest_of,
    model_folder,
    seal_wandb,
)

pytest.importorskip("wandb")

STUDY = "charlm-nas"
ARCH = {"layers": [{"kind": "attention", "heads": 4}] * 2, "d_model": 64}
BIG = "x" * 50_000  # a config larger than a 32 KiB block: its record spans blocks
METADATA = {"seed": 0, "validation_loss": 0.6, "trial": 0, "shape": (2, 3)}
MIGRATION = {
    "generation": 0,
    "step": 3,
    "kind": "migration",
    "details": {"moved": (("block1", 0, 1),), "bytes_moved": 4096},
}
TRIALS = [
    {
        "number": 0,
        "state": "complete",
        "validation_loss": 0.6,
        "tokens_per_s": 1050.0,
        "params": {"d_model": 64},
    },
    {
        "number": 1,
        "state": "failed",
        "validation_loss": None,
        "tokens_per_s": None,
        "params": {"d_model": 64},
    },
]


def steps_of(trial: int) -> list[tuple[int, dict[str, float | int | None]]]:
    """A fake-but-real step sequence: loss falling, validation every other step, a NaN."""
    out: list[tuple[int, dict[str, float | int | None]]] = []
    for step in range(1, 6):
        out.append(
            (
                step,
                {
                    "loss": 3.0 / step + trial,
                    "validation_loss": 2.5 / step if step % 2 == 0 else None,
                    "tokens_per_s": 1000 + 10 * step,
                    "bubble_fraction": 0.25,
                    "stage0/total_s": 0.01 * step,
                    "stage1/measured_peak_bytes": 1 << 20,
                    "migrations/bytes_moved": 4096 if step >= 3 else 0,
                    "migrations/pause_s": 0.002 if step >= 3 else 0.0,
                    "grad_norm": math.nan if (trial, step) == (1, 4) else 1.0,
                },
            )
        )
    return out


@dataclass(frozen=True)
class Session:
    """What the module's one W&B session left: its folder, both trackers, the run ids the
    composite gave, the logged model folder, the JSONL records, the network attempts and
    how long the logging took."""

    root: Path
    jsonl: JsonlTracker
    wandb: WandbTracker
    run_ids: dict[int, str | None]
    folder: Path
    records: list[dict[str, Any]]
    attempts: list[Any]
    logged_s: float

    def trial(self, number: int) -> WandbRunData:
        return read_run(self.wandb.trial_directories[number])


def _log_trial(tracker: CompositeTracker, trial: int, folder: Path) -> None:
    """Trial `trial` through `tracker`: its steps, an event, trial 0 a model and a complete
    end, trial 1 a failure."""
    for step, metrics in steps_of(trial):
        tracker.log_step(step, metrics)
    if trial == 0:
        tracker.log_model(f"{STUDY}-trial-0", folder, METADATA)
    tracker.log_event(3, MIGRATION)
    if trial == 0:
        summary = {"validation_loss": 0.6, "tokens_per_s": 1050.0, "peak_bytes": 1 << 20}
        tracker.end_trial("complete", {**summary, "parameters": 12345})
    else:
        error = "StageError: stage 1 failed in backward of block3 at step 4"
        tracker.end_trial("failed", {"parameters": 23456}, error)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    """Two trials and a study logged once, W&B sealed in the module's folder."""
    root = tmp_path_factory.mktemp("wandb-session")
    with pytest.MonkeyPatch.context() as monkeypatch:
        attempts = seal_wandb(monkeypatch, root)
        started = time.perf_counter()
        jsonl = JsonlTracker(root / "run")
        wandb = WandbTracker(
            "elastic-nas-test",
            directory=root / "run",
            tags=("test",),
            directions={"bubble_fraction": "minimize"},  # a declared direction; others by name
        )
        tracker = CompositeTracker([jsonl, wandb], primary=1)
        folder = model_folder(root / "model")
        run_ids: dict[int, str | None] = {}
        tracker.start_study(STUDY, {"n_trials": 2, "task": "charlm", "notes": BIG})
        for trial in (0, 1):
            params = {"d_model": 64, "n_layers": 2 + trial}
            config = {"architecture": ARCH, "architecture_summary": f"{2 + trial} layers"}
            tracker.start_trial(trial, params, config)
            run_ids[trial] = tracker.run_id
            assert jsonl.run_id == f"{STUDY}/trial-{trial}"
            _log_trial(tracker, trial, folder)
        summary = {"objectives": ["validation_loss", "tokens_per_s"], "best_validation_loss": 0.6}
        tracker.end_study(TRIALS, TRIALS[:1], summary)
        assert tracker.run_id is None and jsonl.run_id is None  # no trial open
        tracker.close()
        logged_s = time.perf_counter() - started
        assert jsonl.path is not None
        records = read_jsonl(jsonl.path)
        yield Session(root, jsonl, wandb, run_ids, folder, records, attempts, logged_s)


@pytest.mark.parametrize(
    "name,directions,summary",
    [
        ("loss", None, "min,last"),
        ("validation_loss", None, "min,last"),
        ("stage0/train_loss", None, "min,last"),
        ("validation_accuracy", None, "max,last"),
        ("validation_perplexity", None, None),  # a task's own metric: its declared direction
        ("tokens_per_s", None, None),
        ("lr", None, None),
        ("validation_perplexity", {"validation_perplexity": "minimize"}, "min,last"),
        ("test_perplexity", {"validation_perplexity": "minimize"}, "min,last"),  # its twin's
        ("validation_loss", {"validation_loss": "maximize"}, "max,last"),  # declared wins
    ],
)
def test_metric_summary_follows_the_declared_direction_else_the_name(
    name: str, directions: dict[str, Any] | None, summary: str | None
) -> None:
    assert metric_summary(name, directions) == summary


@pytest.mark.timeout(120)
def test_the_session_stays_offline_quick_and_leaves_no_process(session: Session) -> None:
    assert not session.attempts, f"W&B tried the network: {session.attempts}"
    assert not child_wandb_processes()
    for log in session.root.rglob("*.log"):  # nothing in W&B's own logs about the network
        text = log.read_text(errors="replace")
        assert "127.0.0.1:9" not in text and "dial tcp" not in text, log
    assert session.logged_s < 30, f"the W&B session took {session.logged_s:.1f} s"


def test_every_run_has_a_folder_to_sync(session: Session) -> None:
    wandb = session.wandb
    assert set(wandb.trial_directories) == {0, 1} and wandb.study_directory is not None
    assert wandb.run_directories == [
        wandb.study_directory,
        wandb.trial_directories[0],
        wandb.trial_directories[1],
    ]
    assert all(
        d.parent == session.root / "run" / "wandb" and d.name.startswith("offline-run-")
        for d in wandb.run_directories
    )
    assert wandb.sync_command() == sync_command(wandb.run_directories)
    assert wandb.sync_command().startswith("wandb sync ")


@pytest.mark.parametrize("trial", [0, 1])
def test_a_trials_history_is_the_jsonl_mirrors(session: Session, trial: int) -> None:
    run = session.trial(trial)
    assert not run.truncated
    assert (run.name, run.group, run.job_type) == (f"{STUDY}-trial-{trial}", STUDY, "trial")
    assert run.run_id == session.run_ids[trial]  # the composite gives the primary's: W&B's
    assert all(row["step"] == row["_step"] for row in run.history)  # the step metric
    # The W&B history equals the JSONL mirror's step records: same steps, keys, values
    # (NaN is NaN in W&B and null in JSON: compared through json_safe).
    mirror = [
        {"_step": r["step"], **r["metrics"]}
        for r in session.records
        if r["kind"] == "step" and r["trial"] == trial
    ]
    assert len(mirror) == 5
    assert json_safe(run.metrics()) == mirror
    assert "validation_loss" not in run.metrics()[0]  # None: not logged at all
    assert run.config["params"] == {"d_model": 64, "n_layers": 2 + trial}
    assert run.config["architecture"] == ARCH and run.config["trial"] == trial
    assert run.config["study"] == STUDY
    events = run.table("events")
    assert events["columns"] == ["step", "generation", "kind", "details"]
    assert events["data"][0][:3] == [3, 0, "migration"]


@pytest.mark.parametrize("trial", [0, 1])
def test_metrics_with_a_direction_summarise_as_best_and_last(session: Session, trial: int) -> None:
    definitions = session.trial(trial).metric_definitions
    assert definitions["step"].hidden
    assert definitions["*"].glob and definitions["*"].step_metric == "step"
    for key in ("loss", "validation_loss", "bubble_fraction"):
        assert definitions[key].summary == ("min", "last"), key
        assert definitions[key].step_metric == "step"
    assert "tokens_per_s" not in definitions and "grad_norm" not in definitions


def test_a_trials_summary_holds_its_end_figures(session: Session) -> None:
    complete, failed = session.trial(0), session.trial(1)
    assert complete.exit_code == 0 and failed.exit_code == 1
    assert complete.summary["state"] == "complete" and complete.summary["error"] is None
    assert complete.summary["parameters"] == 12345 and complete.summary["peak_bytes"] == 1 << 20
    assert complete.summary["loss"] == {"min": 0.6, "last": 0.6}  # 3 / step at step 5
    # the best logged (step 4) and, as "last", the end-of-trial figure
    assert complete.summary["validation_loss"] == {"min": 0.625, "last": 0.6}
    assert complete.summary["bubble_fraction"] == {"min": 0.25, "last": 0.25}
    assert complete.summary["tokens_per_s"] == 1050.0  # no direction: the end figure
    assert failed.summary["loss"] == {"min": 1.6, "last": 1.6}
    assert failed.summary["state"] == "failed"
    assert failed.summary["error"].startswith("StageError: stage 1 failed")
    assert complete.tags == ("test", "complete") and failed.tags == ("test", "failed")
    ends = [r for r in session.records if r["kind"] == "trial_end"]
    assert [(r["state"], r["error"] is None) for r in ends] == [
        ("complete", True),
        ("failed", False),
    ]


def test_a_logged_model_is_an_artifact_of_its_folder(session: Session, tmp_path: Path) -> None:
    complete, failed, folder = session.trial(0), session.trial(1), session.folder
    [artifact] = [a for a in complete.artifacts if a.type == "model"]  # tables are artifacts too
    assert (artifact.name, artifact.type, artifact.aliases) == (
        f"{STUDY}-trial-0",
        "model",
        ("latest",),
    )
    assert artifact.metadata == json_safe(METADATA)
    assert artifact.files == manifest_of(folder)  # computed here, not by the reader
    assert artifact.differences(folder) == []
    assert sorted(artifact.files) == ["metrics.json", "model.safetensors", "runs/seed-0.json"]
    assert [a.type for a in failed.artifacts] == ["run_table"]  # its events table only
    [model] = [r for r in session.records if r["kind"] == "model"]
    assert (model["trial"], model["name"], model["folder"]) == (
        0,
        f"{STUDY}-trial-0",
        str(folder.resolve()),
    )
    assert model["files"] == {path: size for path, (size, _) in manifest_of(folder).items()}
    assert model["metadata"] == json_safe(METADATA)
    changed = shutil.copytree(folder, tmp_path / "changed")
    (changed / "runs" / "seed-0.json").write_text("{}\n\n")
    (changed / "extra.txt").write_text("x")
    assert artifact.differences(changed) == ["extra.txt", "runs/seed-0.json"]


def test_the_study_run_holds_the_trials_and_the_front(session: Session) -> None:
    directory = session.wandb.study_directory
    assert directory is not None
    study = read_run(directory)
    assert (study.name, study.group, study.job_type, study.exit_code) == (
        f"{STUDY}-study",
        STUDY,
        "study",
        0,
    )
    assert study.config["notes"] == BIG and study.config["n_trials"] == 2  # spans blocks
    assert study.metric_definitions["trials/*"].step_metric == "trials/ended"
    assert study.metric_definitions["trials/ended"].hidden
    assert study.metrics()[-1] == {
        "_step": 2,
        "trials/ended": 2,
        "trials/complete": 1,
        "trials/pruned": 0,
        "trials/failed": 1,
    }
    table = study.table("trials")
    assert table["columns"] == ["number", "state", "validation_loss", "tokens_per_s", "params"]
    assert [row[:4] for row in table["data"]] == [
        [0, "complete", 0.6, 1050.0],
        [1, "failed", None, None],
    ]
    assert table["data"][0][4] == '{"d_model": 64}'  # nested values as JSON text
    assert study.table("pareto_front")["data"] == table["data"][:1]
    assert study.summary["pareto_plot"]["_type"] == "image-file"
    assert study.summary["best_validation_loss"] == 0.6
    assert (directory / "pareto_front.png").stat().st_size > 0
