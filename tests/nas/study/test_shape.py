"""The study's shape chosen from the profile of its seed architectures (`nas.study.shape`).

In-process: the seeds are profiled here for real (the sandbox), the runtime's overheads are
given (their measurement starts processes: the CLI test measures them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nas.settings import NasSettings
from nas.study import shape
from pipeline.pure.planner.tryout import PredictionErrors
from tests.nas.harness.common import GIVEN_OVERHEADS, machine_cache, small_space


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's cost cache folder (the seeds are profiled once, by the first test)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture
def machine(profiled: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cost cache of the module's own, holding the runtime's overheads."""
    return machine_cache(monkeypatch, profiled)


def test_a_small_model_trains_on_one_single_stage_worker_per_core(machine: Path) -> None:
    chosen, choice = shape.resolve(small_space())
    assert choice is not None
    assert (choice.shape.n_stages, choice.shape.threads_per_stage) == (1, 1)
    assert choice.shape.workers == shape.cores()
    assert chosen.study.workers == shape.cores() and chosen.pipeline.auto_keys == ()
    assert chosen.pipeline.stage_count == 1 and chosen.pipeline.thread_count == 1
    rates = [row["predicted_samples_per_s"] for row in choice.tried]
    assert choice.predicted_samples_per_s == max(rates) > 0
    # what was profiled is kept for the stage processes and the next study
    assert len(shape.load_cache()) > 0 and shape.load_cache().overheads == GIVEN_OVERHEADS


def test_a_model_over_the_memory_budget_stays_pipelined(machine: Path) -> None:
    one = small_space("pipeline.n_stages=1", "study.workers=1", "pipeline.n_microbatches=1")
    _, alone = shape.resolve(one)
    assert alone is not None
    peak = alone.tried[0]["predicted_peak_bytes"]
    budgets = [int(0.75 * 0.8**k * peak) for k in range(12)]  # down to 6% of it

    def resolved(budget: int) -> tuple[tuple[NasSettings, shape.ShapeChoice] | None, bool]:
        """The shape chosen under `budget` (None: no shape fits it), and whether one stage
        still holds a seed there (recomputing its activations): fewer fit as it falls."""
        try:
            chosen, choice = shape.resolve(small_space(f"pipeline.memory_budget={budget}"))
        except ValueError:
            return None, False
        assert choice is not None
        return (chosen, choice), not all(r["reason"] for r in choice.tried if r["n_stages"] == 1)

    # the largest budget one stage cannot meet, by bisection over the falling budgets
    low, high = 0, len(budgets) - 1
    found, holds = resolved(budgets[high])
    if holds:
        pytest.fail(f"one stage fits every budget down to 6% of its {peak:,} bytes")
    while low < high:
        middle = (low + high) // 2
        shaped, holds = resolved(budgets[middle])
        if holds:
            low = middle + 1
        else:
            high, found = middle, shaped
    budget = budgets[high]
    assert found is not None, f"no shape fits {budget:,} bytes, where one stage first fails"
    chosen, choice = found
    assert choice.shape.n_stages >= 2
    assert 0 < choice.predicted_peak_bytes <= budget
    assert chosen.pipeline.memory_budget == budget


def test_values_set_by_hand_are_kept(machine: Path) -> None:
    chosen, choice = shape.resolve(small_space("pipeline.n_stages=2", "study.workers=1"))
    assert choice is not None
    assert (chosen.pipeline.stage_count, chosen.study.workers) == (2, 1)
    assert all(row["n_stages"] == 2 and row["workers"] == 1 for row in choice.tried)


def test_nothing_auto_is_left_alone(machine: Path) -> None:
    fixed = small_space("pipeline=cpu_2_stages", "study.workers=1")
    assert shape.resolve(fixed) == (fixed, None)


def test_one_worker_for_a_retraining(machine: Path) -> None:
    chosen, _ = shape.resolve_one(small_space())
    assert chosen.study.workers == 1
    assert chosen.pipeline.stage_count * (chosen.pipeline.thread_count or 1) <= shape.cores()


def test_an_unreadable_cache_is_measured_again(machine: Path) -> None:
    kept = machine.read_text()
    machine.write_text("{not json")
    try:
        assert shape.load_cache().overheads is None and len(shape.load_cache()) == 0
    finally:
        machine.write_text(kept)


def test_workers_share_the_layers_they_time_and_keep_the_errors_trials_learn(
    machine: Path,
) -> None:
    kept = machine.read_text()
    try:
        earlier = shape.load_cache()  # what an earlier study's trials learned
        earlier.set_errors(PredictionErrors.from_dict({"1f1b": [1.0, 1.0]}))
        shape.save_cache(earlier)
        worker, peer = shape.load_cache(), shape.load_cache()  # each read at its start
        trial = shape.load_cache()  # a trial's pipeline, which measured its plans
        trial.set_errors(PredictionErrors.from_dict({"1f1b": [1.3, 0.8]}))
        shape.learn_costs(trial)
        worker.put("a layer the worker timed", 0.1, 0.2, 64.0)
        shape.learn_costs(worker, errors=False)  # it sized a candidate: layers only
        saved = shape.load_cache()
        assert saved.errors.to_dict() == {"1f1b": [1.3, 0.8]}
        assert "a layer the worker timed" in saved
        shape.refresh_costs(peer)  # before sizing its next candidate
        assert peer.errors.to_dict() == {"1f1b": [1.3, 0.8]}
        assert peer.get("a layer the worker timed") == saved.get("a layer the worker timed")
        assert peer.overheads == GIVEN_OVERHEADS
    finally:
        machine.write_text(kept)


TORCHRUN_SHAPES = """
import dataclasses, json, os, sys
from pathlib import Path

from nas.study import shape
from tests.nas.harness.common import composed


def on_this_rank(settings, max_workers=None, architectures=None):
    # what a rank's own profile might choose: here each rank a different micro-batch count
    n_microbatches = 1 + int(os.environ["RANK"])
    pipeline = dataclasses.replace(settings.pipeline, n_microbatches=n_microbatches)
    return dataclasses.replace(settings, pipeline=pipeline), None


if __name__ == "__main__":
    shape.resolve = on_this_rank
    settings, _ = shape.resolve_one(composed("pipeline.n_microbatches=auto"))
    chosen = settings.pipeline
    out = {"n_microbatches": chosen.n_microbatches, "n_stages": chosen.n_stages}
    Path(sys.argv[1], f"rank{os.environ['RANK']}.json").write_text(json.dumps(out))
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_under_torchrun_every_rank_takes_rank_zeros_shape(tmp_path: Path) -> None:
    # each rank profiles for itself; ranks that kept their own micro-batch counts waited
    # for each other's messages until the group's timeout (a torchrun study hung so)
    script = tmp_path / "shapes.py"
    script.write_text(TORCHRUN_SHAPES)
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(script),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks == [{"n_microbatches": 1, "n_stages": 2}] * 2
