"""One record per schedule: the builder of its lists and the facts everything else reads.

A schedule's lists alone do not say everything the runtime and the planners need: whether
they span a stream of steps without a flush (2BW, PipeMare), where several stages per rank
go (interleaved 1F1B, ZB-V), how many weight copies a stage keeps, whether updates are
applied asynchronously. A `ScheduleSpec` holds those facts beside the builder, frozen and
checked where it is made, and is itself callable as the builder, so

    spec(n_stages, n_microbatches, stage)              a flushed schedule, one stage per rank
    spec(n_ranks, n_microbatches, rank)                several stages per rank (`placement`)
    spec(n_stages, n_microbatches, stage, n_steps)     a stream (`stream=True`)

returns the compute list. `pipeline.pure.schedule` keeps the registry (`SCHEDULES`,
`register_schedule`, `get_schedule`) that the validator, the simulator, the planners and the
runtime read; `spec_of` turns a name, a spec or a plain function (a flushed schedule with one
stage per rank) into a spec. A user's schedule registered with a spec validates, simulates,
plans and runs like a built-in one.

`torch.distributed.pipelining`'s schedule names are aliases of ours (`TORCH_SCHEDULE_ALIASES`:
"Schedule1F1B" or torch's short "1F1B" is "1f1b", "ScheduleInterleaved1F1B" is
"interleaved_1f1b", ...), resolved by `resolve_schedule_name` when a name is looked up
(`get_schedule`, `spec_of`, `ElasticPipeline(schedule=...)`). They live in their own table,
not in the registry, so whatever lists the schedules (`schedule="auto"`'s candidates, the
harness's valid values) lists each once; the torch schedules we have no equivalent of
(`TORCH_SCHEDULES_WITHOUT_EQUIVALENT`) raise an error naming our closest. Names only: this
package does not import `torch.distributed`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from pipeline.pure.actions import Action

__all__ = [
    "TORCH_SCHEDULES_WITHOUT_EQUIVALENT",
    "TORCH_SCHEDULE_ALIASES",
    "PlacementKind",
    "ScheduleSpec",
    "resolve_schedule_name",
]

PlacementKind = Literal["loop", "v"]  # `pipeline.pure.placement`


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule: its name, its list builder and what its lists imply (module doc)."""

    name: str
    build: Callable[..., list[Action]]
    stream: bool = False  # no flush: one list spans n_steps steps (a 4th argument)
    placement: PlacementKind | None = None  # several stages per rank, placed so; None: one
    stages_per_rank: int = 1
    weight_copies: int = 1  # parameter copies a stage keeps (2BW: 2)
    asynchronous: bool = False  # a micro-batch's forward and backward see different weights
    split_backward: bool = False  # its lists split backwards into BACKWARD_INPUT and _WEIGHT
    # the same schedule with another number of stages per rank (interleaved 1F1B); None:
    # `stages_per_rank` is the only one it has
    rechunk: Callable[[int], ScheduleSpec] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a schedule's name must be a non-empty string, got {self.name!r}")
        if not callable(self.build):
            raise TypeError(f"schedule {self.name!r}: build must be callable, got {self.build!r}")
        if self.placement not in (None, "loop", "v"):
            raise ValueError(
                f"schedule {self.name!r}: placement={self.placement!r} is not valid; "
                "valid: None (one stage per rank), 'loop', 'v'"
            )
        if not isinstance(self.stages_per_rank, int) or self.stages_per_rank < 1:
            raise ValueError(f"schedule {self.name!r}: stages_per_rank must be an int >= 1")
        if self.placement is None and self.stages_per_rank != 1:
            raise ValueError(
                f"schedule {self.name!r}: stages_per_rank={self.stages_per_rank} needs a "
                "placement ('loop' or 'v')"
            )
        if self.stream and self.placement is not None:
            raise ValueError(f"schedule {self.name!r}: a stream schedule has one stage per rank")
        if not isinstance(self.weight_copies, int) or self.weight_copies < 1:
            raise ValueError(f"schedule {self.name!r}: weight_copies must be an int >= 1")

    @property
    def multi_stage(self) -> bool:
        """Whether its lists are per rank, each action naming its stage."""
        return self.placement is not None

    def with_stages_per_rank(self, stages_per_rank: int | None) -> ScheduleSpec:
        """This schedule with `stages_per_rank` stages per rank (None: as it is)."""
        if stages_per_rank is None or stages_per_rank == self.stages_per_rank:
            return self
        if self.rechunk is None:
            raise ValueError(
                f"schedule {self.name!r} runs {self.stages_per_rank} stage(s) per rank, got "
                f"stages_per_rank={stages_per_rank}; only 'interleaved_1f1b' takes another "
                "count (any >= 1)"
            )
        return self.rechunk(stages_per_rank)

    def __call__(self, *args: Any) -> list[Action]:
        return self.build(*args)

    def __repr__(self) -> str:
        return f"ScheduleSpec({self.name!r})"


# torch.distributed.pipelining's schedule classes -> our registered name. torch's short names
# (`get_schedule_class`: "1F1B", "Interleaved1F1B", ...) are the class names less "Schedule".
TORCH_SCHEDULE_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "Schedule1F1B": "1f1b",
        "ScheduleGPipe": "gpipe",
        "ScheduleInterleaved1F1B": "interleaved_1f1b",
        "ScheduleZBVZeroBubble": "zbv",
    }
)
# torch schedules without an equivalent here -> our closest schedules
TORCH_SCHEDULES_WITHOUT_EQUIVALENT: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "ScheduleInterleavedZeroBubble": ("zbv", "zbh1", "interleaved_1f1b"),
        "ScheduleLoopedBFS": ("interleaved_1f1b", "gpipe"),
        "ScheduleDualPipeV": ("zbv",),
    }
)


def _spellings(torch_name: str) -> tuple[str, str]:
    """A torch schedule's class name and short name, in lower case (lookups ignore case)."""
    return torch_name.lower(), torch_name.removeprefix("Schedule").lower()


_ALIASES: dict[str, str] = {
    spelling: ours
    for torch_name, ours in TORCH_SCHEDULE_ALIASES.items()
    for spelling in _spellings(torch_name)
}
_NO_EQUIVALENT: dict[str, str] = {
    spelling: torch_name
    for torch_name in TORCH_SCHEDULES_WITHOUT_EQUIVALENT
    for spelling in _spellings(torch_name)
}


def resolve_schedule_name(name: object, registered: Collection[str]) -> str:
    """The registered name that `name` stands for: itself in lower case, or what a
    `torch.distributed.pipelining` schedule name is an alias of (any case; a registered name
    wins). Raises ValueError naming the valid names, and for a torch schedule without an
    equivalent, our closest."""
    lowered = name.lower() if isinstance(name, str) else ""
    if lowered in registered:
        return lowered
    if lowered in _ALIASES:
        return _ALIASES[lowered]
    valid = (
        f"valid schedules: {sorted(registered)}, or the torch.distributed.pipelining names "
        + ", ".join(f"{torch} ({ours})" for torch, ours in TORCH_SCHEDULE_ALIASES.items())
    )
    if lowered in _NO_EQUIVALENT:
        torch_name = _NO_EQUIVALENT[lowered]
        closest = ", ".join(TORCH_SCHEDULES_WITHOUT_EQUIVALENT[torch_name])
        raise ValueError(
            f"schedule {name!r}: torch.distributed.pipelining's {torch_name} has no "
            f"equivalent here; closest: {closest}; {valid}"
        )
    raise ValueError(f"unknown schedule {name!r}; {valid}")
