"""Bad knobs are refused before any process talks to another, naming the value."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pipeline import PipelineOptions


@pytest.mark.parametrize(
    "field,value,match",
    [
        ("n_microbatches", 0, "n_microbatches must be a positive int, got 0"),
        ("n_microbatches", 2.0, "n_microbatches must be a positive int, got 2.0"),
        ("memory_budget", -1, "memory_budget must be a positive int, got -1"),
        ("rebalance_every", 0, "rebalance_every must be a positive int"),
        ("rebalance_horizon", True, "rebalance_horizon must be a positive int, got True"),
        ("measure_memory_every", 0, "measure_memory_every must be a positive int"),
        ("rebalance_settle", -1, "rebalance_settle must be an int >= 0, got -1"),
        ("rebalance_on_drift", 0.0, "rebalance_on_drift must be a fraction > 0, got 0.0"),
        ("profile", "guess", r"profile must be one of \('sandbox', 'estimate'\), got 'guess'"),
        ("on_nonfinite", "warn", r"on_nonfinite must be one of \('raise', 'ignore'\)"),
        ("handoff", (1, -1), r"handoff must be layer counts >= 0, got \(1, -1\)"),
    ],
)
def test_a_bad_knob_names_its_value_and_what_is_valid(field: str, value: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PipelineOptions(**{field: value})


def test_defaults_are_documented_values_and_frozen() -> None:
    options = PipelineOptions(rebalance_on_drift=0.1, memory_budget=1 << 20, rebalance_settle=0)
    assert dataclasses.asdict(PipelineOptions()) == {
        "n_microbatches": 4,
        "memory_budget": None,
        "profile": "sandbox",
        "rebalance_every": None,
        "rebalance_on_drift": None,
        "rebalance_horizon": 100,
        "rebalance_settle": 3,
        "measure_memory_every": 10,
        "on_nonfinite": "raise",
        "pipemare": None,
        "handoff": None,
    }
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.n_microbatches = 8  # type: ignore[misc]
