"""One study on a real PostgreSQL server, and the faults a cluster's storage has.

One throw-away server for the whole module (`nas.postgres`, started and stopped by its
command line, as the README starts it), real CLI workers with their own stage processes,
the gRPC proxy as a user runs it, and the server stopped for real mid-study. Studies are
tiny (a character LM, 2 steps a trial); while the server is down for the short outage, the
checks that need it down run.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from rich.console import Console

from nas.postgres import Postgres, PostgresError, free_port
from nas.report import report_study
from nas.retrain import retrain
from nas.storage import StorageError, make_storage
from nas.storage_url import masked, without_password
from nas.study import run_study
from nas.trials import INTERRUPTED, OWNER, counted
from tests.nas.harness.common import tiny_settings

pytestmark = [pytest.mark.multiprocess, pytest.mark.filterwarnings("ignore:Heartbeat of storage")]

COMPLETE, RUNNING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING
SERVER = [sys.executable, "-m", "nas.storage_server"]
# a study as cheap as it gets: a character LM, 2 steps a trial, no tracker
CHEAP = (
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
OUTAGE_S = 12.0  # the short outage: a server restarted, as an administrator does


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    """The throw-away PostgreSQL, started by its command; the tests stop and start it
    through the same folder. Fails, never skips, where it cannot run."""
    folder = Path(tempfile.mkdtemp(prefix="nas-pg-"))
    try:
        started = subprocess.run(
            [*SERVER, "postgres", "--dir", str(folder), "--no-fsync", "--detach"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if started.returncode != 0:
            pytest.fail(f"the throw-away PostgreSQL did not start: {started.stderr.strip()}")
        try:
            handle = Postgres(folder)  # the same folder: the same port and password
        except PostgresError as error:
            pytest.fail(f"the throw-away PostgreSQL cannot be handled: {error}")
        assert handle.url == started.stdout.strip() and handle.running
        yield handle
    finally:
        subprocess.run([*SERVER, "postgres", "--dir", str(folder), "--stop"], timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def _worker(
    run_dir: Path, storage: str, *overrides: str, password: str | None = None
) -> subprocess.Popen[str]:
    """`python -m nas` as a user starts a worker, on `storage` (`password`: given in
    PGPASSWORD, as the README advises, not in the URL)."""
    env = dict(os.environ) | ({"PGPASSWORD": password} if password else {})
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nas",
            *CHEAP,
            "stages=[search]",
            f"study.storage={storage}",
            *overrides,
            f"hydra.run.dir={run_dir}",
            f"studies_dir={run_dir / 'studies'}",
        ],
        cwd=run_dir.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
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


def _count(server: Postgres, sql: str, study: str) -> int:
    """A count read straight from the server (0 before Optuna made its tables)."""
    engine = sqlalchemy.create_engine(server.url)
    try:
        with engine.connect() as connection:
            return int(connection.execute(sqlalchemy.text(sql), {"study": study}).scalar_one())
    except sqlalchemy.exc.SQLAlchemyError:
        return 0
    finally:
        engine.dispose()


def _wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.3)


def _stage_processes(pid: int) -> set[int]:
    """The stage processes `pid` started (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            spawned = b"spawn_main" in (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and spawned:
            found.add(int(stat.parent.name))
    return found


def _trials(server: Postgres, study: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=study, storage=make_storage(server.url)).trials


def _told(run_dir: Path) -> list[int]:
    """The trials a worker's rank 0 recorded as complete or pruned (its job log)."""
    log = (run_dir / "elastic-nas.log").read_text()
    return [int(n) for n in re.findall(r"\] - trial (\d+) (?:complete|pruned):", log)]


def test_bad_credentials_or_scheme_fail_at_once_naming_the_storage(server: Postgres) -> None:
    wrong = server.url.replace(server.record.password, "not-the-password")
    for url, said in [
        (wrong, "password authentication failed"),
        ("nosuchdb://u:secret@127.0.0.1/x", "NoSuchModuleError"),
    ]:
        started = time.monotonic()
        with pytest.raises(StorageError, match=said) as caught:
            make_storage(url)
        assert time.monotonic() - started < 10
        assert masked(url) in str(caught.value) and "not-the-password" not in str(caught.value)
        assert "secret" not in str(caught.value) and "\n" not in str(caught.value)


def test_a_worker_stops_when_the_server_is_gone_too_long_and_a_rerun_resumes(
    server: Postgres, tmp_path: Path
) -> None:
    """Then the study is retrained and reported from the server, as a user does."""
    overrides = ("study.name=gone", "study.n_trials=3", "study.storage_wait_s=2")
    worker = _worker(tmp_path / "w", server.url, *overrides)

    def training() -> bool:
        return _count(server, COMPLETED, "gone") > 0 and _count(server, TRAINING, "gone") > 0

    _wait_until(training, "a trial completed and the next one trains")
    stages = _stage_processes(worker.pid)
    server.stop()
    try:
        out, err = worker.communicate(timeout=120)
    finally:
        server.start()
    assert worker.returncode == 1, err[-3000:]
    said = [line for line in (out + err).splitlines() if "unreachable for 2 s" in line]
    assert said and all(masked(server.url) in line for line in said), err[-3000:]
    assert not any(server.record.password in line for line in said)
    assert stages and not any(Path(f"/proc/{pid}").exists() for pid in stages)

    settings = tiny_settings(tmp_path, *CHEAP, *overrides, f"study.storage={server.url}")
    result = run_study(settings)  # the rerun: the dead worker's trial is failed and retried
    assert result.finished == 3
    trials = _trials(server, "gone")
    left = [t for t in trials if t.state == optuna.trial.TrialState.FAIL and not counted(t)]
    assert left, [(t.number, t.state, t.user_attrs) for t in trials]
    retried = {t.user_attrs.get("retry_of") for t in trials if counted(t)}
    assert {t.number for t in left} <= retried
    assert not any(t.state == RUNNING for t in trials)
    engine = sqlalchemy.create_engine(server.url)
    with engine.connect() as connection:  # rank 0 recorded heartbeats while trials trained
        beats = connection.execute(sqlalchemy.text("SELECT COUNT(*) FROM trial_heartbeats"))
        assert beats.scalar_one() >= 3
    engine.dispose()

    retrained = retrain(settings)
    assert [run.error for run in retrained.runs] == [None] and retrained.selected
    out_text = io.StringIO()
    report_study(settings, result, retrained, console=Console(file=out_text, width=200))
    report = out_text.getvalue()
    assert f"optuna-dashboard {without_password(server.url)}" in report
    assert server.record.password not in report


def test_two_workers_one_through_the_proxy_wait_out_a_server_restart(
    server: Postgres, tmp_path: Path
) -> None:
    """Each worker is `python -m nas` with its own stage processes; one reaches the study
    through the gRPC proxy. The server is stopped for OUTAGE_S mid-study: nothing is
    restarted, nothing lost or told twice, and the study reaches study.n_trials."""
    overrides = ("study.name=shared", "study.n_trials=3")
    url = without_password(server.url)  # the password in PGPASSWORD
    direct = _worker(tmp_path / "direct", url, *overrides, password=server.record.password)
    port = free_port()
    proxy = subprocess.Popen(
        [*SERVER, "serve", "--storage", server.url, "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None and proxy.stdout.readline().strip() == (
            f"grpc://127.0.0.1:{port}"
        )
        proxied = _worker(tmp_path / "proxied", f"grpc://127.0.0.1:{port}", *overrides)

        def mid_study() -> bool:
            return _count(server, OWNERS, "shared") == 2 and _count(server, COMPLETED, "shared") > 0

        _wait_until(mid_study, "both workers asked a trial and one completed")
        server.stop()
        down = time.monotonic()
        with ThreadPoolExecutor(2) as pool:  # the start faults, while the server is down
            cli = pool.submit(_cli_start_error, tmp_path / "refused", server)
            grpc = pool.submit(_start_error, f"grpc://127.0.0.1:{free_port()}")
            refused = cli.result()
            assert "could not be opened" in refused and "Connection refused" in refused
            assert "no gRPC storage proxy answers" in grpc.result()
        time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down)))
        server.start()
        results = [w.communicate(timeout=600) for w in (direct, proxied)]
    finally:
        proxy.terminate()
        _, proxy_err = proxy.communicate(timeout=60)
    for worker, (_, err) in zip((direct, proxied), results, strict=True):
        assert worker.returncode == 0, err[-3000:]
    direct_said = results[0][0] + results[0][1]
    assert f"storage {url} unreachable" in direct_said, direct_said[-3000:]
    assert "reachable again after" in direct_said
    assert f"storage {masked(server.url)} unreachable" in proxy_err  # the proxy waited too
    assert server.record.password not in direct_said + proxy_err

    trials = _trials(server, "shared")
    assert 3 <= sum(map(counted, trials)) <= 4  # each stops once 3 are done: one may overshoot
    assert len({t.number for t in trials}) == len(trials)
    assert not any(t.state == RUNNING or t.user_attrs.get(INTERRUPTED) for t in trials)
    assert len({t.user_attrs[OWNER] for t in trials if counted(t)}) == 2
    told = [_told(tmp_path / "direct"), _told(tmp_path / "proxied")]
    done = {t.number for t in trials if t.state.is_finished() and counted(t)}
    assert sorted(told[0] + told[1]) == sorted(done)  # each told once, none lost


def _start_error(url: str) -> str:
    """The error a worker starting on `url` gets (it must be one)."""
    try:
        make_storage(url)
    except StorageError as error:
        return str(error)
    raise AssertionError(f"{url} was opened")


def _cli_start_error(run_dir: Path, server: Postgres) -> str:
    """What `python -m nas` says when its storage cannot be reached at start: one line
    naming it (password masked), no traceback, no stage process started."""
    worker = _worker(run_dir, server.url, "study.name=refused")
    out, err = worker.communicate(timeout=300)
    assert worker.returncode == 1
    said = out + err
    assert "Traceback" not in said and "pipeline-stage" not in said, said[-3000:]
    errors = [line for line in said.splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and masked(server.url) in errors[0], said[-3000:]
    assert server.record.password not in said
    return errors[0]


def test_the_proxy_refuses_what_it_cannot_serve() -> None:
    done = subprocess.run(
        [*SERVER, "serve", "--storage", "journal:///tmp/x.log", "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "not valid for the proxy" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1  # one line, no traceback
