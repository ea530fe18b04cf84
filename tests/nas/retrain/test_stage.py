"""The retrain stage end to end: a stored study's best and both seeds retrained from scratch
with two training seeds on stage processes, once per module (`retrained`), then read back by
focused tests: paired on the task's headline metrics, exported, loaded alone, tracked in
W&B (each export a model artifact of its seed's run, read back from the offline run files,
the metrics' summaries defined, the run ids and export paths kept in the Optuna study), and
resumed with one more seed."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import optuna
import pytest

import nas
from nas.export.writing import TranslationModel
from nas.retrain.results import headline_objectives
from nas.retrain.stage import RetrainResult, retrain, retrain_models, select_models
from nas.settings import NasSettings, lower_is_better
from nas.study.run import run_study
from nas.study.space import configured_space
from nas.study.trials import counted
from nas.tasks import get_task
from nas.tracking import TRACKER_RUN_ID
from nas.tracking.exports import EXPORTED_MODELS
from nas.tracking.wandb.history import WandbArtifact, WandbRunData, find_run_files, read_run
from search_spaces.compile import parameter_count
from search_spaces.evolved_transformer import ParamWindow, sample, validate
from search_spaces.suggest import FixedSuggest
from tests.nas.harness.common import offline_wandb, tiny_settings

pytestmark = pytest.mark.multiprocess
RETRAIN = (
    "retrain.top_k=1",
    "retrain.seeds=[0,1]",
    "retrain.seed_models=true",
    "retrain.steps=6",
    "retrain.decode_pairs=4",
)


@dataclass(frozen=True)
class Retrained:
    """The module's study, searched and then retrained once (`retrained`): its folder,
    settings, stored study, trials that count, the retraining and the best trial's model."""

    root: Path
    settings: NasSettings
    study: optuna.Study
    trials: list[optuna.trial.FrozenTrial]
    result: RetrainResult
    best: str

    def tracked(self) -> list[WandbRunData]:
        """Every W&B run the search and the retrainings wrote, read back from its files."""
        return [read_run(path) for path in find_run_files(self.root / "run" / "tracking")]


@pytest.fixture(scope="module")
def retrained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Retrained]:
    """A four-trial study (both seeds, two proposals), then its best and both seed models
    retrained on two seeds, tracked in an offline W&B."""
    root = tmp_path_factory.mktemp("retrain")
    with pytest.MonkeyPatch.context() as monkeypatch:
        offline_wandb(monkeypatch, root)
        settings = tiny_settings(
            root,
            "study.name=r",
            "study.n_trials=4",
            "train.steps=2",  # the trials: what is retrained runs retrain.steps=6
            "tracker=wandb",
            "search_space.param_window=[0.3,0.9]",
            f"retrain.models_dir={root / 'models'}",
            *RETRAIN,
        )
        run_study(settings)
        study = optuna.load_study(study_name="r", storage=settings.storage_url)
        trials = [t for t in study.trials if counted(t)]  # proposals outside the window are not
        result = retrain(settings)
        fitness = settings.study.fitness  # the seeds' trials are retrained as seeds
        proposals = sorted(trials[2:], key=lambda t: lower_is_better(fitness, t.values[0]))
        best = f"trial-{proposals[0].number}"
        yield Retrained(root, settings, study, trials, result, best)


@pytest.mark.timeout(600)
def test_the_search_trains_proposals_in_the_window_and_the_seeds(retrained: Retrained) -> None:
    trials = retrained.trials
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 4
    # the window is relative to the seed Transformer; the seeds themselves are exempt
    window = ParamWindow(0.3, 0.9, layers=2)
    for trial in trials[2:]:
        proposed = sample(FixedSuggest(trial.params), d_model=[32], cells=(1, 1), window=None)
        validate(proposed, window=window)
    seeds = configured_space(retrained.settings).seeds().values()
    seed_sizes = [parameter_count(arch) for arch in seeds]
    assert max(seed_sizes) > 0.9 * window.reference(32, False)  # trained all the same


