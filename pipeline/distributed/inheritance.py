"""Weight inheritance: one model's weights, kept to start a later model on the same processes.

A neural architecture search trains one candidate after another on the same stage
processes (`ElasticPipeline.reconfigure`); a candidate may start from its parent's weights
where its layers match. `WeightSnapshot` is what each rank keeps of a model (its own layers'
states, the model's keys and partition); `inherited_states` fetches, for the layers a rank
owns under the new plan, the states the snapshot's stages hold, in one exchange like a
migration's (`pipeline.distributed.transfer`). Kept apart from `pipeline.distributed.migration`:
a migration moves live layers of one model within a step boundary's protocol, an
inheritance seeds a new model from a finished one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.distributed.comm import Comm
from pipeline.distributed.migration import owners
from pipeline.distributed.transfer import exchange, pack_all
from pipeline.local.spec import LayerSpec

__all__ = ["WeightSnapshot", "inherited_states"]


@dataclass(frozen=True)
class WeightSnapshot:
    """One model's weights as one rank held them, to start a later model from.

    `ElasticPipeline.snapshot()` takes it on every rank (each keeps its own layers' states);
    `reconfigure(specs, inherit_from=snapshot)` gives them to the layers of the new model
    with the same key, tensor by tensor where names and shapes match, wherever the new plan
    puts them.
    """

    keys: tuple[str, ...]  # the model's layer keys, in order
    sizes: tuple[int, ...]  # its partition when taken
    states: Mapping[str, Mapping[str, torch.Tensor]]  # {key: state} of this rank's layers
    # the rank that holds each key, where it is not stage s on rank s (`sizes`): weights
    # regrouped onto other processes (`pipeline.distributed.pool`)
    holders: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if sum(self.sizes) != len(self.keys):
            raise ValueError(f"a snapshot of {len(self.keys)} layers has sizes {self.sizes}")
        if self.holders is not None and len(self.holders) != len(self.keys):
            raise ValueError(
                f"a snapshot of {len(self.keys)} layers names {len(self.holders)} holders"
            )

    def holder_ranks(self, world_size: int) -> tuple[int, ...]:
        """The rank holding each key in a group of `world_size` ranks."""
        if self.holders is None:
            if len(self.sizes) != world_size:
                raise ValueError(
                    f"the snapshot has {len(self.sizes)} stages, the pipeline {world_size}"
                )
            return tuple(owners(list(self.sizes)))
        if max(self.holders, default=0) >= world_size:
            raise ValueError(
                f"the snapshot's layers are held by ranks up to {max(self.holders)}, "
                f"the pipeline has {world_size}"
            )
        return self.holders

    def without(self, prefixes: Iterable[str]) -> WeightSnapshot:
        """This snapshot less every tensor whose qualified name, `<layer key>.<tensor
        name>`, starts with one of `prefixes`: a model inheriting from it starts those
        afresh (an edited branch), and everything else where names and shapes match."""
        drop = tuple(prefixes)
        states = {
            key: {
                name: tensor
                for name, tensor in state.items()
                if not f"{key}.{name}".startswith(drop)
            }
            for key, state in self.states.items()
        }
        return WeightSnapshot(self.keys, self.sizes, states, self.holders)


def inherited_states(
    comm: Comm, source: WeightSnapshot, new_specs: list[LayerSpec], new_sizes: list[int]
) -> dict[str, tuple[int, Mapping[str, torch.Tensor]]]:
    """For `reconfigure` with inheritance: {key: (old stage, old state)} of the layers this
    rank will own under the new plan whose key is in `source`, fetched from whichever stage
    held them (one exchange, like a migration)."""
    rank = comm.rank
    holders = source.holder_ranks(comm.world_size)

    def pack() -> dict[int, Any]:
        outgoing: dict[int, dict[str, dict[str, torch.Tensor]]] = {}
        for key, dst in new_owner.items():
            if old_owner.get(key) == rank and key in source.states:
                state = {k: v.detach().cpu() for k, v in source.states[key].items()}
                outgoing.setdefault(dst, {})[key] = state
        return pack_all(outgoing, rank)

    old_owner = dict(zip(source.keys, holders, strict=True))
    new_owner = dict(zip((s.key for s in new_specs), owners(new_sizes), strict=True))
    received = exchange(comm, comm.together(pack))
    return {k: (src, v) for src, states in received.items() for k, v in states.items()}
