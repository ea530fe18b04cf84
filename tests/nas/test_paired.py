"""Paired differences by training seed (`nas.paired`): the figures, the seeds they pair on,
and which seed model the others are compared with."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from nas.paired import REFERENCE, paired_difference, reference_model


def test_the_difference_is_model_minus_reference_seed_by_seed() -> None:
    model = {0: 1.0, 1: 2.0, 2: 3.0}
    reference = {0: 1.5, 1: 2.1, 2: 2.9}
    pair = paired_difference(model, reference)  # a loss: lower is better
    assert pair.seeds == (0, 1, 2) and pair.n == 3
    assert pair.diffs == pytest.approx((-0.5, -0.1, 0.1))
    assert pair.mean == pytest.approx(-0.5 / 3)
    assert pair.stderr == pytest.approx(statistics.stdev([-0.5, -0.1, 0.1]) / math.sqrt(3))
    assert pair.signs == (1, 1, -1) and pair.wins == 2


def test_a_metric_to_maximize_counts_higher_as_better() -> None:
    pair = paired_difference({0: 50.0, 1: 40.0}, {0: 45.0, 1: 42.0}, maximize=True)
    assert pair.diffs == (5.0, -2.0) and pair.signs == (1, -1) and pair.wins == 1
    assert pair.mean == pytest.approx(1.5)


def test_a_tie_is_neither_better_nor_worse() -> None:
    pair = paired_difference({0: 1.0, 1: 1.0}, {0: 1.0, 1: 2.0})
    assert pair.signs == (0, 1) and pair.wins == 1


def test_one_shared_seed_has_a_mean_but_no_standard_error() -> None:
    pair = paired_difference({3: 2.0}, {3: 2.5})
    assert pair.n == 1 and pair.mean == pytest.approx(-0.5) and pair.wins == 1
    assert math.isnan(pair.stderr)


def test_only_the_seeds_both_trained_with_finite_figures_are_paired() -> None:
    model = {0: 1.0, 1: 2.0, 2: 3.0, 4: math.nan}  # seed 0: the reference failed; 4 diverged
    reference = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}  # seed 3: the model failed
    pair = paired_difference(model, reference)
    assert pair.seeds == (1, 2) and pair.diffs == (1.0, 2.0) and pair.n == 2
    assert pair.wins == 0 and pair.stderr == pytest.approx(0.5)


def test_no_shared_seed_gives_no_figures_and_plain_json() -> None:
    pair = paired_difference({0: 1.0}, {1: 1.0})
    assert pair.n == 0 and pair.wins == 0 and pair.seeds == ()
    assert math.isnan(pair.mean) and math.isnan(pair.stderr)
    plain = pair.to_dict()
    assert plain["mean"] is None and plain["stderr"] is None and plain["n"] == 0
    json.dumps(plain, allow_nan=False)  # strict JSON accepts it


def test_to_dict_keeps_the_figures() -> None:
    plain = paired_difference({0: 1.0, 1: 3.0}, {0: 2.0, 1: 2.0}).to_dict()
    assert plain == {
        "mean": 0.0,
        "stderr": pytest.approx(1.0),
        "n": 2,
        "wins": 1,
        "seeds": [0, 1],
        "diffs": [-1.0, 1.0],
        "signs": [1, -1],
    }


def test_the_evolved_transformer_is_the_reference_when_it_trained() -> None:
    # even when the Transformer did better: the search must beat the Evolved Transformer
    assert reference_model({"transformer": 1.0, REFERENCE: 2.0}) == REFERENCE


def test_without_the_evolved_transformer_the_best_seed_model_is_the_reference() -> None:
    failed = {REFERENCE: math.nan, "transformer": 2.0, "other": 3.0}  # every ET seed failed
    assert reference_model(failed) == "transformer"
    assert reference_model(failed, maximize=True) == "other"
    assert reference_model({"transformer": math.nan}) is None
    assert reference_model({}) is None
