"""`train.*`: how one trial trains and is evaluated.

Read by `nas.study.training` (steps, batches, evaluations, decoding) and
`nas.learning_rate` (the rate's schedule); the retraining trains with the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nas.learning_rate import SCHEDULES as LR_SCHEDULES
from nas.settings.checks import Settings, setting
from nas.settings.constraints import POSITIVE, Integer, Number, OneOf, OrNone

__all__ = ["TrainSettings"]

_DECODED = OrNone(Integer(0, words="use a count >= 0 (0: no decoding) or null (all pairs)"))


@dataclass
class TrainSettings(Settings):
    section: ClassVar[str] = "train"

    steps: int = setting(60, POSITIVE)
    batch_size: int = setting(32, POSITIVE)
    lr: float = setting(2e-3, Number(0, open_low=True))
    eval_every: int = setting(20, POSITIVE)
    # validation batches per evaluation; the final one reads them all
    eval_batches: int = setting(4, POSITIVE)
    # translation: validation pairs greedily decoded (the decoded metrics) per evaluation
    # (a fixed, evenly spaced subset) and at the final one; None: all, 0: none
    decode_pairs: int | None = setting(64, _DECODED)
    final_decode_pairs: int | None = setting(None, _DECODED)
    dropout: float = setting(0.1, Number(0, 1, open_high=True))
    # nas.learning_rate: linear warm-up over `warmup_steps`, then constant or a cosine decay
    # to `min_lr_ratio` x lr at the last step
    lr_schedule: str = setting("constant", OneOf(LR_SCHEDULES))
    warmup_steps: int = setting(0, Integer(0, words="use a count >= 0"))
    min_lr_ratio: float = setting(0.1, Number(0, 1))
