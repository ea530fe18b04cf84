"""`StageLayer`: one layer as a stage holds it, with its memory action, meter and step sums.

Kept apart from `pipeline.local.stage` so the stage's helpers (`stage_backward`,
`stage_costs`, `stage_memory`) can name the type without importing the stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from pipeline.local.meter import LayerMeter

__all__ = ["StageLayer"]


@dataclass
class StageLayer:
    key: str
    module: nn.Module
    action: str = "keep"  # the memory action: "keep", "recompute" or "swap"
    meter: LayerMeter = field(default_factory=LayerMeter)  # smoothed costs across steps
    # this step's sums over micro-batches
    forward_s: float = 0.0
    backward_s: float = 0.0
    activation_bytes: int = 0
    output_bytes: int = 0
