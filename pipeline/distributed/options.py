"""`PipelineOptions`: the knobs of an `ElasticPipeline`, typed and checked in one place.

`ElasticPipeline` takes them as keyword arguments (its documented API) and keeps them here,
checked before any process talks to another, so a bad value fails the same way on every
rank. A harness can build one from its own configuration and pass
`**dataclasses.asdict(options)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.local.pipemare import PipeMareConfig

__all__ = ["NONFINITE_POLICIES", "PROFILE_SOURCES", "PipelineOptions"]

NONFINITE_POLICIES = ("raise", "ignore")
PROFILE_SOURCES = ("sandbox", "estimate")


@dataclass(frozen=True)
class PipelineOptions:
    """See `ElasticPipeline` for what each knob does; the defaults are documented there."""

    n_microbatches: int = 4
    memory_budget: int | None = None
    profile: str = "sandbox"
    rebalance_every: int | None = None
    rebalance_on_drift: float | None = None
    rebalance_horizon: int = 100
    rebalance_settle: int = 3
    measure_memory_every: int = 10
    on_nonfinite: str = "raise"
    pipemare: PipeMareConfig | None = None  # checked by `check_pipemare` with the schedule
    handoff: tuple[int, ...] | None = None  # Bi-Partition's cut, checked against the sizes

    def __post_init__(self) -> None:
        positive = {
            "n_microbatches": self.n_microbatches,
            "rebalance_horizon": self.rebalance_horizon,
            "measure_memory_every": self.measure_memory_every,
            "memory_budget": self.memory_budget,
            "rebalance_every": self.rebalance_every,
        }
        for name, value in positive.items():
            if value is None and name in ("memory_budget", "rebalance_every"):
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(self.rebalance_settle, int) or self.rebalance_settle < 0:
            raise ValueError(f"rebalance_settle must be an int >= 0, got {self.rebalance_settle!r}")
        drift = self.rebalance_on_drift
        if drift is not None and not (isinstance(drift, int | float) and drift > 0):
            raise ValueError(f"rebalance_on_drift must be a fraction > 0, got {drift!r}")
        if self.profile not in PROFILE_SOURCES:
            raise ValueError(f"profile must be one of {PROFILE_SOURCES}, got {self.profile!r}")
        if self.pipemare is not None and not isinstance(self.pipemare, PipeMareConfig):
            raise TypeError(f"pipemare must be a PipeMareConfig, got {self.pipemare!r}")
        if self.handoff is not None and any(
            isinstance(k, bool) or not isinstance(k, int) or k < 0 for k in self.handoff
        ):
            raise ValueError(f"handoff must be layer counts >= 0, got {self.handoff!r}")
        if self.on_nonfinite not in NONFINITE_POLICIES:
            raise ValueError(
                f"on_nonfinite must be one of {NONFINITE_POLICIES}, got {self.on_nonfinite!r}"
            )
