"""The stage processes' server: multiprocessing's forkserver, with the runtime preloaded.

Stage processes (`pipeline.distributed.processes`) are forked from the forkserver where the
platform has one (Linux, macOS; spawn elsewhere). The server imports torch, the runtime and
the caller's own modules once (`prestart`'s `preload`, through `server_imports`), so a child
has them at once instead of seconds of CPU each.

This module imports no torch (nor does `import pipeline`, which imports its names on first
use): a program can start the server first thing, and the server's imports then run on
another core while the program imports its own (`python -m nas` starts it before composing
its configuration). Numbered, for a caller that does:

    1. prestart(preload)   writes `preload` to SERVER_IMPORTS_ENV, starts the server
    2. (the caller's own imports and work; the server imports meanwhile)
    3. the first launch    forks its processes from the server, waiting for the server's
                           imports if they are not done
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Sequence
from multiprocessing import forkserver
from typing import Any

__all__ = ["SERVER_IMPORTS_ENV", "prestart", "start_context"]

# The forkserver imports these (and torch) once. torch._dynamo too: the first optimizer a
# stage builds imports it (2-3 s of CPU), so each stage would pay that again. Then the
# caller's own modules (`prestart`'s `preload`), through `server_imports`.
_PRELOAD = [
    "__main__",
    "pipeline.distributed.launch",
    "pipeline.distributed.pool_member",
    "torch._dynamo",
    "pipeline.distributed.server_imports",
]
SERVER_IMPORTS_ENV = "PIPELINE_SERVER_IMPORTS"  # `prestart`'s preload, comma-separated


def start_context() -> Any:
    """forkserver where the platform has it (module doc), else spawn."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)  # read when the server starts: the first launch
    return context


def prestart(preload: Sequence[str] = ()) -> None:
    """Start the forkserver now rather than at the first launch: its imports (torch, the
    runtime, `__main__`: seconds of CPU) then run on another core while the caller goes on
    with its own work (module doc), and the first launch or pool forks its processes at
    once. Nothing where the platform spawns; a server already running is kept (and
    `preload` is then not imported there).

    `preload`: modules the caller's children import (a worker's module, a tracker's
    backend), imported once by the server too, so that no child pays for them; one that
    fails to import there is left to the children (`server_imports`)."""
    if preload:
        os.environ[SERVER_IMPORTS_ENV] = ",".join(preload)
    context = start_context()
    if context.get_start_method() == "forkserver":
        forkserver.ensure_running()
