"""The soak's faults: a seeded schedule of them, and the nemesis that injects and heals them.

As in Jepsen's nemesis runs, the faults come from a schedule drawn from one seed before the
soak starts (`schedule`): one every `every` seconds (drawn between its bounds), their kinds
dealt round-robin from a shuffled deck of every kind, so each kind comes about as often. A
fault that lasts (a database down, a store read-only or full) is healed after its duration;
a kill is healed by the supervisor starting the command again (`soak_supervisor`). A fault
whose target is missing when it is due (no stage process is training) waits for one for up
to `WAIT_S` seconds, then is recorded as skipped.

    kind               what it does                                  healed by
    worker_sigkill     SIGKILL a worker command's process            the supervisor
    stage_sigkill      SIGKILL one of its stage processes            the worker (its trial
                                                                     fails and is retried)
    database_restart   `pg_ctl stop -m fast`, then start             start after duration
    database_sigkill   SIGKILL the postmaster, then start            start after duration
    store_read_only    the artifact store remounted read-only        rw after duration
    store_full         the store's file system filled to the brim    ballast removed
    artifact_damaged   a recent weights artifact truncated, or 64    never: the study must
                       bytes in its middle overwritten               refuse it

The store is a tmpfs mounted on the study's artifact folder (`Store`), so that read-only
and full are what a real file system says (EROFS, ENOSPC), to root too.
"""

from __future__ import annotations

import enum
import errno
import logging
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak_supervisor import Command, stage_processes

from nas.storage.postgres import Postgres, PostgresError

__all__ = ["WAIT_S", "Fault", "FaultKind", "Nemesis", "Store", "schedule"]

WAIT_S = 30.0  # how long a due fault waits for its target
logger = logging.getLogger(__name__)
_BALLAST = ".ballast"


class FaultKind(enum.StrEnum):
    WORKER_SIGKILL = "worker_sigkill"
    STAGE_SIGKILL = "stage_sigkill"
    DATABASE_RESTART = "database_restart"
    DATABASE_SIGKILL = "database_sigkill"
    STORE_READ_ONLY = "store_read_only"
    STORE_FULL = "store_full"
    ARTIFACT_DAMAGED = "artifact_damaged"


_PART = {  # what a lasting fault takes down
    FaultKind.DATABASE_RESTART: "database",
    FaultKind.DATABASE_SIGKILL: "database",
    FaultKind.STORE_READ_ONLY: "store",
    FaultKind.STORE_FULL: "store",
}
_LASTING = {
    FaultKind.DATABASE_RESTART: (5.0, 30.0),
    FaultKind.DATABASE_SIGKILL: (5.0, 15.0),
    FaultKind.STORE_READ_ONLY: (30.0, 90.0),
    FaultKind.STORE_FULL: (30.0, 90.0),
}


@dataclass
class Fault:
    """One scheduled fault: when (seconds from the soak's start), what, for how long."""

    kind: FaultKind
    at_s: float
    duration_s: float = 0.0
    # filled in when injected
    injected_s: float | None = None
    healed_s: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None


def schedule(
    seed: int, start_s: float, end_s: float, every: tuple[float, float], kinds: list[FaultKind]
) -> list[Fault]:
    """The soak's faults from `start_s` to `end_s` (module doc), the same for the same seed."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    deck: list[FaultKind] = []
    at = start_s
    while True:
        at += rng.uniform(*every)
        if at > end_s:
            return faults
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        kind = deck.pop()
        low, high = _LASTING.get(kind, (0.0, 0.0))
        faults.append(Fault(kind, round(at, 1), round(rng.uniform(low, high), 1)))


class Store:
    """The study's artifact folder as a tmpfs of `size` (module doc), unmounted by `close`."""

    def __init__(self, folder: Path, size: str = "4g") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        _mount("-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder))

    def read_only(self, on: bool) -> None:
        _mount("-o", f"remount,{'ro' if on else 'rw'}", str(self.folder))

    def fill(self, tries: int = 8) -> int:
        """Fill the file system with a ballast file; its size in bytes. A worker writing
        meanwhile can take the space measured a moment before (ENOSPC): then the ballast
        grows to what is free now, until nothing is (a full disk is the aim)."""
        with (self.folder / _BALLAST).open("wb") as ballast:
            for _ in range(tries):
                stats = os.statvfs(self.folder)
                free = stats.f_bavail * stats.f_frsize
                if free == 0:
                    break
                try:
                    os.posix_fallocate(
                        ballast.fileno(), 0, os.fstat(ballast.fileno()).st_size + free
                    )
                except OSError as error:
                    if error.errno != errno.ENOSPC:
                        raise
            return os.fstat(ballast.fileno()).st_size

    def drain(self) -> None:
        (self.folder / _BALLAST).unlink(missing_ok=True)

    def artifacts(self) -> list[Path]:
        """The weights artifacts, newest first."""
        files = [p for p in self.folder.iterdir() if p.is_file() and p.name != _BALLAST]
        return sorted(files, key=lambda p: p.stat().st_mtime, reverse=True)

    def close(self) -> None:
        self.read_only(False)
        self.drain()
        subprocess.run(["umount", "-l", str(self.folder)], check=False)


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True, capture_output=True)


@dataclass(frozen=True)
class _Action:
    """A kind's injection (False: no target now) and, for a lasting kind, its healing."""

    inject: Callable[[Fault], bool]
    heal: Callable[[], object] | None = None


