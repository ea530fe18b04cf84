"""Stage processes on this machine: how they start, what they learn, how they end.

What `pipeline.distributed.launch` (S processes for one run of a function) and
`pipeline.distributed.pool` (P processes kept for many pipelines) share:

* Children are forked from multiprocessing's forkserver where the platform has one (Linux,
  macOS; spawn elsewhere), with `__main__` and the runtime preloaded: the server imports
  torch once per caller, so a launch after the first starts its stages in milliseconds
  instead of seconds (a study, its retraining, a test suite). As with spawn, each child
  adopts the caller's environment and working directory as they are at the start
  (`Caller`; the server's were fixed when it started), and the function it runs must be
  importable.
* No child outlives the caller: each watches the caller's pid and exits if it disappears
  (`watch_caller`; not its parent's, which is the forkserver), and the caller terminates
  them on any error, interrupt or exit (`terminate`).
* A child that failed reports first, then ends at once (`leave_now`), running no cleanup
  that could wait on a peer blocked in a message to it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pipeline.distributed import procfs

__all__ = [
    "PEER_FAILURE",
    "Caller",
    "StageContext",
    "group_backend",
    "leave_now",
    "report",
    "stage_context",
    "terminate",
    "watch_caller",
]


@dataclass(frozen=True)
class StageContext:
    """What `fn` learns about the process it runs in."""

    rank: int
    world_size: int
    device: torch.device
    backend: str
    timeout_s: float


# What a stage's error says when it only saw another stage fail first (its messages broke):
# not the cause, which the caller names instead (`launch`, `pool`)
PEER_FAILURE = ("Connection reset", "Connection closed", "Timed out", "timed out")

# What torchrun sets for its ranks (and `launch` reads): a process started here is none of
# them, so a launch inside it starts processes instead of joining torchrun's group.
_TORCHRUN_ENV = frozenset(
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
)


@dataclass(frozen=True)
class Caller:
    """What a spawned child would have inherited from the caller at its start (less a
    torchrun rank's variables: the child is no rank of torchrun's)."""

    environ: dict[str, str]
    cwd: str
    pid: int  # the caller's: the process each stage watches (`watch_caller`)

    @classmethod
    def here(cls) -> Caller:
        environ = {k: v for k, v in os.environ.items() if k not in _TORCHRUN_ENV}
        return cls(environ, os.getcwd(), os.getpid())

    def adopt(self) -> None:
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)


def terminate(procs: Sequence[Any]) -> None:
    """End these processes: SIGTERM, then SIGKILL what is still alive after 5 s."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        if p.pid is not None:
            p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def stage_context(
    rank: int,
    world: int,
    backend: str,
    threads: int,
    timeout_s: float,
    local_rank: int | None = None,
) -> StageContext:
    """The stage's context; its GPU is its rank on this machine (`local_rank`)."""
    torch.set_num_threads(threads)
    if backend == "nccl":
        here = rank if local_rank is None else local_rank
        device = torch.device("cuda", here % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    return StageContext(rank, world, device, backend, timeout_s)


def report(reports: Any, message: tuple[Any, ...]) -> None:
    """Put a process's one report on the queue and wait until it has left the process."""
    reports.put(message)
    reports.close()
    reports.join_thread()


def group_backend(backend: str) -> str:
    """gloo on CPU; on GPUs NCCL for tensors and gloo for the control plane (see Comm)."""
    return "cpu:gloo,cuda:nccl" if backend == "nccl" else backend


def leave_now() -> None:
    """End this process at once, running no cleanup that could wait on a peer."""
    os.kill(os.getpid(), signal.SIGKILL)


def watch_caller(pid: int) -> None:
    """Exit at once if the caller dies, so no stage process is ever orphaned.

    The caller's pid is watched, not the parent's: under the forkserver the parent is the
    server, and the server lives as long as any of its children does (each holds its
    liveness pipe), so a child waiting for its parent to go would wait forever."""
    parent = os.getppid()

    def gone() -> bool:
        if os.getppid() != parent:
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive (only a reused pid of another user: rare)
            return False
        return procfs.has_exited(pid)

    def watch() -> None:
        while not gone():
            time.sleep(0.5)
        leave_now()

    threading.Thread(target=watch, daemon=True, name="caller-watch").start()
