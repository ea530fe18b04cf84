"""The command's entry point (`elastic-nas`, `python -m nas`): the stage processes' server
started before anything heavy is imported, then the CLI (`nas.cli`).

The command's own imports (torch, through the harness: 2-3 s of CPU) and the server's
(torch, torch._dynamo, the harness's stage modules, the tracker's backend: 3-4 s,
`pipeline.distributed.server`) do not depend on each other. Started first, the server
imports on another core while this process imports and composes its configuration, so the
first launch finds it ready, where it waited 3-4 s for it when the CLI started it after
composing. What the server preloads is chosen before the configuration is known: every
stage's modules and every tracker's backend (a superset: a module a job never uses costs
the server its import, not the job). Hydra's informational flags (`--help`, `--cfg` ...)
start nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from nas.stage_imports import STAGE_MODULES
from nas.tracking import TRACKERS
from pipeline.distributed.server import prestart

__all__ = ["main", "preloaded", "start_server"]

# Hydra's flags that print and exit: no job, so no server
_INFO_FLAGS = frozenset(
    {"--help", "-h", "--hydra-help", "--version", "--cfg", "-c", "--info", "-i"}
    | {"--shell-completion", "-sc"}
)


def main() -> None:
    """The command: the server started (module doc), then the CLI."""
    start_server(sys.argv[1:])
    from nas.cli import main as run_command  # seconds of imports, beside the server's

    run_command()


def start_server(arguments: Sequence[str]) -> None:
    """Start the stage processes' server with every module a job's processes may import,
    unless `arguments` (the command's) only ask Hydra for information."""
    if not any(argument.split("=", 1)[0] in _INFO_FLAGS for argument in arguments):
        prestart(preload=preloaded())


def preloaded() -> tuple[str, ...]:
    """Every stage's modules and every registered tracker's backend, each once."""
    stages = [module for modules in STAGE_MODULES.values() for module in modules]
    backends = [module for name in TRACKERS for module in TRACKERS[name].preload]
    return tuple(dict.fromkeys([*stages, *backends]))
