"""A real study of the second search space: the plain Transformer's hyper-parameters.

The harness's real stage processes, SQLite storage and the translation task, as in
`test_study.py`, with `search_space.name=transformer` and Optuna's random sampler: nothing
but the settings names the space, and every trial trains one of its Transformers.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from nas.study.run import run_study
from nas.study.space import architecture_of, configured_space
from nas.study.trials import counted
from search_spaces.architecture import from_json, summary
from search_spaces.transformer_space import PARAMETERS, TransformerSpace
from tests.nas.harness.common import TINY, composed

pytestmark = pytest.mark.multiprocess


def test_a_study_of_the_transformer_space_trains_its_architectures(tmp_path: Path) -> None:
    # the tiny study's cell count is an option of the Evolved Transformer space only: left
    # at its default, as the Transformer space refuses any other value
    tiny = [o for o in TINY if not o.startswith("search_space.max_cells")]
    config = composed(
        *tiny,
        f"studies_dir={tmp_path / 'studies'}",
        f"output_dir={tmp_path / 'run'}",
        "search_space.name=transformer",
        "sampler=random",
        "tracker=none",
        "study.name=plain",
        "study.n_trials=3",
        "train.steps=3",  # one evaluation, without greedy decoding (slow for 6 layers)
        "train.final_decode_pairs=0",
    )
    space = configured_space(config)
    assert isinstance(space, TransformerSpace)
    result = run_study(config)
    trials = optuna.load_study(study_name="plain", storage=config.storage_url).trials
    assert result.finished == 3 and sum(map(counted, trials)) == 3
    assert [t.state for t in trials] == [optuna.trial.TrialState.COMPLETE] * 3
    assert trials[0].params == space.seed_params(space.seeds()["transformer"])  # seeded first
    for trial in trials:
        assert set(trial.params) == set(PARAMETERS)  # the space's answers, and only those
        arch = from_json(architecture_of(trial, config))
        space.validate(arch)  # one of its Transformers
        assert trial.user_attrs["architecture"] == summary(arch)
        assert trial.values[0] == trial.user_attrs["validation_loss"]
