"""`nas.search.agreement`: an estimate read against the truth (pure, no processes)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from nas.paired import PairedDifference, paired_difference
from nas.search.agreement import agreement, kendall_tau, noise_ceiling


def truth_of(means: dict[str, float], stderr: float = 0.001) -> dict[str, PairedDifference]:
    """Paired differences with these means and one standard error (two seeds apart by it)."""
    half = stderr  # two seeds at mean -/+ half: sd = half * sqrt(2), s.e. = half
    return {
        name: paired_difference({1: m - half, 2: m + half}, {1: 0.0, 2: 0.0})
        for name, m in means.items()
    }


def brute_tau(x: list[float], y: list[float]) -> float:
    """Kendall's tau-a by counting pairs (no ties here, so it equals tau-b)."""
    pairs = list(itertools.combinations(range(len(x)), 2))
    score = sum(math.copysign(1, (x[i] - x[j]) * (y[i] - y[j])) for i, j in pairs)
    return score / len(pairs)


def test_kendall_tau_counts_concordant_pairs() -> None:
    rng = random.Random(0)
    for _ in range(20):
        x = [rng.random() for _ in range(9)]
        y = [rng.random() for _ in range(9)]
        assert kendall_tau(x, y) == pytest.approx(brute_tau(x, y))
    assert math.isnan(kendall_tau([1.0], [2.0]))
    with pytest.raises(ValueError, match="one length"):
        kendall_tau([1.0, 2.0], [1.0])


def test_a_perfect_estimate_agrees_in_every_figure() -> None:
    means = {f"m{i}": (i - 5) * 0.01 for i in range(12)}  # decided: |mean| >= 0.01 >> 2 s.e.
    found = agreement(truth_of(means), dict(means), cost_share=0.1, resamples=300)
    assert found.candidates == 12 and found.kendall_tau == pytest.approx(1.0)
    assert found.tau_low <= found.kendall_tau <= found.tau_high
    assert found.decided == 11  # m5's mean is 0: undecided
    assert found.sign_accuracy == 1.0 and found.top1 and found.top_k_share == 1.0
    assert found.cost_share == 0.1


def test_a_reversed_estimate_disagrees_and_an_undecided_truth_is_left_out_of_signs() -> None:
    means = {"a": -0.03, "b": -0.01, "c": 0.0005, "d": 0.02}
    estimate = {"a": 0.03, "b": 0.01, "c": -0.02, "d": -0.05}
    found = agreement(truth_of(means), estimate, cost_share=0.2, top_k=2, resamples=300)
    assert found.kendall_tau == pytest.approx(-1.0)
    assert found.decided == 3  # c is within 2 s.e. of the reference
    assert found.sign_accuracy == 0.0 and not found.top1 and found.top_k_share == 0.0
    json_ready = found.to_dict()
    assert json_ready["kendall_tau"] == pytest.approx(-1.0) and json_ready["top_k"] == 2


def test_candidates_missing_on_one_side_are_left_out_and_too_few_are_refused() -> None:
    means = {"a": -0.03, "b": -0.01, "c": 0.02}
    found = agreement(truth_of(means), {"a": 1.0, "b": 2.0, "z": 0.0}, cost_share=0.1, top_k=1)
    assert found.candidates == 2 and math.isnan(found.tau_low)  # 2: nothing to resample
    with pytest.raises(ValueError, match="at least 2 candidates"):
        agreement(truth_of(means), {"a": 1.0, "b": math.nan}, cost_share=0.1)
    with pytest.raises(ValueError, match="top_k=5 is not valid"):
        agreement(truth_of(means), dict(a=1.0, b=2.0, c=3.0), cost_share=0.1, top_k=5)


def test_the_noise_ceiling_is_the_tau_between_two_seeds_of_the_truth() -> None:
    first = {"a": -0.02, "b": 0.01, "c": 0.03, "d": -0.01}
    second = {"a": -0.01, "b": 0.02, "c": 0.01, "d": -0.03, "e": 0.5}  # e: one seed only
    names = ["a", "b", "c", "d"]
    assert noise_ceiling(first, second) == pytest.approx(
        brute_tau([first[n] for n in names], [second[n] for n in names])
    )
