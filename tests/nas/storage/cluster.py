"""A study shared by workers on a real PostgreSQL server, as README.md's "## Many machines"
block runs it: the block's command lines with this machine's values (`Readme`), a worker
started as a user starts one (`start_worker`), and what the workers did, read straight from
the server (`count` with the queries below) or from a worker's log (`trials_told`).

Used by test_server_storage.py.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shlex
import signal
import string
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import optuna
import sqlalchemy

from nas.storage.opening import make_storage
from nas.storage.postgres import Postgres
from pipeline.distributed import procfs

# a study as cheap as it gets: a character LM, 2 steps a trial, no tracker
CHEAP = (
    "study.workers=1",  # each command one worker of the old default's shape: these tests
    "pipeline=cpu_2_stages",  # are about the storage (study.workers=N: test_cli)
    "task=charlm",
    "task.options.seq_len=16",
    "train.steps=2",
    "train.eval_every=2",
    "train.eval_batches=1",
    "train.batch_size=16",
    "search_space.d_model=[32]",
    "search_space.max_cells=1",
    "tracker=none",
    "retrain.steps=2",
)

README = Path(__file__).resolve().parents[3] / "README.md"


@dataclass(frozen=True)
class Readme:
    """README.md's "## Many machines" block as this machine runs it: `fills` (text ->
    what stands for it here) put in place of its placeholders, its variables expanded,
    its `export`s in `env`, its programs this interpreter's (`python`, scripts beside it)."""

    fills: Mapping[str, str]

    @classmethod
    def filled(
        cls,
        folder: Path,
        port: int,
        *,
        password: str = "",
        proxy_port: int = 0,
        runs: Path | None = None,
    ) -> Readme:
        """The server in `folder` on `port`, every host this one (loopback), the proxy on
        `proxy_port`, the workers' run folders under `runs`."""
        fills = {
            "/srv/nas-db": str(folder),
            "0.0.0.0": "127.0.0.1",
            "<server host>": "127.0.0.1",
            "<proxy host>": "127.0.0.1",
            "5433": str(port),
            "13000": str(proxy_port),
            "<the password in that URL>": password,
        }
        return cls(fills | ({"outputs/runs/shared": str(runs)} if runs else {}))

    def _parsed(self) -> tuple[list[list[str]], dict[str, str]]:
        """The block's command lines, split as the shell splits them, and its exports."""
        section = README.read_text().split("\n## Many machines\n", 1)[1].split("\n## ", 1)[0]
        block = section.split("```bash\n", 1)[1].split("\n```", 1)[0]
        pattern = "|".join(map(re.escape, self.fills))
        block = re.sub(pattern, lambda found: self.fills[found.group()], block)  # one pass
        lines: list[list[str]] = []
        variables: dict[str, str] = {}
        exported: dict[str, str] = {}
        for line in block.splitlines():
            words = shlex.split(string.Template(line).safe_substitute(variables), comments=True)
            if words[:1] == ["export"]:
                name, _, value = words[1].partition("=")
                exported[name] = value
            elif len(words) == 1 and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                name, _, value = words[0].partition("=")
                variables[name] = value
            elif words:
                lines.append(words[:-1] if words[-1] == "&" else words)
        return lines, exported

    @property
    def env(self) -> dict[str, str]:
        return self._parsed()[1]

    def command(self, *start: str, having: str = "") -> list[str]:
        """The block's one command line that starts with the words `start` and holds
        `having`, its globs expanded."""
        found = [
            words
            for words in self._parsed()[0]
            if tuple(words[: len(start)]) == start and having in " ".join(words)
        ]
        assert len(found) == 1, f"README.md's Many machines block: {start} {having!r}: {found}"
        program, *args = found[0]
        return [_program(program), *(word for arg in args for word in _expanded(arg))]


def _program(name: str) -> str:
    """`name` as this interpreter runs it: `python` is this interpreter, a script installed
    beside it (optuna-dashboard, wandb) that one, else whatever PATH finds."""
    if name == "python":
        return sys.executable
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else name


def _expanded(word: str) -> list[str]:
    """A shell word's glob matches, sorted (the word itself when none, as the shell does)."""
    return (sorted(glob.glob(word)) or [word]) if "*" in word else [word]


def readme_for(server: Postgres, runs: Path, proxy_port: int = 0) -> Readme:
    """The README's block for `server`, its workers' run folders under `runs`."""
    record = server.record
    return Readme.filled(
        server.folder, record.port, password=record.password, proxy_port=proxy_port, runs=runs
    )


