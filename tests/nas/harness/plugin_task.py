"""A user's task outside the package, named by import path (`task.name=<module>:<class>`):
the character language model, with a metric of its own that a study can rank by."""

from __future__ import annotations

import math
from typing import ClassVar

from nas.tasks import CharLM, Direction, TokenStats


class PerplexityCharLM(CharLM):
    """`CharLM` that also reports perplexity (e ** loss), minimised."""

    name = "perplexity_charlm"
    metric_directions: ClassVar[dict[str, Direction]] = {
        **CharLM.metric_directions,
        "perplexity": "minimize",
    }

    def summarise(self, stats: TokenStats) -> dict[str, float]:
        return super().summarise(stats) | {"perplexity": math.exp(stats.loss)}


class NotATask:
    """What a typo in the import path might name instead."""


__all__ = ["NotATask", "PerplexityCharLM"]
