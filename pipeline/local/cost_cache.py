"""A cache of measured layer costs that outlives one model, kept by layer signature.

`CostCache` maps a layer signature (module type, its repr, which holds its dimensions, the
shapes it sees, which hold sequence length and micro-batch size, and the threads it runs on)
to its costs (`pipeline.local.profiler` fills it), so the next NAS candidate starts from what
earlier ones measured; a pipeline that re-plans from measured costs writes them back
(`learn`). It also keeps the runtime's own overheads (`pipeline.pure.shape.RuntimeOverheads`,
measured once per machine) and what whole-plan predictions were worth (`PredictionErrors`),
and saves to and loads from JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pipeline.pure.costs import LayerCost
from pipeline.pure.planner.tryout import PredictionErrors
from pipeline.pure.shape import RuntimeOverheads

__all__ = ["CostCache"]


class CostCache:
    """Measured costs by layer signature (and the runtime's overheads); reused across models
    and saved as JSON."""

    def __init__(
        self,
        entries: Mapping[str, Mapping[str, float]] | None = None,
        overheads: RuntimeOverheads | None = None,
        errors: PredictionErrors | None = None,
    ) -> None:
        self._entries: dict[str, dict[str, float]] = {
            signature: dict(entry) for signature, entry in (entries or {}).items()
        }
        self._overheads = overheads
        self._errors = errors if errors is not None else PredictionErrors()

    @property
    def errors(self) -> PredictionErrors:
        """What the cost model's predictions of whole plans were worth on this machine: the
        plans that ran, measured against predicted (`pipeline.pure.planner.tryout`)."""
        return self._errors

    def set_errors(self, errors: PredictionErrors) -> None:
        self._errors = errors

    @property
    def overheads(self) -> RuntimeOverheads | None:
        """The runtime's per-micro-batch, per-message and per-step costs on this machine
        (None until measured: `pipeline.distributed.overheads.measure_overheads`)."""
        return self._overheads

    def set_overheads(self, overheads: RuntimeOverheads) -> None:
        self._overheads = overheads

    def learn(self, signatures: Sequence[str], costs: Sequence[LayerCost]) -> None:
        """Replace the entries of `signatures` by what a running pipeline measured (`costs`,
        in the same order): the next plan of a layer with one of them starts from it."""
        if len(signatures) != len(costs):
            raise ValueError(f"{len(signatures)} signatures for {len(costs)} measured costs")
        for signature, cost in zip(signatures, costs, strict=True):
            if cost.forward_s > 0 and cost.backward_s > 0:  # measured (not a placeholder)
                self.put(signature, cost.forward_s, cost.backward_s, cost.activation_bytes)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, signature: str) -> bool:
        return signature in self._entries

    def put(
        self, signature: str, forward_s: float, backward_s: float, activation_bytes: float
    ) -> None:
        self._entries[signature] = {
            "forward_s": forward_s,
            "backward_s": backward_s,
            "activation_bytes": activation_bytes,
        }

    def get(self, signature: str) -> dict[str, float] | None:
        return self._entries.get(signature)

    def entries(self) -> dict[str, dict[str, float]]:
        return {k: dict(v) for k, v in self._entries.items()}

    def update(self, entries: dict[str, dict[str, float]]) -> None:
        """Take entries measured elsewhere (another rank, an earlier run)."""
        for signature, entry in entries.items():
            self.put(signature, entry["forward_s"], entry["backward_s"], entry["activation_bytes"])

    def save(self, path: str | Path) -> None:
        data: dict[str, Any] = {"version": 1, "entries": self._entries}
        if self._overheads is not None:
            data["overheads"] = self._overheads.to_dict()
        if self._errors.to_dict():
            data["prediction_errors"] = self._errors.to_dict()
        Path(path).write_text(json.dumps(data, indent=1))

    @classmethod
    def load(cls, path: str | Path) -> CostCache:
        data = json.loads(Path(path).read_text())
        if data.get("version") != 1:
            raise ValueError(f"{path}: unknown cost cache version {data.get('version')!r}")
        overheads = data.get("overheads")
        return cls(
            data["entries"],
            RuntimeOverheads.from_dict(overheads) if overheads else None,
            PredictionErrors.from_dict(data.get("prediction_errors", {})),
        )
