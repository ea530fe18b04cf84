"""A study on the stage pool: each candidate trains on the stages its own profile needs (one
where it fits the memory budget, two where it does not), several at once on one pool, every
trial recorded once; a worker killed while its job holds pool processes costs the pool
nothing and its trial is trained again."""

from __future__ import annotations

import dataclasses
import functools
import io
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest
from rich.console import Console

import pipeline
from nas.report import report_study
from nas.settings import NasSettings
from nas.study import shape
from nas.study.opening import open_study
from nas.study.pooled import warm_up
from nas.study.run import StudyResult, run_study
from nas.study.space import architecture_of, configured_space
from nas.study.trials import OWNER, counted
from nas.tasks import get_task
from nas.tracking.pool_plot import POOL_ENDED, POOL_PROCESSES, POOL_STARTED
from search_spaces.architecture import Architecture, from_json
from tests.nas.harness.common import tiny_settings

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300)]
COMPLETE = optuna.trial.TrialState.COMPLETE
POOLED = (
    "pipeline.per_candidate=true",
    "pipeline.n_stages=auto",
    "pipeline.n_microbatches=1",  # a pipeline overlaps nothing: one stage wins where it fits
    "study.workers=2",
    "tracker=none",
    "train.steps=2",
    "train.eval_every=1",
    "train.final_decode_pairs=0",
)


def least_on(settings: NasSettings, arch: Architecture, n_stages: int = 1) -> int:
    """The smallest per-stage budget `arch` fits on `n_stages` stages (its leanest memory
    plan)."""
    task = get_task(settings.task.name, **settings.task.options)
    return shape.least_stage_bytes(settings, arch, task, shape.machine_costs(), n_stages)


def budgeted(root: Path, *overrides: str) -> NasSettings:
    """Pooled settings with a per-stage budget between what the two seeds need on one
    stage: one of them fits it, the other needs two stages."""
    settings = tiny_settings(root, *POOLED, *overrides)
    seeds = configured_space(settings).seeds().values()
    low, high = sorted(least_on(settings, arch) for arch in seeds)
    assert low < high
    return dataclasses.replace(
        settings,
        pipeline=dataclasses.replace(settings.pipeline, memory_budget=(low + high) // 2),
    )


@dataclass(frozen=True)
class Pooled:
    settings: NasSettings
    result: StudyResult
    trials: list[optuna.trial.FrozenTrial]


@pytest.fixture(scope="module")
def pooled(tmp_path_factory: pytest.TempPathFactory) -> Pooled:
    root = tmp_path_factory.mktemp("pooled")
    settings = budgeted(root, "study.name=pooled", "study.n_trials=3")
    result = run_study(settings)
    study = optuna.load_study(study_name="pooled", storage=settings.storage_url)
    return Pooled(settings, result, study.trials)


def test_each_candidate_trains_on_the_stages_its_profile_needs(pooled: Pooled) -> None:
    """The seeds train (one on one stage, one on two); a proposal too large for two stages
    at the budget fails with that cause, and the study goes on."""
    settings, trials = pooled.settings, pooled.trials
    assert pooled.result.finished == 3 and [t.state for t in trials[:2]] == [COMPLETE] * 2
    budget = settings.pipeline.memory_budget
    assert budget is not None
    for trial in trials:
        arch, attrs = from_json(architecture_of(trial, settings)), trial.user_attrs
        if trial.state != COMPLETE:
            assert "no pipeline of at most 2 stages fits" in attrs["fail_reason"]
            assert least_on(settings, arch, 2) > budget
            continue
        needs = 2 if least_on(settings, arch) > budget else 1
        assert attrs["n_stages"] == needs == len(attrs["partition"]) == len(attrs[POOL_PROCESSES])
        assert attrs["shape"].startswith(f"2 workers x {needs} stage")
        assert attrs["predicted_samples_per_s"] > 0 and attrs["samples_per_s"] > 0
    assert {t.user_attrs["n_stages"] for t in trials[:2]} == {1, 2}  # both kinds, one pool


def test_jobs_share_the_pool_and_never_a_process(pooled: Pooled) -> None:
    """Every process trains one job at a time; the two workers' jobs ran side by side."""
    spans = [
        (p, t.user_attrs[POOL_STARTED], t.user_attrs[POOL_ENDED], t.number)
        for t in pooled.trials
        for p in t.user_attrs.get(POOL_PROCESSES, ())  # a candidate that fits no shape: none
    ]
    assert {p for p, *_ in spans} == {0, 1}
    for p, start, end, number in spans:
        for q, other_start, other_end, other in spans:
            if number != other and p == q:
                assert end <= other_start or other_end <= start, (number, other, p)
    owners = {t.user_attrs[OWNER] for t in pooled.trials}
    assert len(owners) == 2  # both workers asked trials of the one study


def test_the_report_draws_the_pool_over_time(pooled: Pooled) -> None:
    out = io.StringIO()
    report_study(pooled.settings, pooled.result, console=Console(file=out, width=200))
    picture = Path(pooled.settings.output_dir) / "stage_pool.png"
    assert str(picture) in out.getvalue() and picture.read_bytes().startswith(b"\x89PNG")


def test_the_pools_first_job_warms_every_process(tmp_path: Path) -> None:
    """`warm_up` (what a pooled study submits first) runs on every process of the pool and
    leaves them ready for a trial's job."""
    settings = tiny_settings(tmp_path, *POOLED)
    with pipeline.StagePool(2, timeout_s=60) as pool:
        assert pool.run(functools.partial(warm_up, settings=settings), 2) == [0, 1]


def kill_when_training(study: optuna.Study, killed: list[int]) -> None:
    """Kill (SIGKILL) the worker whose trial first reports an evaluation: its job holds
    pool processes then."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
            if trial.intermediate_values:
                pid = int(str(trial.user_attrs[OWNER]).rsplit(":", 1)[1])
                killed.append(trial.number)
                os.kill(pid, signal.SIGKILL)
                return
        time.sleep(0.05)


def test_a_worker_killed_while_its_job_holds_pool_processes_costs_nothing_but_its_trial(
    tmp_path: Path,
) -> None:
    settings = budgeted(tmp_path, "study.name=killed", "study.n_trials=2")
    killed: list[int] = []
    Path(settings.studies_dir).mkdir(parents=True)
    study = open_study(settings)  # created here: the watcher reads it as the workers start
    watcher = threading.Thread(target=kill_when_training, args=(study, killed), daemon=True)
    watcher.start()
    with pytest.raises(RuntimeError, match=r"worker \d ended with exit code -9"):
        run_study(settings)  # the other worker finishes the study, then the death is raised
    watcher.join()
    [number] = killed
    trials = study.trials
    assert trials[number].state == optuna.trial.TrialState.FAIL  # interrupted: asked again
    retried = [t for t in trials if t.user_attrs.get("retry_of") == number]
    assert len(retried) == 1 and retried[0].params == trials[number].params
    done = [t for t in trials if counted(t)]
    assert len(done) == 2 and all(t.state == COMPLETE for t in done)
    # the 2-stage candidate trained: the dead worker's processes came back to the pool
    assert sorted(t.user_attrs["n_stages"] for t in done) == [1, 2]
