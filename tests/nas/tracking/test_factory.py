"""`make_tracker` by name, and `nas.tracking` without wandb: `tracker=none` and `tracker=jsonl`
must work on an install that has no wandb at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nas.study.tracker_setup import study_tracker
from nas.tracking import CompositeTracker, JsonlTracker, NoneTracker, make_tracker
from tests.nas.harness.common import tiny_settings

ROOT = Path(__file__).resolve().parents[3]


def test_make_tracker_by_name(tmp_path: Path) -> None:
    assert isinstance(make_tracker("none"), NoneTracker)
    jsonl = make_tracker("jsonl", directory=tmp_path)
    assert isinstance(jsonl, JsonlTracker) and jsonl.directory == tmp_path
    with pytest.raises(
        ValueError,
        match=r"unknown tracker 'mlflow'; valid trackers: wandb, "
        r"jsonl, none",
    ):
        make_tracker("mlflow")
    with pytest.raises(TypeError, match="bad options for tracker 'none'.*valid options: none"):
        make_tracker("none", directory=tmp_path)


def test_the_wandb_tracker_validates_its_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="valid modes: offline, online, disabled"):
        make_tracker("wandb", mode="cloud", directory=tmp_path)
    with pytest.raises(TypeError, match="not one string"):
        make_tracker("wandb", tags="nas", directory=tmp_path)
    with pytest.raises(ValueError, match="mode="):
        make_tracker("wandb", settings={"mode": "online"}, directory=tmp_path)
    with pytest.raises(
        ValueError, match="metric 'validation_bleu' has direction 'up'; valid: minimize, maximize"
    ):
        make_tracker("wandb", directions={"validation_bleu": "up"}, directory=tmp_path)


def test_the_configured_wandb_tracker_knows_the_tasks_directions_and_whose_run_id(
    tmp_path: Path,
) -> None:
    pytest.importorskip("wandb")
    from nas.tracking.wandb import WandbTracker

    settings = tiny_settings(tmp_path, "tracker=wandb", "task=translation")
    tracker = study_tracker(settings)
    assert isinstance(tracker, CompositeTracker)
    mirror, wandb = tracker.trackers
    assert isinstance(mirror, JsonlTracker) and isinstance(wandb, WandbTracker)
    assert tracker.trackers[tracker.primary] is wandb  # a trial keeps W&B's run id
    assert wandb.directions == {
        "validation_loss": "minimize",
        "validation_accuracy": "maximize",
        "validation_chrf": "maximize",
        "validation_bleu": "maximize",
        "validation_exact_match": "maximize",
    }
    tracker.close()  # nothing started: nothing to finish


def test_nas_tracking_imports_and_works_without_wandb(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        sys.modules["wandb"] = None  # any `import wandb` now raises ImportError
        import nas.tracking
        import nas.tracking.wandb  # the package itself imports no wandb
        from nas.tracking import make_tracker, read_jsonl
        make_tracker("none").close()
        tracker = make_tracker("jsonl", directory={str(tmp_path)!r})
        tracker.start_study("s", {{}})
        tracker.start_trial(0, {{}}, {{}})
        tracker.log_step(0, {{"loss": 1.0}})
        tracker.end_trial("complete", {{}})
        tracker.end_study([], [], {{}})
        tracker.close()
        assert [r["kind"] for r in read_jsonl(tracker.path)][-1] == "study_end"
        try:
            make_tracker("wandb")
        except ImportError as error:
            assert "tracker=jsonl" in str(error), error
        else:
            raise AssertionError("the wandb tracker was built without wandb")
        assert not any(name == "wandb" or name.startswith("wandb.")
                       for name, module in sys.modules.items() if module is not None)
        print("ok")
    """)
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
