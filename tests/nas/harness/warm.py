"""`python -m <module> ...` as a user runs it, without paying its imports each time.

Why it exists: the bad-input tests run the CLI fifty times, and each fresh interpreter spent
about 4 s importing torch, Hydra and Optuna before it refused its input in a millisecond.
`WarmPython` starts one interpreter that imports them once (the zygote), then forks it for
every command: each command still runs in a process of its own, from a fresh state, with
its own working folder, output files, exit status and tracebacks, exactly as `python -m`
would run it.

    test process                     zygote (no Python thread but its main: as the pipeline's
                                     fork server, which preloads torch too)
    ------------                     ------
    {"module", "argv", "cwd",  --->  fork ──> child: chdir, stdout/stderr to the files,
     "stdout", "stderr"}                       runpy.run_module(module, "__main__"),
                               <---  pid       exit with its status (an uncaught exception:
                               <---  status    its traceback printed, status 1)
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Done", "WarmPython"]

_ZYGOTE = r"""
import importlib, json, logging, os, runpy, sys, threading, traceback

for name in sys.argv[1:]:
    importlib.import_module(name)
assert threading.active_count() == 1, "a Python thread would not survive the fork"
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        os.chdir(request["cwd"])
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.argv = [request["module"], *request["argv"]]
        code = 0
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(pid, flush=True)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


@dataclass(frozen=True)
class Done:
    """A finished command: its exit status and what it printed."""

    returncode: int
    stdout: str
    stderr: str


class WarmPython:
    """One zygote that has imported `modules`; `run` forks it for each command."""

    def __init__(self, modules: list[str], cwd: Path) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", _ZYGOTE, *modules],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=cwd,
        )
        self._said = b""  # what the zygote printed and `_line` has not returned yet
        if self._line(120.0) != "ready":
            raise RuntimeError("the warm interpreter did not start")

    def run(self, module: str, argv: list[str], cwd: Path, timeout_s: float = 300.0) -> Done:
        """`python -m module *argv` in `cwd`, in a process forked from the zygote."""
        with tempfile.TemporaryDirectory() as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            request = {"module": module, "argv": argv, "cwd": str(cwd)}
            request |= {"stdout": str(out), "stderr": str(err)}
            assert self._process.stdin is not None
            self._process.stdin.write(json.dumps(request).encode() + b"\n")
            self._process.stdin.flush()
            pid = int(self._line(30.0))
            try:
                status = int(self._line(timeout_s))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise
            return Done(status, out.read_text(errors="replace"), err.read_text(errors="replace"))

    def close(self) -> None:
        if self._process.stdin is not None:
            self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def _line(self, timeout_s: float) -> str:
        """The zygote's next line (read from its pipe unbuffered, so that `select` sees
        every line that is not read yet)."""
        assert self._process.stdout is not None
        fd, deadline = self._process.stdout.fileno(), time.monotonic() + timeout_s
        while b"\n" not in self._said:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError(f"the warm interpreter said nothing for {timeout_s:.0f} s")
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"the warm interpreter ended (status {self._process.poll()})")
            self._said += chunk
        line, _, self._said = self._said.partition(b"\n")
        return line.decode().strip()