def test_the_best_and_both_seeds_are_retrained_and_paired_on_the_headline_metrics(
    retrained: Retrained,
) -> None:
    result, best = retrained.result, retrained.best
    assert sorted(result.exported) == sorted([best, "transformer", "evolved_transformer"])
    assert [(r.model, r.seed) for r in result.runs] == [
        (m, s) for m in (best, "transformer", "evolved_transformer") for s in (0, 1)
    ]
    assert all(r.error is None and r.steps == 6 for r in result.runs)
    for run in result.runs:  # where each run's seconds went (`nas.study.phases`)
        spent = run.time_s
        assert min(spent["build"], spent["train"], spent["evaluate"], spent["decode"]) > 0
        assert sum(v for k, v in spent.items() if k != "total") == pytest.approx(spent["total"])
    assert result.selected in result.exported
    # each model against the Evolved Transformer, paired on both training seeds, on the
    # fitness and every headline metric of the task
    assert result.reference == "evolved_transformer"
    assert sorted(result.paired) == sorted([best, "transformer"])
    assert all(
        pair.n == 2 and pair.seeds == (0, 1)
        for pairs in result.paired.values()
        for pair in pairs.values()
    )
    compared = ["validation_loss", *headline_objectives(retrained.settings.task.name)]
    assert len(compared) == 4 and all(list(pairs) == compared for pairs in result.paired.values())


def test_each_export_loads_alone_and_scores_what_it_recorded(retrained: Retrained) -> None:
    result, settings = retrained.result, retrained.settings
    task = get_task(settings.task.name)
    for name, folder in result.exported.items():
        metrics = json.loads((Path(folder) / "metrics.json").read_text())
        chosen = next(r for r in result.runs if r.model == name and r.seed == metrics["seed"])
        assert metrics["validation_loss"] == chosen.metrics["validation_loss"]
        model = nas.load_model(folder)  # one process: no pipeline, Optuna or W&B
        assert isinstance(model, TranslationModel) and not model.training
        alone = task.evaluate(model, "validation", batch_size=settings.train.batch_size, decode=4)
        assert alone["loss"] == pytest.approx(metrics["validation_loss"], abs=1e-5)
        assert alone["accuracy"] == pytest.approx(metrics["validation_accuracy"], abs=1e-6)
        for headline in type(task).headline_metrics:  # recorded by their own names too
            assert alone[headline] == metrics[headline] == metrics[f"validation_{headline}"]
        assert metrics["steps"] == 6 and metrics["params"] == chosen.parameters
        assert "test_loss" in metrics and (Path(folder) / "config.yaml").exists()


def test_every_run_is_tracked_and_each_export_is_its_seeds_artifact(
    retrained: Retrained,
) -> None:
    result, settings = retrained.result, retrained.settings
    runs = retrained.tracked()
    retrain_runs = [run for run in runs if run.job_type == "retrain"]
    assert sorted(run.name for run in retrain_runs) == sorted(
        f"r-retrain-{r.model}-seed-{r.seed}" for r in result.runs
    )
    assert all(run.group == "r" and run.exit_code == 0 for run in retrain_runs)
    assert all("validation_chrf" in r.summary and "test_loss" in r.summary for r in retrain_runs)
    assert_metric_summaries_are_defined(retrain_runs)
    logged = assert_each_export_is_an_artifact_of_its_seeds_run(
        settings, result.exported, retrain_runs
    )
    for name, artifact in logged.items():  # the files as exported; only the run records
        differences = artifact.differences(result.exported[name])  # were written after
        assert all(path.startswith("runs/seed-") for path in differences), differences
    assert models_logged(retrain_runs) == len(result.exported)  # by the exported seeds' runs
    # every trial that trained keeps its W&B run's id, set while it ran
    by_name = {run.name: run for run in runs}
    assert {t.number: t.user_attrs[TRACKER_RUN_ID] for t in retrained.trials} == {
        t.number: by_name[f"r-trial-{t.number}"].run_id for t in retrained.trials
    }


@pytest.mark.timeout(600)
def test_selection_seeds_choose_among_the_top_k_and_other_seeds_judge_the_winner(
    retrained: Retrained, tmp_path: Path
) -> None:
    shutil.copytree(retrained.root / "studies", tmp_path / "studies")  # its two proposals
    settings = tiny_settings(
        tmp_path,
        "study.name=r",
        "train.steps=2",
        "search_space.param_window=[0.3,0.9]",
        f"retrain.models_dir={tmp_path / 'models'}",
        "retrain.top_k=2",
        "retrain.selection_seeds=[5]",
        "retrain.seeds=[0]",  # one judging seed: enough to show it is not the choosing one
        "retrain.seed_models=true",
        "retrain.steps=4",
        "retrain.decode_pairs=2",
    )
    result = retrain(settings)
    selection = result.selection
    assert selection is not None and {r.seed for r in selection.runs} == {5}
    searched = [r.model for r in selection.runs]
    assert len(searched) == 2 and all(name.startswith("trial-") for name in searched)
    winner = min(selection.runs, key=lambda r: r.metrics["validation_loss"]).model
    assert selection.selected == winner
    assert [(r.model, r.seed) for r in result.runs] == [  # judged on seeds no choice saw
        (m, 0) for m in (winner, "transformer", "evolved_transformer")
    ]
    assert sorted(result.paired) == sorted([winner, "transformer"])


