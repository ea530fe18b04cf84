"""`nas.entry`: the command starts the stage processes' server before it imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from nas.entry import preloaded
from nas.stage_imports import STAGE_MODULES
from nas.tracking import TRACKERS

# in a fresh interpreter: the entry's start, then what it left behind, as JSON
STARTED = textwrap.dedent(
    """
    import json, os, sys
    from nas.entry import start_server
    from pipeline.distributed import procfs
    from pipeline.distributed.server import SERVER_IMPORTS_ENV

    start_server(sys.argv[1:])
    servers = [
        pid for pid in procfs.children(os.getpid()) if "forkserver" in procfs.command_line(pid)
    ]
    print(json.dumps({
        "torch": "torch" in sys.modules,
        "servers": len(servers),
        "preload": os.environ.get(SERVER_IMPORTS_ENV, ""),
    }))
    """
)


def test_the_server_preloads_every_stages_modules_and_every_trackers_backend_once() -> None:
    modules = preloaded()
    assert len(modules) == len(set(modules))
    for stage, imported in STAGE_MODULES.items():
        assert set(imported) <= set(modules), stage
    for name in TRACKERS:
        assert set(TRACKERS[name].preload) <= set(modules), name


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc; the forkserver is Linux's")
@pytest.mark.parametrize(
    ("arguments", "servers"),
    [((), 1), (("experiment=small_cpu",), 1), (("--help",), 0), (("--cfg", "job"), 0)],
)
def test_the_command_starts_the_server_before_it_imports_torch(
    arguments: tuple[str, ...], servers: int
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", STARTED, *arguments],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    started = json.loads(out.stdout.strip().splitlines()[-1])
    assert started["torch"] is False  # the server imports it; this process has not yet
    assert started["servers"] == servers  # Hydra's informational flags start nothing
    assert started["preload"] == (",".join(preloaded()) if servers else "")
