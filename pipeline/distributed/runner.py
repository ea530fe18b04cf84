"""`StepRunner`: this rank's way of running a step, the part of the facade that owns the wire.

`ElasticPipeline` holds one. It owns what a step needs besides the stage's layers: the links
to the neighbouring stages (`pipeline.distributed.links`) and this rank's lowered action list
for the flushed schedule (`pipeline.pure.schedule.stage_actions`). The facade's `train_step`
and `forward` (`pipeline.distributed.steps`) and its streams (`pipeline.distributed.stream`)
run the executor through it, on whatever stage the model holder has now:

    steps.train_step ──> runner.train_step(stage, ...) ──> executor.train_step(links, list)
    steps.forward    ──> runner.infer(stage, ...)      ──> executor.infer(links, F list)
    stream.Segment   ──> runner.open_run(stage, ...)   ──> executor.Run over the links
                     ──> runner.release_sends(below)        sends its agreements prove done
    facade.close     ──> runner.close()                     every send completed
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeline.distributed import executor
from pipeline.distributed.comm import Comm
from pipeline.distributed.links import PeerLink
from pipeline.local.carry import Carry
from pipeline.local.stage import Stage, StepTimes
from pipeline.pure.schedule import ScheduleFn, forward_only, stage_actions

__all__ = ["StepRunner"]


class StepRunner:
    """The links to this rank's neighbours and its action list for a flushed step."""

    def __init__(self, comm: Comm, schedule: str | ScheduleFn, n_microbatches: int) -> None:
        self.comm = comm
        rank, n_stages = comm.rank, comm.world_size
        self._links = (PeerLink(comm, rank - 1) if rank > 0 else None,
                       PeerLink(comm, rank + 1) if rank < n_stages - 1 else None)  # fmt: skip
        self._actions = stage_actions(schedule, n_stages, n_microbatches, rank)

    @property
    def sends_in_flight(self) -> int:
        """Sends posted to the neighbours and not yet waited for (read-only)."""
        return sum(link.sends_in_flight for link in self._neighbours())

    def train_step(
        self, stage: Stage, step: int, inputs: Sequence[Carry], targets: Sequence[Any], *,
        measure_memory: bool, on_nonfinite: str,
    ) -> tuple[float, StepTimes]:  # fmt: skip
        """One flushed step of this rank's list (`executor.train_step`)."""
        return executor.train_step(stage, self._links, self.comm, self._actions, step, inputs,
                                   targets, measure_memory=measure_memory,
                                   on_nonfinite=on_nonfinite)  # fmt: skip

    def infer(self, stage: Stage, step: int, chunks: Sequence[Carry]) -> list[Carry] | None:
        """The forward-only list over `len(chunks)` micro-batches (`executor.infer`)."""
        actions = stage_actions(forward_only, self.comm.world_size, len(chunks), self.comm.rank)
        return executor.infer(stage, self._links, self.comm, actions, step, chunks)

    def open_run(
        self, stage: Stage, step: int, inputs: Mapping[int, Carry], targets: Mapping[int, Any]
    ) -> executor.Run:
        """A run over the links that a stream feeds action by action."""
        return executor.Run(stage, self._links, self.comm, step, inputs, targets)

    def release_sends(self, below: int) -> None:
        """Drop the sends of micro-batches numbered below `below`, known received
        (`PeerLink.release_sends`: a stream, once its agreement proves it)."""
        for link in self._neighbours():
            link.release_sends(below)

    def close(self) -> None:
        """Wait for every send still in flight."""
        for link in self._neighbours():
            link.wait_sends()

    def _neighbours(self) -> list[PeerLink]:
        return [link for link in self._links if link is not None]
