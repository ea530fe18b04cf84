"""Incremental candidates (vPipe's NAS scenario): which trained weights a candidate starts from.

With `study.inherit_weights=true`, a candidate's layers that share a key with the trial it
came from keep that trial's trained weights, tensor by tensor where names and shapes match,
migrated to wherever the new plan puts them, instead of starting from scratch; when that
trial is its evolution parent, the tensors its one edit touches start afresh
(`search_spaces.edited`). The trial it came from is the evolution parent
when the sampler names one (regularized evolution mutates one choice of it), else the
previous trial this worker trained.

Every stage process keeps a `WeightBank`: a `pipeline.WeightSnapshot` of its own layers per
recently trained trial (complete or pruned), at most `keep` of them, oldest dropped first.
The bank's contents are the same list of trial numbers on every rank (each rank adds after
every trained trial), so every rank picks the same source without a message.
"""

from __future__ import annotations

from collections import OrderedDict

from nas.study.leader import TrialOrder
from pipeline import ElasticPipeline, WeightSnapshot

__all__ = ["WeightBank"]


class WeightBank:
    """The weights of the last `keep` trained trials, this rank's layers of each."""

    def __init__(self, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"a weight bank must keep at least one trial, got keep={keep}")
        self.keep = keep
        self._kept: OrderedDict[int, WeightSnapshot] = OrderedDict()

    @property
    def numbers(self) -> list[int]:
        """The trials kept, oldest first."""
        return list(self._kept)

    def source(self, parent: int | None) -> int | None:
        """The trial to start from: `parent` if kept, else the last trial trained, if any."""
        if parent is not None and parent in self._kept:
            return parent
        return next(reversed(self._kept), None)

    def get(self, number: int | None) -> WeightSnapshot | None:
        return None if number is None else self._kept.get(number)

    def inherited(self, number: int | None, order: TrialOrder) -> WeightSnapshot | None:
        """What trial `order` starts from when it inherits from trial `number`: its weights,
        tensor by tensor where names and shapes match, less the tensors the child's edit
        touches when `number` is its parent (they start afresh, as from scratch)."""
        kept = self.get(number)
        if kept is None or number != order.parent or not order.edited:
            return kept
        return kept.without(order.edited)

    def add(self, number: int, pipe: ElasticPipeline) -> None:
        """Keep the weights `pipe` holds now as trial `number`'s (on every rank)."""
        self.put(number, pipe.snapshot())

    def put(self, number: int, snapshot: WeightSnapshot) -> None:
        """Keep `snapshot` (this rank's part of it) as trial `number`'s weights: a trial on
        the stage pool starts from what its job took there (`nas.study.pooled`)."""
        self._kept[number] = snapshot
        while len(self._kept) > self.keep:
            self._kept.popitem(last=False)
