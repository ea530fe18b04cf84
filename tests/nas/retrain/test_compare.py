"""The retrain stage's pieces that need no stage process: which trials become models, the
data order a training seed fixes, each model against the Evolved Transformer paired by
seed, how the report prints it, and how `benchmarks/search_quality.py` stores it."""

from __future__ import annotations

import importlib.util
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

import optuna
import pytest
import torch
from rich.console import Console

from nas.report import _report_retrained
from nas.retrain.results import against_seed_models, headline_objectives
from nas.retrain.stage import Model, RetrainResult, RetrainRun, compare, select_models
from nas.search.fidelity import Fidelity, record
from nas.study import training
from nas.study.space import architecture_of, configured_space
from nas.tasks import get_task
from search_spaces.architecture import to_json
from tests.nas.harness.common import tiny_settings

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


def _tell(study: optuna.Study, settings: Any, value: float, params: dict[str, Any] | None) -> None:
    """One complete trial of `value`: `params` replayed, or the sampler's proposal."""
    if params is not None:
        study.enqueue_trial(params)
    trial = study.ask()
    configured_space(settings).sample(trial)
    study.tell(trial, value)


def test_one_model_per_network_the_better_trial_and_the_seeds_apart(tmp_path: Path) -> None:
    settings = tiny_settings(tmp_path, "retrain.top_k=2", "retrain.seed_models=true")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    _tell(study, settings, 3.0, None)
    _tell(study, settings, 2.0, dict(study.trials[0].params))  # trial 0's network, better
    _tell(study, settings, 4.0, None)
    space = configured_space(settings)
    evolved = space.seeds()["evolved_transformer"]
    _tell(study, settings, 1.0, space.seed_params(evolved))  # the best: a seed's network
    trials = study.trials
    assert architecture_of(trials[1], settings) == architecture_of(trials[0], settings)
    assert architecture_of(trials[2], settings) != architecture_of(trials[0], settings)
    assert architecture_of(trials[3], settings) == to_json(evolved)

    models = select_models(study, settings)
    assert [(m.name, m.trial) for m in models] == [
        ("trial-1", 1),
        ("trial-2", 2),
        ("transformer", None),
        ("evolved_transformer", None),
    ]
    assert models[0].architecture == architecture_of(trials[1], settings)


def test_a_promoting_study_at_inherited_fidelity_retrains_measured_trials_only(
    tmp_path: Path,
) -> None:
    """An estimate beside measurements is not a pick: the promoted and the full trials are
    ranked, the better estimate is passed over (`nas.study.judging`, 4.)."""
    settings = tiny_settings(tmp_path, "retrain.top_k=2", "study.fidelity=inherited")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for value, fidelity in ((3.0, "full"), (1.0, "inherited"), (2.0, "promoted"), (4.0, "full")):
        trial = study.ask()
        configured_space(settings).sample(trial)
        for key, recorded in record(Fidelity(fidelity)).items():
            trial.set_user_attr(key, recorded)
        study.tell(trial, value)
    assert [m.trial for m in select_models(study, settings)] == [2, 0]
    unpromoted = replace(settings, study=replace(settings.study, promote=False))
    assert [m.trial for m in select_models(study, unpromoted)] == [1, 2]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))


def test_a_training_seed_alone_fixes_the_data_order(tmp_path: Path) -> None:
    """Retraining reads `training.batches(task, batch_size, seed)` for every model: the
    same batches for a seed whatever the global RNG (which building a model draws from)."""
    settings = tiny_settings(tmp_path)
    task = get_task(settings.task.name, **settings.task.options)

    def first(seed: int) -> list[Any]:
        return list(itertools.islice(training.batches(task, settings.train.batch_size, seed), 3))

    torch.manual_seed(1)
    seed_0 = first(0)
    torch.manual_seed(2)
    torch.rand(1000)  # another model's initialisation
    assert _same(first(0), seed_0)
    assert not _same(first(1), seed_0)


def _run(
    model: str, seed: int, loss: float | None, chrf: float = 0.0, trial: int | None = None
) -> RetrainRun:
    """A finished run (or, with `loss` None, a failed one) with its final figures."""
    if loss is None:
        return RetrainRun(model, seed, trial, {}, 100, error="memory plan does not fit")
    metrics = {"validation_loss": loss, "validation_chrf": chrf, "test_loss": loss + 1.0}
    return RetrainRun(model, seed, trial, {}, 100, steps=6, metrics=metrics)


# trial-3's seed 2 failed; the figures are binary fractions, so the differences are exact
RUNS = (
    _run("trial-3", 0, 1.0, 40.0, 3),
    _run("trial-3", 1, 1.25, 42.0, 3),
    _run("trial-3", 2, None),
    _run("transformer", 0, 1.75, 30.0),
    _run("transformer", 1, 2.0, 31.0),
    _run("transformer", 2, 2.0, 32.0),
    _run("evolved_transformer", 0, 1.5, 35.0),
    _run("evolved_transformer", 1, 1.5, 36.0),
    _run("evolved_transformer", 2, 1.75, 37.0),
)


# a translation's headline metrics: the runs have chrF, not BLEU nor exact match
HEADLINE = headline_objectives("translation")


def test_a_task_declares_the_metrics_the_models_are_compared_on() -> None:
    assert HEADLINE == ("validation_chrf", "validation_bleu", "validation_exact_match")
    language_model = ("validation_bits_per_char", "validation_accuracy")
    assert headline_objectives("charlm") == language_model
    # a user's task, named by import path, declares its own (here: its base class's)
    assert headline_objectives("tests.nas.harness.plugin_task:PerplexityCharLM") == language_model


