"""Which rank holds which stage: the placement of S = v * R stages on R ranks.

A schedule with several stages per rank (`pipeline.pure.interleaved`, `zbv` in
`pipeline.pure.zero_bubble`) cuts the model into S = v * R stages and gives each rank v of
them. Where they go decides which edges of the pipeline are messages between ranks and which
are hand-overs inside one rank, so lowering (`pipeline.pure.multi_stage`), the wire check
(`pipeline.pure.wire_order`), the simulator and the runtime all read it from one object::

    loop  (interleaved, Megatron)   stage s on rank s mod R; R = 4, v = 2:
              rank 0: stages 0, 4   rank 1: 1, 5   rank 2: 2, 6   rank 3: 3, 7
          every edge crosses ranks; rank R - 1 sends its activations round to rank 0
    v     (ZB-V)                    rank r holds stages r and 2R - 1 - r; R = 4:
              rank 0: stages 0, 7   rank 1: 1, 6   rank 2: 2, 5   rank 3: 3, 4
          the model goes down the ranks and back up: rank 0 holds the first stage and the
          loss stage, and the turn (stages R - 1 -> R) stays on rank R - 1

One stage per rank (v = 1) is the degenerate case of both: stage s on rank s.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KINDS", "Placement"]

KINDS = ("loop", "v")


@dataclass(frozen=True)
class Placement:
    """`stages_per_rank` stages on each of `n_ranks` ranks, placed as `kind` says."""

    kind: str
    n_ranks: int
    stages_per_rank: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown placement kind {self.kind!r}; valid kinds: {list(KINDS)}")
        if self.n_ranks < 1:
            raise ValueError(f"n_ranks must be >= 1, got {self.n_ranks}")
        if self.stages_per_rank < 1:
            raise ValueError(f"stages_per_rank must be >= 1, got {self.stages_per_rank}")
        if self.kind == "v" and self.stages_per_rank not in (1, 2):
            raise ValueError(
                f"placement 'v' holds 2 stages per rank (1: one stage per rank), "
                f"got stages_per_rank={self.stages_per_rank}; use 'loop' for "
                "more"
            )

    @classmethod
    def single(cls, n_ranks: int) -> Placement:
        """One stage per rank: stage s on rank s (every schedule with one stage per rank)."""
        return cls("loop", n_ranks, 1)

    @property
    def n_stages(self) -> int:
        return self.stages_per_rank * self.n_ranks

    def rank_of(self, stage: int) -> int:
        """The rank that holds `stage`."""
        if not 0 <= stage < self.n_stages:
            raise ValueError(f"stage must be in [0, {self.n_stages}) for {self}, got {stage}")
        if self.kind == "v" and stage >= self.n_ranks:
            return self.n_stages - 1 - stage
        return stage % self.n_ranks

    def stages_of(self, rank: int) -> tuple[int, ...]:
        """The stages `rank` holds, ascending."""
        if not 0 <= rank < self.n_ranks:
            raise ValueError(f"rank must be in [0, {self.n_ranks}) for {self}, got {rank}")
        if self.kind == "v" and self.stages_per_rank == 2:
            return (rank, self.n_stages - 1 - rank)
        return tuple(rank + k * self.n_ranks for k in range(self.stages_per_rank))

    def crosses(self, stage: int) -> bool:
        """True if the edge stage -> stage + 1 joins two ranks (a message, not a hand-over)."""
        return self.rank_of(stage) != self.rank_of(stage + 1)
