"""One study on a real PostgreSQL server, and the faults a cluster's storage has.

One throw-away server for the whole module, real CLI workers with their own stage
processes, the gRPC proxy, the dashboard and `wandb sync`, each run as README.md's "## Many
machines" block runs it: the block is read from README.md (`cluster.Readme`) and its command
lines run with this machine's values in place of its placeholders. The server is stopped for real
mid-study, and a worker hangs (SIGSTOP) mid-trial, then is killed, while another goes on.
Studies are tiny (a character LM, 2 steps a trial); while the server is down for the short
outage, the checks that need it down run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from rich.console import Console

from nas.report import report_study
from nas.retrain.stage import retrain
from nas.storage.opening import ATTEMPT, StorageError, make_storage
from nas.storage.postgres import Postgres, PostgresError, free_port
from nas.storage.url import masked, without_password
from nas.study.opening import open_study
from nas.study.run import run_study
from nas.study.trials import INTERRUPTED, OWNER, counted
from tests.nas.harness.common import offline_wandb, tiny_settings
from tests.nas.harness.faulty import GATED_TASK
from tests.nas.storage.cluster import (
    CHEAP,
    COMPLETED,
    IN_TRANSACTION,
    OWNERS,
    RETRIED,
    TRAINERS,
    TRAINING,
    TRAINS,
    Readme,
    all_gone,
    count,
    end,
    readme_for,
    stage_processes,
    start_worker,
    study_trials,
    trials_told,
    wait_until,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.filterwarnings("ignore:Heartbeat of storage")]

COMPLETE, RUNNING = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.RUNNING
FAIL = optuna.trial.TrialState.FAIL
REPO = Path(__file__).resolve().parents[3]  # where `tests` imports from
SERVER = [sys.executable, "-m", "nas.storage.server"]
OUTAGE_S = 12.0  # the short outage: a server restarted, as an administrator does
GRACE_S = 3  # the hung worker's test: `study.heartbeat_grace_s` (a beat every second)


@pytest.fixture(scope="module")
def server() -> Iterator[Postgres]:
    """The throw-away PostgreSQL, started and stopped by the README's commands (with
    --no-fsync: a test's data need not survive a crash); the tests stop and start it through
    the same folder. Fails, never skips, where it cannot run."""
    folder = Path(tempfile.mkdtemp(prefix="nas-pg-"))
    readme = Readme.filled(folder, free_port())
    postgres = ("python", "-m", "nas.storage.server", "postgres")
    try:
        started = subprocess.run(
            [*readme.command(*postgres, having="--detach"), "--no-fsync"],
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
        subprocess.run(readme.command(*postgres, having="--stop"), timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_worker_stops_when_the_server_is_gone_too_long_and_a_rerun_resumes(
    server: Postgres, tmp_path: Path
) -> None:
    """Then the study is retrained and reported from the server, as a user does."""
    overrides = ("study.name=gone", "study.n_trials=3", "study.storage_wait_s=2")
    worker = start_worker(tmp_path / "w", f"study.storage={server.url}", *overrides)

    def training() -> bool:
        return count(server, COMPLETED, "gone") > 0 and count(server, TRAINING, "gone") > 0

    wait_until(training, "a trial completed and the next one trains")
    stages = stage_processes(worker.pid)
    server.stop()
    try:
        out, err = worker.communicate(timeout=120)
    finally:
        server.start()
    assert worker.returncode == 1, err[-3000:]
    said = [line for line in (out + err).splitlines() if "unreachable for 2 s" in line]
    assert said and all(masked(server.url) in line for line in said), err[-3000:]
    assert not any(server.record.password in line for line in said)
    assert len(stages) >= 2 and all_gone(stages)  # its stage processes closed with it

    settings = tiny_settings(tmp_path, *CHEAP, *overrides, f"study.storage={server.url}")
    result = run_study(settings)  # the rerun: the dead worker's trial is failed and retried
    assert result.finished == 3
    trials = study_trials(server, "gone")
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
    server: Postgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each worker is the README's `python -m nas` line, with its own stage processes; one
    reaches the study through the gRPC proxy, started by the README's line. The server is
    stopped for OUTAGE_S mid-study: nothing is restarted, nothing lost or told twice, and
    the study reaches study.n_trials. The direct worker logs to W&B offline, and the
    README's `wandb sync` line finds its runs (--dry-run: uploading needs an account)."""
    port = free_port()
    readme = readme_for(server, tmp_path, proxy_port=port)
    gate = tmp_path / "gate"  # no trial trains before both workers asked one (a loaded
    overrides = (  # machine let the first take every trial before the second asked)
        "study.name=shared",
        "study.n_trials=3",
        f"task.name={GATED_TASK}",
        f"+task.options.gate={gate}",
    )
    url = without_password(server.url)  # the README's $DB: the password in PGPASSWORD
    offline_wandb(monkeypatch, tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the workers import the gated task
    line = readme.command("python", "-m", "nas", having=f"study.storage={url}")
    direct = start_worker(
        tmp_path / "worker-1", *line[3:], *overrides, "tracker=wandb", env=readme.env
    )
    proxy = subprocess.Popen(
        readme.command("python", "-m", "nas.storage.server", "serve"),
        env=os.environ | readme.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proxy.stdout is not None and proxy.stdout.readline().strip() == (
            f"grpc://127.0.0.1:{port}"
        )
        line = readme.command("python", "-m", "nas", having="study.storage=grpc://")
        proxied = start_worker(tmp_path / "worker-2", *line[3:], *overrides)

        wait_until(lambda: count(server, OWNERS, "shared") == 2, "both workers asked a trial")
        gate.touch()
        wait_until(lambda: count(server, COMPLETED, "shared") > 0, "a trial completed")
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
    assert f"storage {url} unreachable" in proxy_err  # the proxy waited too
    assert server.record.password not in direct_said + proxy_err

    trials = study_trials(server, "shared")
    assert 3 <= sum(map(counted, trials)) <= 4  # each stops once 3 are done: one may overshoot
    assert len({t.number for t in trials}) == len(trials)
    assert not any(t.state == RUNNING or t.user_attrs.get(INTERRUPTED) for t in trials)
    assert len({t.user_attrs[OWNER] for t in trials if counted(t)}) == 2
    told = [trials_told(tmp_path / "worker-1"), trials_told(tmp_path / "worker-2")]
    done = {t.number for t in trials if t.state.is_finished() and counted(t)}
    assert sorted(told[0] + told[1]) == sorted(done)  # each told once, none lost
    _sync_dry_run(readme)


def _sync_dry_run(readme: Readme) -> None:
    """The README's `wandb sync` line, with --dry-run: it finds every offline run the
    worker wrote (a study run and one per trial) and lists them, uploading nothing."""
    sync = readme.command("wandb", "sync")
    runs = sync[2:]
    assert len(runs) >= 2 and all(Path(run).is_dir() for run in runs), sync
    synced = subprocess.run([*sync, "--dry-run"], capture_output=True, text=True, timeout=120)
    said = synced.stdout + synced.stderr
    assert synced.returncode == 0 and f"Would sync {len(runs)} run(s)" in said, said[-3000:]


def test_a_hung_then_killed_workers_trial_is_failed_by_its_heartbeat_and_retried(
    server: Postgres, tmp_path: Path
) -> None:
    """Two workers, the README's direct line, `study.heartbeat_grace_s` short. One hangs
    mid-trial (its process group stopped: a hung machine, its pid alive, so only the
    heartbeat can tell) and is then killed; the other, before its next ask, fails that trial
    (uncounted, no cause: the heartbeat's doing) and trains it again, and the study ends
    with study.n_trials (the survivor is paused alongside until the victim's heartbeat is
    stale, which orders the events: `_hang_mid_trial`). The README's `optuna-dashboard`
    line serves the study meanwhile."""
    readme, study = readme_for(server, tmp_path), "hung"
    line = readme.command("python", "-m", "nas", having="study.storage=postgresql")[3:]
    overrides = (
        f"study.name={study}",
        "study.n_trials=3",
        f"study.heartbeat_grace_s={GRACE_S}",
    )
    # made first, its two seed architectures enqueued once (two workers making it at the same
    # moment may both enqueue them): each worker's first trial is a seed of its own
    open_study(tiny_settings(tmp_path, *CHEAP, *overrides, f"study.storage={server.url}"))
    victim = start_worker(tmp_path / "victim", *line, *overrides, env=readme.env)
    survivor = start_worker(tmp_path / "worker-1", *line, *overrides, env=readme.env)
    try:
        hung = _hang_mid_trial(server, study, victim, survivor)
        with _dashboard(readme, tmp_path / "dashboard.log") as address:
            time.sleep(GRACE_S + 0.5)  # the hung trial's last heartbeat is older than the grace
            os.killpg(survivor.pid, signal.SIGCONT)  # its check before its next ask finds it
            wait_until(
                lambda: count(server, RETRIED, study, number=str(hung)) == 1,
                f"trial {hung} failed and enqueued again",
            )
            os.killpg(victim.pid, signal.SIGKILL)  # the hung machine is powered off
            _, err = survivor.communicate(timeout=300)
            assert survivor.returncode == 0, err[-3000:]
            serving = f"optuna-dashboard serves the study (output: {tmp_path / 'dashboard.log'})"
            wait_until(lambda: _serves(address, study), serving, 60)
    finally:
        for worker in (victim, survivor):
            end(worker)
    trials = study_trials(server, study)
    lost, again = trials[hung], [t for t in trials if t.user_attrs.get("retry_of") == hung]
    assert lost.state == FAIL and not counted(lost) and "fail_reason" not in lost.user_attrs
    said = [(t.number, t.state.name, t.user_attrs) for t in trials]
    assert [(t.state, t.user_attrs[ATTEMPT], t.params) for t in again] == [
        (COMPLETE, 1, lost.params)
    ], said
    assert again[0].user_attrs[OWNER] == f"{socket.gethostname()}:{survivor.pid}"
    assert again[0].number in trials_told(tmp_path / "worker-1")
    assert len({t.number for t in trials}) == len(trials)
    assert sum(map(counted, trials)) == 3 and not any(t.state == RUNNING for t in trials)


def _hang_mid_trial(
    server: Postgres, study: str, victim: subprocess.Popen[str], survivor: subprocess.Popen[str]
) -> int:
    """Stop both workers' process groups (SIGSTOP) at a moment the victim trains a trial
    (its heartbeat recorded), neither is inside a database transaction, and the survivor
    still has a trial to ask after its current one; returns the victim's trial. Stopping
    the survivor too orders what follows: it goes on only once the victim's heartbeat is
    stale, so the check before its next ask finds the trial (not the one at its start),
    and its study cannot end before."""
    owner = json.dumps(f"{socket.gethostname()}:{victim.pid}")
    while True:
        wait_until(lambda: count(server, TRAINERS, study) == 2, "both workers train a trial")
        for worker in (victim, survivor):
            os.killpg(worker.pid, signal.SIGSTOP)
        hung, done = count(server, TRAINS, study, owner=owner), count(server, COMPLETED, study)
        assert done <= 1, f"{done} trials completed before both workers trained one"
        if hung >= 0 and count(server, IN_TRANSACTION, study) == 0:
            return hung
        for worker in (victim, survivor):
            os.killpg(worker.pid, signal.SIGCONT)


@contextlib.contextmanager
def _dashboard(readme: Readme, log: Path) -> Iterator[str]:
    """The README's `optuna-dashboard` line on a free port of loopback, its output in `log`,
    until the block ends; yields its address."""
    port = free_port()
    command = [*readme.command("optuna-dashboard"), "--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as out:
        dashboard = subprocess.Popen(
            command, env=os.environ | readme.env, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            dashboard.terminate()
            dashboard.wait(timeout=60)


def _serves(address: str, study: str) -> bool:
    """Whether the dashboard at `address` answers its study list (200), naming `study`."""
    try:
        with urllib.request.urlopen(f"{address}/api/studies", timeout=5) as reply:
            return bool(reply.status == 200 and study in reply.read().decode())
    except OSError:  # not listening yet (URLError), or an error page (HTTPError)
        return False


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
    worker = start_worker(run_dir, f"study.storage={server.url}", "study.name=refused")
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
