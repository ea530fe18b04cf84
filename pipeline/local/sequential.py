"""Models as PyTorch users write them: an `nn.Sequential` turned into the runtime's specs.

The runtime trains a flat list of `LayerSpec`s. A user who already has an `nn.Sequential`
(the form `torch.distributed.pipelining` users reach for, since its `pipeline()` splits a
model at top-level children) should not rewrite it: `specs_from_sequential(module)` makes
one spec per child, keyed by the child's name, and the pipelined model computes exactly
what `module(x)` computes, starting from the module's own weights.

Design: each spec's factory holds a *snapshot* of its built child (a deep copy taken when
the specs are made, on the CPU) and returns a fresh deep copy of it each time it is called.
The alternative, a factory that rebuilds the child from its class and a seed, cannot know
how the user initialised it; handing over the live child would share it between the
runtime's layers and the user's module. The snapshot makes every build return the same
weights whatever the runtime's `seed`, in any process: the factory pickles with its child,
so specs made in the parent travel to `pipeline.launch`'s spawned stage processes (as
arguments of the stage function) and every stage, sandbox profile and migration target
builds identical layers. (Building the module inside each stage process works too, if it is
built deterministically there, e.g. after `torch.manual_seed`.) Later changes to the user's
module do not reach specs already made.

Torch pipelining's split points (`split_spec={"layers.4": SplitPoint.BEGINNING}`) become
stage sizes with `partition_from_split_points(specs, split_spec)`, for
`PlanOptions(partition=sizes)`; without them the planner partitions (`partition="auto"`).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import nn

from pipeline.local.spec import LayerSpec, check_specs

__all__ = ["ModuleSnapshot", "partition_from_split_points", "specs_from_sequential"]

_VALID_MODULE = (
    "an nn.Sequential with at least one child, whose forward is nn.Sequential's own (children "
    "called in order, each output the next one's input)"
)
_SPLIT_POSITIONS = ("beginning", "end")  # torch's SplitPoint.BEGINNING / SplitPoint.END


class ModuleSnapshot:
    """A picklable factory: a fresh deep copy of one built module each call."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self) -> nn.Module:
        return copy.deepcopy(self.module)

    def __repr__(self) -> str:
        return f"ModuleSnapshot({type(self.module).__name__})"


def specs_from_sequential(module: nn.Sequential, *, flatten: bool = True) -> list[LayerSpec]:
    """One `LayerSpec` per child of `module`, in order, whose factory returns a copy of it.

    Keys are the children's names: "0", "1", ... for `nn.Sequential(a, b)`, the given names
    for `nn.Sequential(OrderedDict(...))`. With `flatten` (the default), a child that is itself
    a plain `nn.Sequential` is replaced by its children, keyed by their dotted path
    ("blocks.0", "blocks.1", ...), recursively; this is exact, since a Sequential only chains
    its children, and lets the planner cut inside it. `flatten=False` keeps each top-level
    child as one layer. Every key is then the child's name in `module`:
    `module.get_submodule(spec.key)`, and a pipeline's `full_state_dict()` loads back with
    `module.load_state_dict({f"{k}.{n}": v for k, s in state.items() for n, v in s.items()})`.

    Each factory returns a deep copy of a snapshot taken now (module doc): initial weights
    are the module's own, the same in every process, whatever the pipeline's `seed`. The
    pipelined model then computes what `module` computes, with the runtime's semantics:
    the loss is the mean of the micro-batch losses (a full-batch mean up to rounding), layers
    see one micro-batch at a time (BatchNorm's statistics are per micro-batch) and dropout
    masks come from the runtime's seeds, not from the global generator.

    Raises TypeError for anything but an `nn.Sequential` with Sequential's own forward,
    ValueError for one with no children (or a None child) and for children that share a
    parameter or buffer (tied weights: every layer gets its own copy here). A child without
    weights that appears twice (one `nn.ReLU()` used twice) runs twice, so it is two layers.
    """
    _check_sequential(module, "specs_from_sequential")
    children = list(_children(module, "", flatten))
    if not children:
        raise ValueError(
            f"specs_from_sequential: the {type(module).__name__} has no layers; valid: "
            f"{_VALID_MODULE}"
        )
    _check_unshared(children)
    specs = [
        LayerSpec(key, ModuleSnapshot(copy.deepcopy(child).to("cpu"))) for key, child in children
    ]
    return check_specs(specs)


