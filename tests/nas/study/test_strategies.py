"""`nas.study.strategies`: the study's sampler with the harness's proposal check, on a real
SQLite study (no processes)."""

from __future__ import annotations

from pathlib import Path

import optuna

from nas.search.lineage import KEY_GRAFT, KEY_PROPOSAL, KEY_ROLE
from nas.study.opening import open_study
from nas.study.space import configured_space
from nas.study.trials import MODEL_DIGEST, model_digest
from search_spaces.architecture import functional_key
from search_spaces.compile import parameter_count
from tests.nas.harness.common import composed


def test_evolution_proposes_only_models_inside_the_window_that_no_trial_trained(
    tmp_path: Path,
) -> None:
    """`search_2h`'s evolution on a real SQLite study, its objective the model's size: every
    child, mutated or grafted, is inside the window (the seeds are trained whatever their
    size) and no two trials train one model, so no proposal is refused."""
    settings = composed("experiment=search_2h", f"studies_dir={tmp_path}")
    study = open_study(settings)
    space = configured_space(settings)
    assert space.limits().startswith("the parameter window")

    def objective(trial: optuna.Trial) -> float:
        arch = space.sample(trial)
        trial.set_user_attr(MODEL_DIGEST, model_digest(functional_key(arch)))
        return float(parameter_count(arch))  # a deterministic fitness: smaller is better

    study.optimize(objective, n_trials=20)
    kids = [t for t in study.trials if t.system_attrs.get(KEY_ROLE) == "child"]
    assert len(kids) == 18 and all(KEY_PROPOSAL in t.system_attrs for t in kids)
    assert any(KEY_GRAFT in t.system_attrs for t in kids)  # recombined: valid all the same
    for kid in kids:
        space.validate(space.replay(kid.params))
    digests = [t.user_attrs[MODEL_DIGEST] for t in study.trials]
    assert len(set(digests)) == len(digests)  # never a model twice
