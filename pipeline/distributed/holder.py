"""The model in force on this rank: its layers' specs, partition, plan, Stage and counters.

`ElasticPipeline` trains one model at a time; `reconfigure` swaps in the next. Everything
that belongs to one model, and nothing else, lives in a `ModelHolder`, so swapping models
is replacing the holder (`pipeline.distributed.build.setup` makes a fresh one) and no
counter of the old model leaks into the new. The holder changes only through its methods,
each named after the event that changes it:

    install(stages, sizes, plan)  a build: this rank's stages exist, the partition starts
    moved(record, sizes)          a committed migration: new sizes, plan version + 1
    replanned(plan)               a re-plan kept (or replaced) the plan in force
    stepped(samples, tokens, times)  a training step was applied on every rank
    resume_at(step)               a checkpoint taken after `step` steps goes on (before a build)
    expect_inheritance(snapshot)  weights the next build takes (`take_inheritance` pops it)
    close()                       free the layers

A rank holds one stage, or several under an interleaved or V placement
(`pipeline.pure.placement`): `live_stages()` are this rank's, ascending; `live_stage()` is the
only one, for what runs with one stage per rank (streams, Bi-Partition, migration); both
raise the error a user can act on when there is none yet (partition="auto" builds on the
first step).
"""

from __future__ import annotations

from collections.abc import Sequence

from pipeline.distributed.inheritance import WeightSnapshot
from pipeline.distributed.migration import MigrationRecord
from pipeline.local.history import StepHistory
from pipeline.local.inflight import StepTimes
from pipeline.local.spec import LayerSpec
from pipeline.local.stage import Stage
from pipeline.pure.planner import Plan

__all__ = ["ModelHolder"]


class ModelHolder:
    """One model's state on this rank (see the module docstring for how it changes)."""

    def __init__(self, specs: Sequence[LayerSpec], requested_handoff: Sequence[int] | None):
        self.specs = list(specs)
        # Bi-Partition's cut asked for (None: none)
        self.requested_handoff = None if requested_handoff is None else tuple(requested_handoff)
        self._handoff: tuple[int, ...] = ()  # the cut in force (() before a build)
        self._plan: Plan | None = None
        self._sizes: list[int] = []  # layers per stage; [] until planned
        self._step = 0
        self._version = 0  # +1 per committed migration
        self._migrations: list[MigrationRecord] = []
        self._partition_history: list[tuple[int, list[int]]] = []  # (step, sizes)
        self._history = StepHistory()  # what the steps measured, in bounded memory
        self._stages: list[Stage] = []
        self._inheritance: WeightSnapshot | None = None
        self._signatures: tuple[str, ...] = ()  # per layer, its key in the cost cache

    # -- read-only views ---------------------------------------------------------------------
    @property
    def plan(self) -> Plan | None:
        return self._plan

    @property
    def signatures(self) -> tuple[str, ...]:
        """Each layer's signature in the cost cache, once profiled (() before, or with
        explicit sizes): where its measured costs are taught (`CostCache.learn`)."""
        return self._signatures

    def set_signatures(self, signatures: Sequence[str]) -> None:
        if len(signatures) != len(self.specs):
            raise ValueError(f"{len(signatures)} signatures for {len(self.specs)} layers")
        self._signatures = tuple(signatures)

    @property
    def sizes(self) -> list[int]:
        return list(self._sizes)

    @property
    def step(self) -> int:
        return self._step

    @property
    def version(self) -> int:
        return self._version

    @property
    def migrations(self) -> list[MigrationRecord]:
        return list(self._migrations)

    @property
    def partition_history(self) -> list[tuple[int, list[int]]]:
        return [(step, list(sizes)) for step, sizes in self._partition_history]

    @property
    def history(self) -> StepHistory:
        return self._history

    @property
    def handoff(self) -> tuple[int, ...]:
        """Bi-Partition's cut in force (() before a build, or without one)."""
        return self._handoff

    def set_handoff(self, cut: Sequence[int]) -> None:
        """Record the cut `pipeline.distributed.build.set_handoff` put in force."""
        self._handoff = tuple(cut)

    @property
    def built(self) -> bool:
        """True once this rank's stages exist (and until `close`)."""
        return bool(self._stages)

    @property
    def stages(self) -> list[Stage]:
        """This rank's stages, ascending ([] before the first build and after `close`)."""
        return list(self._stages)

    def live_stages(self) -> list[Stage]:
        if not self._stages:
            raise RuntimeError(
                "the pipeline is planned on its first train_step (partition='auto'); "
                "train a step first, or pass explicit stage sizes"
            )
        return list(self._stages)

    def live_stage(self, what: str = "this") -> Stage:
        """The rank's only stage; `what` names the feature that needs one stage per rank."""
        stages = self.live_stages()
        if len(stages) != 1:
            held = [s.index for s in stages]
            raise ValueError(
                f"{what} needs one stage per rank; this rank holds stages "
                f"{held} (an interleaved or V schedule)"
            )
        return stages[0]

    # -- the events that change a model ----------------------------------------------------
    def install(self, stages: Sequence[Stage], sizes: Sequence[int], plan: Plan | None) -> None:
        """A build: `stages` are this rank's share of `sizes`; the partition starts now."""
        self._stages, self._sizes, self._plan = list(stages), list(sizes), plan
        self._partition_history = [(self._step, list(sizes))]

    def moved(self, record: MigrationRecord, sizes: Sequence[int]) -> None:
        """A committed migration to `sizes`; a plan for other sizes stops applying."""
        self._sizes, self._version = list(sizes), record.version
        if self._plan is not None and list(self._plan.sizes) != self._sizes:
            self._plan = None  # explicit sizes: the plan's predictions no longer apply
        self._migrations.append(record)
        self._partition_history.append((self._step, list(sizes)))

    def replanned(self, plan: Plan) -> None:
        self._plan = plan

    def stepped(self, samples: int, tokens: int | None, times: StepTimes) -> None:
        """A training step was applied on every rank: count it and keep its times."""
        self._history.record(samples, tokens, times)
        self._step += 1

    def resume_at(self, step: int) -> None:
        """Count on from a checkpoint's `step` (`pipeline.distributed.checkpoint`), before
        the layers are built and load its state."""
        if self.built or self._step:
            raise RuntimeError("a model resumes from a checkpoint before its first build and step")
        self._step = step

    def expect_inheritance(self, snapshot: WeightSnapshot) -> None:
        self._inheritance = snapshot

    def take_inheritance(self) -> WeightSnapshot | None:
        """The weights the build just made should start from (once), or None."""
        snapshot, self._inheritance = self._inheritance, None
        return snapshot

    @property
    def inheritance_pending(self) -> bool:
        return self._inheritance is not None

    def close(self) -> None:
        """Free this rank's layers (the model is unusable for training after)."""
        for stage in self._stages:
            stage.close()
        self._stages = []
