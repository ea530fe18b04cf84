"""A schedule's spec: checked where it is made, registered by name, read by every part;
torch.distributed.pipelining's schedule names resolve to ours without being listed."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipeline.pure.planner.schedule_facts import in_flight_counts, schedule_name, weight_copies
from pipeline.pure.schedule import (
    SCHEDULES,
    Action,
    Op,
    ScheduleSpec,
    get_schedule,
    is_stream,
    one_f_one_b,
    placement_of,
    register_schedule,
    spec_of,
    validate,
)
from pipeline.pure.schedule_spec import TORCH_SCHEDULE_ALIASES, TORCH_SCHEDULES_WITHOUT_EQUIVALENT
from pipeline.pure.simulate import StageCost, simulate


def _gpipe_backwards_reversed(n_stages: int, n_microbatches: int, stage: int) -> list[Action]:
    """A user's schedule: all forwards, then the backwards last micro-batch first."""
    forwards = [Action(Op.FORWARD, i, stage) for i in range(n_microbatches)]
    backwards = [Action(Op.BACKWARD, i, stage) for i in reversed(range(n_microbatches))]
    return [*forwards, *backwards, Action(Op.OPTIMIZER_STEP)]


@pytest.fixture
def registered() -> Iterator[ScheduleSpec]:
    spec = register_schedule(ScheduleSpec("reversed_gpipe", _gpipe_backwards_reversed))
    yield spec
    SCHEDULES.unregister("reversed_gpipe")


def test_a_registered_spec_validates_simulates_and_plans_like_a_built_in_one(
    registered: ScheduleSpec,
) -> None:
    assert get_schedule("Reversed_GPipe") is registered is spec_of("reversed_gpipe")
    validate("reversed_gpipe", 3, 4)
    result = simulate("reversed_gpipe", [StageCost(1.0, 2.0)] * 3, 4)
    assert result.schedule == "reversed_gpipe" and result.peak_in_flight == (4, 4, 4)
    assert in_flight_counts("reversed_gpipe", 3, 4) == [4, 4, 4]
    assert schedule_name(registered) == "reversed_gpipe" and weight_copies(registered) == 1
    assert placement_of(registered, 3) == placement_of("1f1b", 3)
    with pytest.raises(ValueError, match="'reversed_gpipe' is registered; pass replace=True"):
        register_schedule(ScheduleSpec("reversed_gpipe", _gpipe_backwards_reversed))


def test_built_in_specs_say_what_their_lists_need() -> None:
    assert SCHEDULES["1f1b"] is one_f_one_b and get_schedule("1f1b")(2, 2, 1)[0] == Action(
        Op.FORWARD, 0, 1
    )
    assert (SCHEDULES["2bw"].stream, SCHEDULES["2bw"].weight_copies) == (True, 2)
    assert SCHEDULES["pipemare"].asynchronous and is_stream("pipemare")
    assert (SCHEDULES["zbv"].placement, SCHEDULES["zbv"].stages_per_rank) == ("v", 2)
    assert SCHEDULES["zbh1"].split_backward and not SCHEDULES["1f1b"].split_backward
    assert spec_of(_gpipe_backwards_reversed).name == "_gpipe_backwards_reversed"


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"name": ""}, "non-empty string"),
        ({"build": 3}, "build must be callable"),
        ({"placement": "ring"}, "placement='ring' is not valid; valid: None"),
        ({"stages_per_rank": 2}, "needs a placement"),
        ({"stages_per_rank": 0, "placement": "loop"}, "stages_per_rank must be an int >= 1"),
        ({"stream": True, "placement": "v", "stages_per_rank": 2}, "one stage per rank"),
        ({"weight_copies": 0}, "weight_copies must be an int >= 1"),
    ],
)
def test_a_bad_spec_is_refused_where_it_is_made(kwargs: dict[str, object], match: str) -> None:
    fields: dict[str, object] = {"name": "mine", "build": _gpipe_backwards_reversed, **kwargs}
    with pytest.raises((ValueError, TypeError), match=match):
        ScheduleSpec(**fields)  # type: ignore[arg-type]


def test_registering_takes_only_specs() -> None:
    with pytest.raises(TypeError, match="takes a ScheduleSpec, got function"):
        register_schedule(_gpipe_backwards_reversed)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="a schedule is a registered name, a ScheduleSpec"):
        spec_of(3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "torch_name,ours",
    [
        ("Schedule1F1B", "1f1b"),
        ("ScheduleGPipe", "gpipe"),
        ("ScheduleInterleaved1F1B", "interleaved_1f1b"),
        ("ScheduleZBVZeroBubble", "zbv"),
        ("Interleaved1F1B", "interleaved_1f1b"),  # torch's short names (get_schedule_class)
        ("zbvzerobubble", "zbv"),  # any case
        ("GPipe", "gpipe"),
    ],
)
def test_torch_schedule_names_are_aliases_of_ours(torch_name: str, ours: str) -> None:
    assert get_schedule(torch_name) is SCHEDULES[ours] is spec_of(torch_name)
    assert TORCH_SCHEDULE_ALIASES.get(torch_name, ours) == ours


def test_an_alias_takes_stages_per_rank_and_runs_like_its_schedule() -> None:
    three = get_schedule("ScheduleInterleaved1F1B", stages_per_rank=3)
    assert three.name == "interleaved_1f1b" and three.stages_per_rank == 3
    assert placement_of("ScheduleZBVZeroBubble", 2) == placement_of("zbv", 2)
    validate("Schedule1F1B", 3, 4)
    assert simulate("ScheduleGPipe", [StageCost(1.0, 2.0)] * 2, 3).schedule == "gpipe"


def test_aliases_are_not_listed_as_schedules() -> None:
    assert sorted(SCHEDULES) == [
        "1f1b",
        "2bw",
        "gpipe",
        "interleaved_1f1b",
        "pipemare",
        "zbh1",
        "zbv",
    ]
    assert not set(SCHEDULES) & {name.lower() for name in TORCH_SCHEDULE_ALIASES}


def test_a_registered_name_wins_over_an_alias() -> None:
    mine = register_schedule(ScheduleSpec("schedulegpipe", _gpipe_backwards_reversed))
    try:
        assert get_schedule("ScheduleGPipe") is mine
    finally:
        SCHEDULES.unregister("schedulegpipe")
    assert get_schedule("ScheduleGPipe") is SCHEDULES["gpipe"]


@pytest.mark.parametrize(
    "torch_name,closest",
    [
        ("ScheduleInterleavedZeroBubble", "zbv, zbh1, interleaved_1f1b"),
        ("LoopedBFS", "interleaved_1f1b, gpipe"),
        ("ScheduleDualPipeV", "zbv"),
    ],
)
def test_a_torch_schedule_without_an_equivalent_names_our_closest(
    torch_name: str, closest: str
) -> None:
    assert torch_name.removeprefix("Schedule") in str(TORCH_SCHEDULES_WITHOUT_EQUIVALENT)
    with pytest.raises(ValueError, match=rf"pipelining's \w*{torch_name}.*closest: {closest};"):
        get_schedule(torch_name)


def test_an_unknown_name_lists_ours_and_the_aliases() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown schedule 'Schedule2BW'; valid schedules: \['1f1b', .*'zbv'\], or the "
        r"torch.distributed.pipelining names Schedule1F1B \(1f1b\), ScheduleGPipe \(gpipe\)",
    ):
        spec_of("Schedule2BW")
    with pytest.raises(ValueError, match="unknown schedule None"):
        get_schedule(None)  # type: ignore[arg-type]