@pytest.mark.timeout(600)
def test_a_resumed_retraining_trains_only_the_missing_seed(retrained: Retrained) -> None:
    """The best again with a third seed, as a stopped retraining resumes (this module's
    last test: it adds a run to the retraining the others read)."""
    result, best = retrained.result, retrained.best
    more = replace(retrained.settings, retrain=replace(retrained.settings.retrain, seeds=(0, 1, 2)))
    [chosen_model] = [m for m in select_models(retrained.study, more) if m.name == best]
    again = retrain_models(more, [chosen_model])
    before = {(r.model, r.seed): r for r in result.runs}
    assert [(r.model, r.seed) for r in again.runs] == [(best, s) for s in (0, 1, 2)]
    for run in again.runs:  # read back from its record, not trained again (same seconds)
        assert run == before.get((run.model, run.seed), run)
    per_seed = json.loads((Path(again.exported[best]) / "metrics.json").read_text())["per_seed"]
    assert [entry["seed"] for entry in per_seed] == [0, 1, 2]
    tracked = [run for run in retrained.tracked() if run.job_type == "retrain"]
    names = [run.name for run in tracked]
    assert len(names) == len(set(names)) == 7  # the first six were not tracked twice
    # the best's export is its best seed of three now: the study's record follows it
    assert_each_export_is_an_artifact_of_its_seeds_run(more, again.exported, tracked)
    assert models_logged(tracked) == len(result.exported) + (seed_exported(again, best) == 2)


def models_logged(runs: list[WandbRunData]) -> int:
    return sum(artifact.type == "model" for run in runs for artifact in run.artifacts)


def seed_exported(result: RetrainResult, model: str) -> int:
    """The seed whose weights `model`'s export holds."""
    return int(json.loads((Path(result.exported[model]) / "metrics.json").read_text())["seed"])


def assert_metric_summaries_are_defined(runs: list[WandbRunData]) -> None:
    """Losses summarise as their minimum and last value, a translation's chrF, exact match and
    accuracy as their maximum and last (the task's declared directions), every metric against
    the logged `step`."""
    for run in runs:
        definitions = run.metric_definitions
        assert definitions["*"].glob and definitions["*"].step_metric == "step", run.name
        for key in ("loss", "validation_loss"):
            assert definitions[key].summary == ("min", "last"), (run.name, key)
        for key in ("validation_chrf", "validation_accuracy", "validation_exact_match"):
            assert definitions[key].summary == ("max", "last"), (run.name, key)
        assert set(run.summary["validation_loss"]) == {"min", "last"}
        assert run.summary["validation_chrf"]["max"] >= run.summary["validation_chrf"]["last"]


def assert_each_export_is_an_artifact_of_its_seeds_run(
    settings: NasSettings, exported: dict[str, str], runs: list[WandbRunData]
) -> dict[str, WandbArtifact]:
    """The run of the seed an export holds logged the folder as a model artifact with its
    figures; the study records the folder and that run's id. Returns the artifacts."""
    by_name = {run.name: run for run in runs}
    artifacts: dict[str, WandbArtifact] = {}
    study = optuna.load_study(study_name="r", storage=settings.storage_url)
    recorded = study.user_attrs[EXPORTED_MODELS]
    assert set(exported) <= set(recorded)
    for name, folder in exported.items():
        metrics = json.loads((Path(folder) / "metrics.json").read_text())
        seed = metrics["seed"]
        run = by_name[f"r-retrain-{name}-seed-{seed}"]
        [artifact] = [a for a in run.artifacts if a.type == "model"]
        assert artifact.name == f"r-{name}"
        assert {"model.safetensors", "metrics.json"} <= set(artifact.files)
        assert artifact.metadata["seed"] == seed and artifact.metadata["model"] == name
        assert artifact.metadata["trial"] == metrics["trial"]
        assert artifact.metadata["parameters"] == metrics["params"]
        assert artifact.metadata["validation_loss"] == metrics["validation_loss"]
        assert recorded[name] == {
            "folder": str(Path(folder).resolve()),
            "seed": seed,
            "trial": metrics["trial"],
            "tracker_run_id": run.run_id,
        }
        artifacts[name] = artifact
    return artifacts


def test_retraining_a_study_that_does_not_exist_names_it(tmp_path: Path) -> None:
    settings = tiny_settings(tmp_path, "study.name=missing", "stages=[retrain]")
    with pytest.raises(ValueError, match="no study 'missing' in sqlite:.*run the search first"):
        retrain(settings)
