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
    # this step's sums over the micro-batches it ran one layer at a time (a fused step,
    # `pipeline.local.fused`, times the stage as a whole and adds nothing here)
    forward_s: float = 0.0
    backward_s: float = 0.0
    forward_n: int = 0  # micro-batches in forward_s
    backward_n: int = 0  # micro-batches in backward_s
    activation_bytes: int = 0
    output_bytes: int = 0
