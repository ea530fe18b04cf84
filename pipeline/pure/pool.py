"""Which process of a stage pool trains what: the pool's ledger, without a process in sight.

A `pipeline.distributed.pool.StagePool` keeps P stage processes alive and lends N of them to
each pipeline that asks (a search's candidate, a user's model), so that models of different
sizes train side by side on one machine and none starts a process. This module decides, as
arithmetic on process numbers, what the pool's caller then carries out:

    lend(n, take)   which n free processes a job gets, in rank order; with `take`, a model
                    whose weights an earlier job left resident, regrouped onto the job's ranks
    release(p)      a process that only handed weights over returns to the pool
    give_back(job)  the job's processes return; the weights it kept stay resident on them
    lose(ps)        processes replaced (one died): the weights they held are gone

Weights left resident (`Residency`: which process holds which layer) are what makes a grow or
a shrink live. A job that takes them gets the processes that hold them where it can:

    grow (2 -> 3)     holders [a b] + a free joiner c:  members [a b c], nothing moves before
                      the job; its pipeline's plan moves layers to c (`inherited_states`)
    shrink (3 -> 2)   holders [a b c], n=2: the two holding the most layers stay, [a b]; c
                      hands its layers to the nearest staying holder before it (b), then
                      returns to the pool; members [a b]

so the layers that stay are never copied. A taken model whose holders are not all free (one
trains another model) cannot be handed over live: the lending says so (`taken` is None) and
the job starts from elsewhere (the caller's own store). At most `keep` models stay resident;
the least recently used one is dropped first, and each of its holders learns it with its next
lending (`Lending.drop`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pipeline.pure.checks import is_int

__all__ = ["Lending", "PoolLedger", "Residency"]


@dataclass(frozen=True)
class Residency:
    """A model's weights left in the pool: the process holding each of its layers."""

    name: str
    keys: tuple[str, ...]  # the model's layer keys, in order
    holder: tuple[int, ...]  # the pool process that holds each key

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.holder):
            raise ValueError(f"{len(self.keys)} layer keys but {len(self.holder)} holders")

    @property
    def processes(self) -> tuple[int, ...]:
        """The processes that hold a part, in the order of the model's layers."""
        return tuple(dict.fromkeys(self.holder))

    def layers_on(self, process: int) -> int:
        return sum(h == process for h in self.holder)

    def moved(self, moves: Mapping[int, int]) -> Residency:
        """This model after each process `p` in `moves` handed its layers to `moves[p]`."""
        return Residency(self.name, self.keys, tuple(moves.get(h, h) for h in self.holder))


@dataclass(frozen=True)
class Lending:
    """What one job gets from the pool.

    members   pool processes; the job's rank r runs on `members[r]`
    taken     the model it asked to start from, as it is held once the handover is done
              (every holder a member), or None when it could not be taken live
    handover  process -> process: each leaver hands its layers of `taken` to a member,
              before the job starts, in one group of `handover_group`
    drop      per process, the resident models it frees before anything else
    """

    job: int
    members: tuple[int, ...]
    taken: Residency | None = None
    handover: Mapping[int, int] = field(default_factory=dict)
    drop: Mapping[int, tuple[str, ...]] = field(default_factory=dict)

    @property
    def leavers(self) -> tuple[int, ...]:
        """Processes that only hand weights over, then return to the pool."""
        return tuple(self.handover)

    @property
    def handover_group(self) -> tuple[int, ...]:
        """The processes of the handover, ascending (its ranks); () when nothing moves."""
        if not self.handover:
            return ()
        return tuple(sorted({*self.handover, *self.handover.values()}))

    def rank_of(self, process: int) -> int:
        return self.members.index(process)