def start_worker(
    run_dir: Path, *overrides: str, env: Mapping[str, str] | None = None
) -> subprocess.Popen[str]:
    """`python -m nas` as a user starts a worker, with `overrides` (its storage among them,
    e.g. a README line's; later ones win) on a cheap study, in `run_dir`, in a session of
    its own (its stage processes are its process group); `env` joins the environment
    (PGPASSWORD, as the README advises, not in the URL)."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nas",
            *CHEAP,
            "stages=[search]",
            *overrides,
            f"hydra.run.dir={run_dir}",
            f"studies_dir={run_dir / 'studies'}",
        ],
        cwd=run_dir.parent,
        env=os.environ | dict(env or {}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


COMPLETED = (
    "SELECT COUNT(*) FROM trials JOIN studies USING (study_id) "
    "WHERE study_name = :study AND state = 'COMPLETE'"
)
TRAINING = (  # trials rank 0 trains: running, owned, beating
    "SELECT COUNT(*) FROM trials JOIN studies USING (study_id) "
    "JOIN trial_heartbeats USING (trial_id) WHERE study_name = :study AND state = 'RUNNING'"
)
OWNERS = (
    "SELECT COUNT(DISTINCT value_json) FROM trial_user_attributes "
    "JOIN trials USING (trial_id) JOIN studies USING (study_id) "
    "WHERE study_name = :study AND key = 'owner'"
)
TRAINERS = (  # the workers training a trial (running, beating) now
    "SELECT COUNT(DISTINCT value_json) FROM trial_user_attributes "
    "JOIN trials USING (trial_id) JOIN studies USING (study_id) "
    "JOIN trial_heartbeats USING (trial_id) "
    "WHERE study_name = :study AND key = 'owner' AND state = 'RUNNING'"
)
TRAINS = (  # the number of the trial a worker (:owner) trains now, -1 if none
    "SELECT COALESCE(MAX(number), -1) FROM trial_user_attributes "
    "JOIN trials USING (trial_id) JOIN studies USING (study_id) "
    "JOIN trial_heartbeats USING (trial_id) "
    "WHERE study_name = :study AND key = 'owner' AND state = 'RUNNING' AND value_json = :owner"
)
RETRIED = (  # 1 once trial :number failed and a trial was enqueued to retry it
    "SELECT COUNT(*) FROM trials JOIN studies USING (study_id) "
    "WHERE study_name = :study AND number = :number AND state = 'FAIL' AND EXISTS ("
    "SELECT 1 FROM trial_user_attributes JOIN trials AS retry USING (trial_id) "
    "WHERE retry.study_id = studies.study_id AND key = 'retry_of' AND value_json = :number)"
)
IN_TRANSACTION = (  # the server's other connections inside a transaction (holding locks)
    "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND pid <> pg_backend_pid() AND state IN ('active', 'idle in transaction')"
)


def count(server: Postgres, sql: str, study: str, **params: str) -> int:
    """A number read straight from the server, `sql` with :study and `params` (0 before
    Optuna made its tables)."""
    engine = sqlalchemy.create_engine(server.url)
    try:
        with engine.connect() as connection:
            found = connection.execute(sqlalchemy.text(sql), {"study": study, **params})
            return int(found.scalar_one())
    except sqlalchemy.exc.SQLAlchemyError:
        return 0
    finally:
        engine.dispose()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.3)


def stage_processes(pid: int) -> set[int]:
    """The processes multiprocessing started under `pid`: its forkserver and the stage
    processes forked from it (or spawned stages), its resource tracker (Linux /proc)."""
    return {
        below
        for below in procfs.descendants(pid)
        if "multiprocessing" in procfs.command_line(below)
    }


def all_gone(pids: set[int], timeout_s: float = 10.0) -> bool:
    """Whether every one of `pids` has exited, within `timeout_s` (a forkserver and its
    children see their caller's exit a moment after it)."""
    deadline = time.monotonic() + timeout_s
    while any(Path(f"/proc/{pid}").exists() for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def study_trials(server: Postgres, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=make_storage(server.url)).trials


def trials_told(run_dir: Path) -> list[int]:
    """The trials a worker's rank 0 recorded as complete or pruned (its job log)."""
    log = (run_dir / "elastic-nas.log").read_text()
    return [int(n) for n in re.findall(r"\] - trial (\d+) (?:complete|pruned):", log)]


def end(worker: subprocess.Popen[str]) -> None:
    """Kill what is left of `worker`'s process group (a failed test's), and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    if worker.returncode is None:
        worker.communicate(timeout=60)
