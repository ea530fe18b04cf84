"""`StepRunner`: this rank's way of running a step, the part of the facade that owns the wire.

`ElasticPipeline` holds one. It owns what a step needs besides the stage's layers: the links
to the neighbouring stages (`pipeline.distributed.links`) and this rank's lowered action list
for the flushed schedule (`pipeline.pure.schedule.stage_actions`). The facade's `train_step`
and `forward` (`pipeline.distributed.steps`) and its streams (`pipeline.distributed.stream`)
run the executor through it, on whatever stage the model holder has now:

    steps.train_step ──> runner.train_step(stage, ...) ──> flushed_step.train_step(links, list)
    steps.forward    ──> runner.infer(stage, ...)      ──> flushed_step.infer(links, F list)
    stream.Segment   ──> runner.open_run(stage, ...)   ──> executor.Run over the links
                     ──> runner.release_sends(below)        sends its agreements prove done
    facade.close     ──> runner.close()                     every send completed
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.distributed import executor, flushed_step
from pipeline.distributed.comm import Comm
from pipeline.distributed.links import PeerLink
from pipeline.local.carry import Carry
from pipeline.local.stage import Stage, StepTimes
from pipeline.pure.actions import Action, Op
from pipeline.pure.multi_stage import lower_ranks
from pipeline.pure.schedule import ScheduleLike, forward_only, placement_of, stage_actions

__all__ = ["StepRunner"]


class StepRunner:
    """The links to the stages on other ranks and this rank's action list for a flushed step."""

    def __init__(self, comm: Comm, schedule: ScheduleLike, n_microbatches: int) -> None:
        self.comm = comm
        rank, n_ranks = comm.rank, comm.world_size
        self.placement = placement_of(schedule, n_ranks)
        self._edges = {s: self._edge_pair(s) for s in self.placement.stages_of(rank)}
        self._actions = stage_actions(schedule, n_ranks, n_microbatches, rank)

    @property
    def sends_in_flight(self) -> int:
        """Sends posted to the neighbours and not yet waited for (read-only)."""
        return sum(link.sends_in_flight for link in self._neighbours())

    @property
    def last_rank(self) -> int:
        """The rank that holds the last stage (its outputs are the model's)."""
        return self.placement.rank_of(self.placement.n_stages - 1)

    def train_step(
        self,
        stages: Sequence[Stage],
        step: int,
        inputs: Sequence[Carry],
        targets: Sequence[Any],
        *,
        measure_memory: bool,
        on_nonfinite: str,
    ) -> tuple[float, StepTimes]:
        """One flushed step of this rank's list over its `stages` (`flushed_step.train_step`)."""
        return flushed_step.train_step(
            self._by_key(stages),
            self._edges,
            self.comm,
            self._actions,
            step,
            inputs,
            targets,
            measure_memory=measure_memory,
            on_nonfinite=on_nonfinite,
        )

    def infer(self, stages: Sequence[Stage], step: int, chunks: Sequence[Carry]) -> Carry:
        """The forward-only list over `len(chunks)` micro-batches: their outputs,
        concatenated, on every rank (`flushed_step.infer`)."""
        actions = self._forward_actions(len(chunks))
        return flushed_step.infer(
            self._by_key(stages), self._edges, self.comm, actions, step, chunks, self.last_rank
        )

    def open_run(
        self, stage: Stage, step: int, inputs: Mapping[int, Carry], targets: Mapping[int, Any]
    ) -> executor.Run:
        """A run over the links that a stream feeds action by action (one stage per rank)."""
        return executor.Run(self._by_key([stage]), self._edges, self.comm, step, inputs, targets)

    def release_sends(self, below: int) -> None:
        """Drop the sends of micro-batches numbered below `below`, known received
        (`PeerLink.release_sends`: a stream, once its agreement proves it)."""
        for link in self._neighbours():
            link.release_sends(below)

    def close(self) -> None:
        """Wait for every send still in flight."""
        for link in self._neighbours():
            link.wait_sends()

    # -- placement -------------------------------------------------------------------------
    def _edge_pair(self, stage: int) -> executor.Edges:
        return (self._edge(stage, stage - 1), self._edge(stage, stage + 1))

    def _edge(self, stage: int, neighbour: int) -> executor.Edge:
        if not 0 <= neighbour < self.placement.n_stages:
            return None
        peer = self.placement.rank_of(neighbour)
        return executor.LOCAL if peer == self.comm.rank else PeerLink(self.comm, peer)

    def _by_key(self, stages: Sequence[Stage]) -> dict[int, Stage]:
        """This rank's stages (ascending) by their global index, as its list names them."""
        held = self.placement.stages_of(self.comm.rank)
        if len(stages) != len(held):
            raise RuntimeError(f"rank {self.comm.rank} holds stages {held}, got {len(stages)}")
        return dict(zip(held, stages, strict=True))

    def _forward_actions(self, n_microbatches: int) -> list[Action]:
        """Inference's list: every forward, stage by stage (one stage per rank: `forward_only`)."""
        placement, rank = self.placement, self.comm.rank
        if placement.stages_per_rank == 1:
            return stage_actions(forward_only, placement.n_ranks, n_microbatches, rank)
        computes = [
            [
                Action(Op.FORWARD, i, s)
                for s in placement.stages_of(r)
                for i in range(n_microbatches)
            ]
            for r in range(placement.n_ranks)
        ]
        return lower_ranks(computes, placement)[rank]

    def _neighbours(self) -> list[PeerLink]:
        return executor.peer_links(self._edges)