class PoolLedger:
    """The pool's state: which processes are free, which job holds which, what is resident.

    Lifecycle of a job: `lend` (its members and leavers become busy) -> `release` for each
    leaver once it has handed over -> `give_back` (its members are free; the model it kept,
    if any, is resident on them). A process that died is `lose`n by the caller, which starts
    a fresh one in its place (free, holding nothing).
    """

    def __init__(self, size: int, keep: int = 4) -> None:
        if not is_int(size) or size < 1:
            raise ValueError(f"a pool needs at least one process, got size={size!r}")
        if not is_int(keep) or keep < 0:
            raise ValueError(f"keep={keep!r}: the resident models to keep must be an int >= 0")
        self._size, self._keep = size, keep
        self._jobs: dict[int, tuple[int, ...]] = {}  # job -> its busy processes
        self._busy: set[int] = set()
        self._resident: dict[str, Residency] = {}  # least recently used first
        self._drops: dict[int, list[str]] = {}  # process -> models it should free
        self._next_job = 0

    # -- read-only views -----------------------------------------------------------------
    @property
    def size(self) -> int:
        return self._size

    @property
    def free(self) -> tuple[int, ...]:
        return tuple(p for p in range(self._size) if p not in self._busy)

    @property
    def resident(self) -> Mapping[str, Residency]:
        return dict(self._resident)

    def busy_with(self, job: int) -> tuple[int, ...]:
        return self._jobs.get(job, ())

    # -- the lifecycle -----------------------------------------------------------------------
    def lend(self, n: int, take: str | None = None) -> Lending | None:
        """n processes for a new job (None: not enough are free now; ask again later).

        With `take`, the holders of that resident model are preferred (module doc)."""
        if not is_int(n) or not 1 <= n <= self._size:
            raise ValueError(f"a job of n={n!r} stages cannot run on a pool of {self._size}")
        free = self.free
        if len(free) < n:
            return None
        model = self._resident.get(take) if take is not None else None
        if model is not None and not set(model.processes) <= set(free):
            model = None  # a holder trains another model: not live
        handover: dict[int, int] = {}
        if model is None:
            members = self._joiners(free, (), n)
        else:
            members, handover = self._members_for(model, free, n)
            model = model.moved(handover)
            del self._resident[model.name]  # used now (the most recent), held as moved
            self._resident[model.name] = model
        job = self._next_job
        self._next_job += 1
        busy = tuple(members) + tuple(handover)
        self._jobs[job] = busy
        self._busy.update(busy)
        drop = {p: tuple(self._drops.pop(p)) for p in busy if p in self._drops}
        return Lending(job, tuple(members), model, handover, drop)

    def release(self, job: int, process: int) -> None:
        """`process`, a leaver of `job`, has handed its layers over: it is free again."""
        held = self._jobs.get(job, ())
        if process not in held:
            raise ValueError(f"process {process} is not held by job {job} (it holds {held})")
        self._jobs[job] = tuple(p for p in held if p != process)
        self._busy.discard(process)

    def give_back(self, job: int, kept: Residency | None = None) -> None:
        """The job ended: its processes are free; `kept` (held by them) stays resident."""
        if job not in self._jobs:
            raise ValueError(f"job {job} holds no processes (given back already?)")
        held = self._jobs.pop(job)
        self._busy.difference_update(held)
        if kept is None:
            return
        stray = set(kept.holder) - set(held)
        if stray:
            raise ValueError(
                f"job {job} kept {kept.name!r} on processes {sorted(stray)} it never held"
            )
        if kept.name in self._resident:  # kept again under its name: the old one goes
            self._evict(kept.name)
        self._resident[kept.name] = kept
        while len(self._resident) > self._keep:
            self._evict(next(iter(self._resident)))

    def lose(self, processes: Iterable[int]) -> None:
        """These processes were replaced by fresh ones: what they held is gone, and every
        resident model with a part on them is dropped (from its other holders too)."""
        lost = set(processes)
        for name in [n for n, m in self._resident.items() if lost & set(m.processes)]:
            self._evict(name)
        for p in lost:
            self._drops.pop(p, None)

    # -- choosing --------------------------------------------------------------------------
    def _members_for(
        self, model: Residency, free: Sequence[int], n: int
    ) -> tuple[list[int], dict[int, int]]:
        holders = list(model.processes)
        if n >= len(holders):  # grow (or the same size): every holder stays
            return self._joiners(free, holders, n), {}
        by_layers = sorted(holders, key=lambda p: (-model.layers_on(p), holders.index(p)))
        stay = [p for p in holders if p in by_layers[:n]]
        handover = {}
        for i, p in enumerate(holders):
            if p not in stay:
                before = [q for q in holders[:i] if q in stay]
                handover[p] = before[-1] if before else next(q for q in holders if q in stay)
        return stay, handover

    def _joiners(self, free: Sequence[int], members: Sequence[int], n: int) -> list[int]:
        """`members` and then the free processes that lose least by joining: those holding
        no resident model first, then those whose models were used longest ago."""
        age = {p: i for i, m in enumerate(self._resident.values()) for p in m.processes}
        others = [p for p in free if p not in members]
        others.sort(key=lambda p: (p in age, age.get(p, -1)))
        return [*members, *others[: n - len(members)]]

    def _evict(self, name: str) -> None:
        model = self._resident.pop(name)
        for p in model.processes:
            self._drops.setdefault(p, []).append(name)
