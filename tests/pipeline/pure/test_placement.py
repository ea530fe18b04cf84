"""Placements: which rank holds which stage, and the errors that name what is valid."""

from __future__ import annotations

import dataclasses

import pytest

from pipeline.pure.placement import Placement


def test_loop_puts_stage_s_on_rank_s_mod_r() -> None:
    p = Placement("loop", 4, 2)
    assert p.n_stages == 8
    assert [p.rank_of(s) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    assert [p.stages_of(r) for r in range(4)] == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert Placement("loop", 3, 3).stages_of(1) == (1, 4, 7)
    assert all(p.crosses(s) for s in range(7))  # every edge is a message, 3 -> 4 included


def test_v_goes_down_the_ranks_and_back_up() -> None:
    p = Placement("v", 4, 2)
    assert [p.stages_of(r) for r in range(4)] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert [p.rank_of(s) for s in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [s for s in range(7) if not p.crosses(s)] == [3]  # the turn stays on rank 3
    assert p.rank_of(0) == p.rank_of(7) == 0  # the first stage and the loss stage


@pytest.mark.parametrize("kind", ["loop", "v"])
def test_one_stage_per_rank_is_the_degenerate_case(kind: str) -> None:
    p = Placement(kind, 5, 1)
    assert p.n_stages == 5
    assert [p.stages_of(r) for r in range(5)] == [(r,) for r in range(5)]
    assert Placement.single(5) == Placement("loop", 5)


@pytest.mark.parametrize("kind,v", [("loop", 1), ("loop", 2), ("loop", 3), ("loop", 4), ("v", 2)])
@pytest.mark.parametrize("n_ranks", range(1, 9))
def test_every_stage_lives_on_exactly_one_rank(kind: str, v: int, n_ranks: int) -> None:
    p = Placement(kind, n_ranks, v)
    held = [s for r in range(n_ranks) for s in p.stages_of(r)]
    assert sorted(held) == list(range(p.n_stages))
    for r in range(n_ranks):
        assert list(p.stages_of(r)) == sorted(p.stages_of(r))  # ascending
        assert all(p.rank_of(s) == r for s in p.stages_of(r))


@pytest.mark.parametrize(
    "args,match",
    [
        (("ring", 2, 2), r"unknown placement kind 'ring'; valid kinds: \['loop', 'v'\]"),
        (("loop", 0, 2), "n_ranks must be >= 1, got 0"),
        (("loop", 2, 0), "stages_per_rank must be >= 1, got 0"),
        (("v", 2, 3), r"'v' holds 2 stages per rank.*got stages_per_rank=3.*'loop'"),
    ],
)
def test_bad_placements_say_what_is_valid(args: tuple[str, int, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Placement(*args)


def test_out_of_range_stages_and_ranks() -> None:
    p = Placement("v", 2, 2)
    with pytest.raises(ValueError, match=r"stage must be in \[0, 4\).*got 4"):
        p.rank_of(4)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\).*got -1"):
        p.stages_of(-1)


def test_frozen() -> None:
    p = Placement("loop", 2, 2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.n_ranks = 3  # type: ignore[misc]