class Nemesis:
    """Injects the schedule's faults on time and heals the lasting ones (module doc)."""

    def __init__(
        self,
        faults: list[Fault],
        commands: list[Command],
        database: Postgres,
        store: Store,
        seed: int,
    ) -> None:
        self.faults = faults
        self._commands = commands
        self._database = database
        self._store = store
        self._rng = random.Random(seed + 1)
        self._pending = list(faults)
        self._lasting: list[Fault] = []
        self._down: set[str] = set()  # "database", "store": one lasting fault of each at a time

    def tick(self, now_s: float) -> None:
        """Heal what is due, then inject what is due (a missing target: try again later)."""
        for fault in [f for f in self._lasting if now_s >= (f.injected_s or 0) + f.duration_s]:
            self._heal(fault, now_s)
        for fault in [f for f in self._pending if f.at_s <= now_s]:
            if self._inject(fault):
                fault.injected_s = now_s
                self._pending.remove(fault)
                if fault.duration_s:
                    self._lasting.append(fault)
            elif now_s - fault.at_s > WAIT_S:
                fault.skipped = "no target within the wait"
                self._pending.remove(fault)

    def heal_all(self, now_s: float) -> None:
        """End every lasting fault (the soak is over; a database that will not start yet is
        tried again for a minute), and drop the ones not yet due."""
        for _ in range(30):
            for fault in list(self._lasting):
                self._heal(fault, now_s)
            if not self._lasting:
                break
            time.sleep(2.0)
        for fault in self._pending:
            fault.skipped = "after the soak's end"
        self._pending.clear()

    def _actions(self) -> dict[FaultKind, _Action]:
        """How each kind is injected, and how a lasting one is healed."""
        database, store = self._database, self._store
        return {
            FaultKind.WORKER_SIGKILL: _Action(self._kill_worker),
            FaultKind.STAGE_SIGKILL: _Action(self._kill_stage),
            FaultKind.DATABASE_RESTART: _Action(lambda f: _do(database.stop), database.start),
            FaultKind.DATABASE_SIGKILL: _Action(self._kill_database, database.start),
            FaultKind.STORE_READ_ONLY: _Action(
                lambda f: _do(lambda: store.read_only(True)), lambda: store.read_only(False)
            ),
            FaultKind.STORE_FULL: _Action(
                lambda f: _do(lambda: f.detail.update(bytes=store.fill())), store.drain
            ),
            FaultKind.ARTIFACT_DAMAGED: _Action(self._damage),
        }

    def _inject(self, fault: Fault) -> bool:
        part = _PART.get(fault.kind)
        if part in self._down or not self._actions()[fault.kind].inject(fault):
            return False
        if part is not None:
            self._down.add(part)
            logger.info("fault %s: %s down for %.0f s", fault.kind, part, fault.duration_s)
        return True

    def _heal(self, fault: Fault, now_s: float) -> None:
        heal = self._actions()[fault.kind].heal
        assert heal is not None, f"{fault.kind} does not last"
        try:
            heal()
        except PostgresError as error:  # a killed server's backends still ending
            fault.detail.setdefault("start_retries", []).append(str(error)[:200])
            return
        fault.healed_s = now_s
        self._lasting.remove(fault)
        self._down.discard(_PART[fault.kind])
        logger.info("fault %s healed", fault.kind)

    def _kill_database(self, fault: Fault) -> bool:
        fault.detail["pid"] = _postmaster(self._database)
        os.kill(fault.detail["pid"], signal.SIGKILL)
        return True

    def _kill_worker(self, fault: Fault) -> bool:
        alive = [c for c in self._commands if c.pid is not None]
        if not alive:
            return False
        command = self._rng.choice(alive)
        fault.detail.update(command=command.name, pid=command.pid, doing=_last_line(command.log))
        os.kill(command.pid or 0, signal.SIGKILL)
        logger.info("fault %s: %s", fault.kind, fault.detail)
        return True

    def _kill_stage(self, fault: Fault) -> bool:
        stages = [(c, pid) for c in self._commands if c.pid for pid in stage_processes(c.pid)]
        if not stages:
            return False
        command, pid = self._rng.choice(stages)
        fault.detail.update(command=command.name, pid=pid, doing=_last_line(command.log))
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        logger.info("fault %s: %s", fault.kind, fault.detail)
        return True

    def _damage(self, fault: Fault) -> bool:
        recent = self._store.artifacts()[:8]
        if not recent:
            return False
        target = self._rng.choice(recent)
        size = target.stat().st_size
        how = self._rng.choice(["truncated", "overwritten"])
        try:
            with target.open("r+b") as f:
                if how == "truncated":
                    f.truncate(size // 2)
                else:
                    f.seek(size // 2)
                    f.write(self._rng.randbytes(64))
        except OSError as error:  # the store read-only or full just now
            fault.detail["error"] = str(error)
            return False
        fault.detail.update(artifact=target.name, how=how, bytes=size, at=time.time())
        logger.info("fault %s: %s", fault.kind, fault.detail)
        return True


def _do(work: Callable[[], object]) -> bool:
    work()
    return True


def _postmaster(database: Postgres) -> int:
    return int((database.folder / "data" / "postmaster.pid").read_text().split()[0])


def _last_line(log: Path) -> str:
    """What a command was doing: the last line of its log."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1][-240:] if lines else ""
