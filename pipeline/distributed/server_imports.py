"""The caller's own modules, imported by the stage processes' forkserver as it starts.

The forkserver (`pipeline.distributed.server`) imports its preload list once and forks
every stage process from itself, so a module imported there costs its children nothing: a
harness's worker and job modules, a tracker's backend (W&B's package, 2-3 s of CPU in
every process that opens a run). The caller names them with
`server.prestart(preload=...)`, which writes them to `SERVER_IMPORTS_ENV` before the
server starts (the server reads the caller's environment then). Each is imported here guarded:
one that fails to import is left to the children, which import it as they would have and
meet its error where it is reported, rather than ending the server every launch needs.
"""

from __future__ import annotations

import contextlib
import importlib
import os

from pipeline.distributed.server import SERVER_IMPORTS_ENV

__all__ = ["import_named"]


def import_named() -> None:
    """Import each module `SERVER_IMPORTS_ENV` names; one that fails is skipped (module
    doc)."""
    for name in filter(None, os.environ.get(SERVER_IMPORTS_ENV, "").split(",")):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


import_named()
