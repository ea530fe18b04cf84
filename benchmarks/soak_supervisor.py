"""The soak's supervisor: worker commands started, restarted when they die, and stopped.

A cluster runs each of a study's workers under a supervisor (systemd, Kubernetes, Slurm's
requeue) that starts the same command again when it dies. `Supervisor` is that, for the
soak (`soak.py`):

    1. start     each command (`Command`) in its own process group, its output to its log
    2. watch     every `poll` (the soak's loop): a command that exited 0 is done; one that
                 died (killed, or exited non-zero) is started again at once with the same
                 argument list, and the restart counted with its exit status
    3. stop      at the end, or past the soak's deadline: every process group still alive
                 is sent SIGTERM, then SIGKILL after `grace_s`; what had to be stopped is
                 reported (a command that had to be stopped is a hang)

`stage_processes` finds a command's stage processes (the fault injector kills one).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.distributed import procfs

__all__ = ["Command", "Supervisor", "stage_processes"]

logger = logging.getLogger(__name__)


@dataclass
class Command:
    """One supervised command: its name, argument list and log; what happened to it."""

    name: str
    argv: list[str]
    log: Path
    environment: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    exits: list[int] = field(default_factory=list)  # the exit status of every death
    done: bool = False  # exited 0

    @property
    def pid(self) -> int | None:
        """The running command's pid (None when it is not running)."""
        alive = self.process is not None and self.process.poll() is None
        return self.process.pid if alive and self.process is not None else None

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"\n=== start {time.strftime('%H:%M:%S')}: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.process = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped whole at the end
                env={**os.environ, **self.environment},
            )


class Supervisor:
    """Keeps its commands running until each exits 0 (module doc)."""

    def __init__(self, commands: list[Command], grace_s: float = 30.0) -> None:
        self.commands = commands
        self.grace_s = grace_s
        self.restarts = 0

    def start(self) -> None:
        for command in self.commands:
            command.start()

    def poll(self) -> bool:
        """Step 2; True while any command has not exited 0."""
        for command in self.commands:
            process = command.process
            if command.done or process is None or process.poll() is None:
                continue
            if process.returncode == 0:
                command.done = True
                logger.info("%s ended", command.name)
                continue
            command.exits.append(process.returncode)
            self.restarts += 1
            logger.info("%s died (exit %d): started again", command.name, process.returncode)
            command.start()
        return not all(command.done for command in self.commands)

    def stop(self) -> list[str]:
        """Step 3: the commands that had to be stopped (none when all had ended)."""
        stopped = []
        for command in self.commands:
            if command.pid is None:
                continue
            stopped.append(command.name)
            _signal_group(command.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        for command in self.commands:
            process = command.process
            if process is None:
                continue
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        return stopped


def _signal_group(pid: int, number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, number)


def stage_processes(pid: int) -> list[int]:
    """A worker command's stage processes: below `pid`, the children of its fork servers
    (`pipeline.distributed.processes` forks every stage process from one). A stage forked
    from a server carries the server's command line, so a server is one whose parent is
    not one: the stage's own children (W&B's service process) are not stages."""
    parents = procfs.parents()

    def serves(p: int | None) -> bool:
        return p is not None and "forkserver" in procfs.command_line(p)

    below = procfs.descendants(pid)
    servers = {p for p in below if serves(p) and not serves(parents.get(p))}
    return [p for p in below if parents.get(p) in servers]