def test_each_model_is_compared_with_the_evolved_transformer_on_the_seeds_both_trained() -> None:
    reference, paired = compare(RUNS, "validation_loss", headline=HEADLINE)
    assert reference == "evolved_transformer" and list(paired) == ["trial-3", "transformer"]
    assert list(paired["trial-3"]) == ["validation_loss", "validation_chrf"]  # what runs have
    assert list(compare(RUNS, "validation_loss", headline=())[1]["trial-3"]) == ["validation_loss"]
    loss, chrf = paired["trial-3"]["validation_loss"], paired["trial-3"]["validation_chrf"]
    assert loss.seeds == (0, 1) and loss.diffs == (-0.5, -0.25) and loss.wins == 2
    assert loss.mean == -0.375 and loss.stderr == pytest.approx(0.125)
    assert chrf.diffs == (5.0, 6.0) and chrf.wins == 2  # higher chrF is better
    worse = paired["transformer"]["validation_loss"]
    assert worse.n == 3 and worse.wins == 0 and worse.diffs == (0.25, 0.5, 0.25)


def test_without_the_evolved_transformer_the_best_seed_model_is_the_reference() -> None:
    runs = [run for run in RUNS if run.model != "evolved_transformer"]
    reference, paired = compare(runs, "validation_loss", headline=HEADLINE)
    assert reference == "transformer" and list(paired) == ["trial-3"]
    assert paired["trial-3"]["validation_loss"].diffs == (-0.75, -0.75)
    searched = [run for run in RUNS if run.trial is not None]
    assert compare(searched, "validation_loss", headline=HEADLINE) == (None, {})


def test_each_searched_model_is_judged_against_every_seed_model() -> None:
    against = against_seed_models(RUNS, "validation_loss", headline=HEADLINE)
    assert list(against) == ["evolved_transformer", "transformer"]  # best mean first
    assert all(list(models) == ["trial-3"] for models in against.values())
    vs_et = against["evolved_transformer"]["trial-3"]
    assert vs_et == compare(RUNS, "validation_loss", headline=HEADLINE)[1]["trial-3"]
    vs_transformer = against["transformer"]["trial-3"]["validation_loss"]
    assert vs_transformer.diffs == (-0.75, -0.75) and vs_transformer.wins == 2
    assert against["transformer"]["trial-3"]["validation_chrf"].diffs == (10.0, 11.0)
    searched = [run for run in RUNS if run.trial is not None]
    assert against_seed_models(searched, "validation_loss", headline=HEADLINE) == {}


def test_the_report_prints_the_paired_differences_between_validation_and_test(
    tmp_path: Path,
) -> None:
    reference, paired = compare(RUNS, "validation_loss", headline=HEADLINE)
    against = against_seed_models(RUNS, "validation_loss", headline=HEADLINE)
    result = RetrainResult(
        "s", RUNS, {}, "trial-3", "validation_loss", (), reference, paired, against
    )
    console = Console(record=True, width=250)
    _report_retrained(tiny_settings(tmp_path), result, console)
    text = console.export_text()
    lines = {line.strip().split("  ")[0]: line for line in text.splitlines() if line.strip()}
    row = lines["Δ val loss vs evolved_transformer"]
    assert "-0.375 ± 0.12 (2/2 better)" in row and "(0/3 better)" in row and " = " in row
    assert "+5.5 ± 0.5 (2/2 better)" in lines["Δ val chrf vs evolved_transformer"]
    order = [text.index(s) for s in ("validation loss", "Δ val loss", "test loss")]
    assert order == sorted(order)
    vs_transformer = next(line for line in text.splitlines() if "trial-3 vs transformer:" in line)
    assert "val loss -0.75 ± 0 (2/2 better)" in vs_transformer
    assert "val chrf +10.5 ± 0.5 (2/2 better)" in vs_transformer


def _benchmark() -> ModuleType:
    """`benchmarks/search_quality.py` as a module (it imports its sibling `common`)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(
        "search_quality", BENCHMARKS / "search_quality.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_benchmark_stores_seeds_figures_and_the_paired_difference_per_model() -> None:
    bench = _benchmark()  # a pick is retrained under its role's name: best-trial-3
    runs = [replace(run, model=f"best-{run.model}") if run.trial else run for run in RUNS]
    searched = bench._entry("best-trial-3", Model("trial-3", 3, {"d_model": 32}, "{}"), runs)
    assert searched["name"] == "trial-3" and searched["study"] == "best"
    assert searched["seeds"] == [0, 1] and searched["validation_loss"] == [1.0, 1.25]
    assert searched["chrf"] == [40.0, 42.0] and searched["params"] == 100
    vs = searched["vs_evolved_transformer"]
    assert vs["validation_loss"]["mean"] == -0.375 and vs["validation_loss"]["n"] == 2
    assert vs["validation_loss"]["wins"] == 2 and vs["chrf"]["wins"] == 2
    assert vs["validation_loss"]["stderr"] == pytest.approx(0.125)
    evolved = bench._entry(
        "evolved_transformer", Model("evolved_transformer", None, {}, "{}"), runs
    )
    assert evolved["seeds"] == [0, 1, 2] and evolved["vs_evolved_transformer"] is None
    json.dumps([searched, evolved], allow_nan=False)
    alone = bench._entry("best-trial-3", Model("trial-3", 3, {}, "{}"), runs[:3])
    assert alone["vs_evolved_transformer"] is None  # the Evolved Transformer not retrained