def partition_from_split_points(
    specs: Sequence[LayerSpec], split_points: Mapping[str, object] | Sequence[str]
) -> list[int]:
    """Stage sizes for `PlanOptions(partition=...)` from torch pipelining's split points.

    `split_points` is torch's `split_spec` (`{"layers.4": SplitPoint.BEGINNING}`; a value is
    a `SplitPoint` member or the string "beginning" / "end", any case) or a list of names,
    each splitting before that layer. A name is a layer key, or the dotted prefix of a run of
    keys (a flattened nested Sequential: "blocks" begins before "blocks.0" and ends after
    its last layer). The result has one more stage than there are split points.

    A `torch.distributed.pipelining` user's
    `pipeline(module, mb_args, split_spec={"layers.4": SplitPoint.BEGINNING})` becomes::

        specs = specs_from_sequential(module)            # "layers.4" is a key if `layers` is
        sizes = partition_from_split_points(specs, split_spec)   # a nested nn.Sequential
        ElasticPipeline(specs, ..., planning=PlanOptions(partition=sizes))

    Raises ValueError for a name that is no layer (a module inside a layer included: the
    runtime cuts between layers only), a split that leaves a stage empty, two split points
    at the same place, or a position other than beginning / end.
    """
    keys = [spec.key for spec in check_specs(specs)]
    points = dict.fromkeys(split_points, "beginning") if _is_names(split_points) else split_points
    if not isinstance(points, Mapping):
        raise TypeError(
            f"split_points must be a mapping name -> SplitPoint or a list of names, got "
            f"{type(split_points).__name__}"
        )
    cuts: dict[int, str] = {}
    for name, where in points.items():
        cut = _cut_position(keys, name, _position(name, where))
        if cut in cuts:
            raise ValueError(
                f"split points {cuts[cut]!r} and {name!r} both cut between layers "
                f"{keys[cut - 1]!r} and {keys[cut]!r}; give one"
            )
        cuts[cut] = name
    bounds = [0, *sorted(cuts), len(keys)]
    return [b - a for a, b in itertools.pairwise(bounds)]


def _check_sequential(module: object, caller: str) -> None:
    if not isinstance(module, nn.Sequential):
        raise TypeError(
            f"{caller} takes {_VALID_MODULE}; got a {type(module).__name__}. Wrap a model "
            "whose forward chains its children as nn.Sequential(...), or write LayerSpecs"
        )
    if not _plain(module):
        raise TypeError(
            f"{caller}: {type(module).__name__} overrides nn.Sequential.forward, so its "
            f"children alone do not say what it computes; valid: {_VALID_MODULE}"
        )


def _plain(module: nn.Sequential) -> bool:
    """Whether `module` computes what nn.Sequential computes (no forward of its own)."""
    return type(module).forward is nn.Sequential.forward


def _children(module: nn.Sequential, prefix: str, flatten: bool) -> Iterator[tuple[str, nn.Module]]:
    # Iterating the Sequential (as its forward does) and `named_modules(remove_duplicate=
    # False)`, not `named_children()`, which skips a module's second appearance: a child
    # used twice runs twice in nn.Sequential.forward, so it is two layers here.
    children = list(module)
    for position, child in enumerate(children):
        if child is None:  # add_module accepts None; nn.Sequential cannot call it
            where = f"{prefix.rstrip('.')!r}" if prefix else "the model"
            raise ValueError(
                f"specs_from_sequential: child {position} of {where} is None; valid: a module"
            )
    names = [n for n, _ in module.named_modules(remove_duplicate=False) if n and "." not in n]
    for name, child in zip(names, children, strict=True):
        key = prefix + name
        if flatten and isinstance(child, nn.Sequential) and _plain(child):
            yield from _children(child, key + ".", flatten)
        else:
            yield key, child


def _check_unshared(children: list[tuple[str, nn.Module]]) -> None:
    owner: dict[int, str] = {}
    for key, child in children:
        tensors: Iterator[torch.Tensor] = (
            t for ts in (child.parameters(), child.buffers()) for t in ts
        )
        for tensor in tensors:
            first = owner.setdefault(id(tensor), key)
            if first != key:
                raise ValueError(
                    f"specs_from_sequential: layers {first!r} and {key!r} share a parameter "
                    "or buffer (tied weights); each layer gets its own copy here, so they "
                    "cannot be trained as one. Untie them, or put both in one layer"
                )


def _is_names(split_points: object) -> bool:
    return isinstance(split_points, Sequence) and not isinstance(split_points, str | bytes)


def _position(name: str, where: object) -> str:
    """ "beginning" or "end" from a `SplitPoint` member (its `.name`) or a string."""
    label = getattr(where, "name", where)
    if isinstance(label, str) and label.lower() in _SPLIT_POSITIONS:
        return label.lower()
    raise ValueError(
        f"split point {name!r}: position {where!r} is not valid; valid: SplitPoint.BEGINNING, "
        "SplitPoint.END, 'beginning' or 'end'"
    )


def _cut_position(keys: list[str], name: str, where: str) -> int:
    """The index of the first layer after the cut that `name` at `where` makes."""
    run = [i for i, key in enumerate(keys) if key == name or key.startswith(name + ".")]
    if not run:
        inside = [key for key in keys if name.startswith(key + ".")]
        hint = (
            f"it is inside layer {inside[0]!r}, and the runtime cuts between layers only"
            if inside
            else f"valid: the layer keys {_shown(keys)} or a dotted prefix of some"
        )
        raise ValueError(f"split point {name!r} names no layer; {hint}")
    cut = run[0] if where == "beginning" else run[-1] + 1
    if cut in (0, len(keys)):
        raise ValueError(
            f"split point {name!r} ({where}) cuts at the {'start' if cut == 0 else 'end'} of "
            "the model and would leave a stage empty; split between two layers"
        )
    return cut


def _shown(keys: list[str], limit: int = 12) -> str:
    shown = ", ".join(repr(key) for key in keys[:limit])
    return f"[{shown}{', ...' if len(keys) > limit else ''}]"
