"""The cost data model: validation, derived defaults, JSON round-trip, links."""

from __future__ import annotations

import json
import math

import pytest

from pipeline.pure.costs import (
    LayerCost,
    LinkCost,
    action_effects,
    costs_from_dict,
    costs_to_dict,
    from_json,
    kept_bytes,
    to_json,
)


def layer(key: str = "a", **kw: float) -> LayerCost:
    base: dict[str, float] = dict(
        forward_s=1.0,
        backward_s=2.0,
        activation_bytes=100,
        output_bytes=10,
        param_bytes=4,
        grad_bytes=4,
        optimizer_bytes=8,
    )
    base.update(kw)
    return LayerCost(key, **base)  # type: ignore[arg-type]


def test_derived_defaults() -> None:
    c = layer()
    assert c.compute_s == 3.0
    assert c.state_bytes == 16
    assert c.recompute_time == 1.0  # the forward again
    assert c.added_peak == 100 + 16
    assert c.isolated_peak == 100 + 16 + 10
    explicit = layer(recompute_s=0.5, added_peak_bytes=7, isolated_peak_bytes=9)
    assert (explicit.recompute_time, explicit.added_peak, explicit.isolated_peak) == (0.5, 7, 9)


@pytest.mark.parametrize(
    "field",
    [
        "forward_s",
        "backward_s",
        "activation_bytes",
        "output_bytes",
        "param_bytes",
        "grad_bytes",
        "optimizer_bytes",
        "recompute_s",
        "isolated_peak_bytes",
        "added_peak_bytes",
    ],
)
def test_negative_numbers_are_rejected(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        layer("a", **{field: -1})


@pytest.mark.parametrize("bad", [math.nan, math.inf, True, "3"])
def test_non_numbers_are_rejected(bad: object) -> None:
    with pytest.raises(ValueError, match="forward_s"):
        layer(forward_s=bad)  # type: ignore[arg-type]


def test_empty_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="key"):
        layer(key="")


def test_measured_float_bytes_round_to_ints() -> None:
    c = layer(activation_bytes=99.6)
    assert c.activation_bytes == 100 and isinstance(c.activation_bytes, int)


def test_json_round_trip() -> None:
    costs = [layer("a"), layer("b", recompute_s=0.25, isolated_peak_bytes=123), layer("c")]
    text = to_json(costs)
    data = json.loads(text)
    assert data["version"] == 1 and len(data["layers"]) == 3
    assert "recompute_s" not in data["layers"][0]  # unset optional fields are omitted
    assert from_json(text) == costs
    assert costs_from_dict(costs_to_dict(costs)) == costs


def test_json_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="version"):
        from_json(json.dumps({"version": 99, "layers": []}))
    with pytest.raises(ValueError, match="unknown fields"):
        costs_from_dict(
            {
                "version": 1,
                "layers": [{"key": "a", "forward_s": 1, "backward_s": 1, "colour": "red"}],
            }
        )
    with pytest.raises(ValueError, match="layer 0"):
        costs_from_dict({"version": 1, "layers": [{"key": "a"}]})


def test_link_time() -> None:
    link = LinkCost(bandwidth_bytes_per_s=1e9, latency_s=1e-5)
    assert link.time(0) == pytest.approx(1e-5)
    assert link.time(1e9) == pytest.approx(1 + 1e-5)
    assert LinkCost.free().time(1e12) == 0.0
    for bad in (0, -1, math.nan):
        with pytest.raises(ValueError, match="bandwidth"):
            LinkCost(bad)
    with pytest.raises(ValueError, match="latency"):
        LinkCost(1e9, -1)


def test_recomputed_layers_keep_their_input() -> None:
    costs = [layer("a", output_bytes=30), layer("b", output_bytes=500), layer("c")]
    assert [kept_bytes(costs, i) for i in range(3)] == [0, 30, 100]  # capped by activation
    host = LinkCost(1e3, 0.5)
    effects = action_effects(costs, ["recompute", "swap", "keep"], host)
    assert effects[0] == (1.0, 0)
    assert effects[1] == (pytest.approx(2 * (0.5 + 70 / 1e3)), 30)
    assert effects[2] == (0.0, 100)
    with pytest.raises(ValueError, match="unknown memory action"):
        action_effects(costs, ["keep", "drop", "keep"])
    with pytest.raises(ValueError, match="host link"):
        action_effects(costs, ["swap", "keep", "keep"])
    with pytest.raises(ValueError, match="2 memory actions for 3 layers"):
        action_effects(costs, ["keep", "keep"])


def test_a_recomputed_first_layer_keeps_the_micro_batch_it_was_given() -> None:
    """What the stage holds for its backward: the profiled input (0 where unrecorded)."""
    costs = [layer("a", input_bytes=40), layer("b"), layer("c")]
    assert kept_bytes(costs, 0) == 40
    assert action_effects(costs, ["recompute", "keep", "keep"])[0] == (1.0, 40)
    assert costs_from_dict(costs_to_dict(costs))[0].input_bytes == 40  # kept through JSON
