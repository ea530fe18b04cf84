"""What the contract (test_contract.py) does not cover: storage URLs and the settings that
tune a storage, what SQLite's locks do to a heartbeat and a write, and how rank 0's `Leader`
takes over a dead or silent peer's trial (or skips the architecture a peer trains) before
each trial it asks.

Real SQLite files, real processes and real `Leader`s; no stage processes.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.storages import RDBStorage

from nas import storage
from nas.errors import HeartbeatError
from nas.search.records import StudyRecords
from nas.storage.url import StorageKind, kind, masked, without_password
from nas.study.leader import Leader, TrialOrder
from nas.study.trials import DUPLICATE_OF, OWNER, Outcome, counted
from nas.tracking.base import TrialEnd
from pipeline.distributed import procfs
from tests.nas.harness.common import composed, locked, tiny_settings
from tests.nas.storage.common import SPACE, dead_owner, open_study, silence

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


def test_a_journal_file_in_a_missing_folder_is_a_storage_error_naming_it(tmp_path: Path) -> None:
    url = f"journal:///{tmp_path}/missing/study.log"
    with pytest.raises(storage.StorageError, match=f"storage {url} could not be opened .*folder"):
        storage.make_storage(url)


@pytest.mark.parametrize(
    "url,message",
    [
        ("outputs/x.db", "not a storage URL; valid: sqlite:///path.db"),
        ("journal://", "names no file"),
        ("grpc://proxy-host", "use grpc://host:port"),
        ("postgres ql://u:secret@h/db", r"study.storage='postgres ql://u:\*\*\*@h/db'"),
    ],
)
def test_a_bad_storage_url_says_what_is_valid(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        storage.make_storage(url)
    with pytest.raises(ValueError, match=message):  # refused when the settings are read
        composed(f"study.storage={url}")


def test_storage_wait_s_max_retries_and_checkpoint_every_are_checked() -> None:
    assert composed("study.storage_wait_s=5").study.storage_wait_s == 5
    for bad in ("0", "-1", "inf"):
        with pytest.raises(ValueError, match=rf"study.storage_wait_s={bad}.* is not valid"):
            composed(f"study.storage_wait_s={bad}")
    assert composed("study.max_retries=0").study.max_retries == 0
    with pytest.raises(ValueError, match=r"study.max_retries=-1 is not valid"):
        composed("study.max_retries=-1")
    assert composed("study.checkpoint_every=null").study.checkpoint_every is None
    with pytest.raises(ValueError, match=r"study.checkpoint_every=-5 is not valid.* step count"):
        composed("study.checkpoint_every=-5")


def test_heartbeat_grace_s_is_checked_and_sets_the_beat(tmp_path: Path) -> None:
    assert composed("study.heartbeat_grace_s=3").study.heartbeat_grace_s == 3
    for bad in ("1", "0", "-30"):
        with pytest.raises(ValueError, match=rf"study.heartbeat_grace_s={bad} is not valid"):
            composed(f"study.heartbeat_grace_s={bad}")
    assert [storage.heartbeat_every(g) for g in (30, 300, 12, 3)] == [5, 5, 2, 1]
    rdb = storage.make_storage(f"sqlite:///{tmp_path / 's.db'}", grace_s=3)
    assert isinstance(rdb, RDBStorage) and rdb.get_heartbeat_interval() == 1


def test_what_is_shown_of_a_url_hides_its_password() -> None:
    url = "postgresql+psycopg2://nas:s3:cr@t@db.example:5432/postgres"
    assert masked(url) == "postgresql+psycopg2://nas:***@db.example:5432/postgres"
    assert without_password(url) == "postgresql+psycopg2://nas@db.example:5432/postgres"
    assert storage.dashboard_target(url) == without_password(url)  # PGPASSWORD gives it
    assert masked("sqlite:///a.db") == "sqlite:///a.db"
    assert "the --storage URL of the proxy" in storage.dashboard_target("grpc://h:13000")
    assert "s3" not in storage.dashboard_target("grpc://nas:s3@h:13000")
    assert kind("grpc://h:13000") == StorageKind.GRPC and kind(url) == StorageKind.SERVER


def test_a_heartbeat_that_cannot_record_is_reported_not_silent(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    study = open_study(f"sqlite:///{path}?timeout=0.2", "s", heartbeat_s=1, grace_s=5)
    trial = study.ask(SPACE)
    beat = storage.Heartbeat(study, trial)
    beat.start()
    beat.check()  # beating: nothing to report
    with locked(path):  # another process holds the write lock past the busy timeout
        time.sleep(1.6)
    with pytest.raises(HeartbeatError, match="database is locked"):
        beat.check()
    beat.stop()


def test_a_write_waits_for_a_lock_shorter_than_the_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    study = open_study(f"sqlite:///{path}", "s")  # SQLITE_BUSY_S, longer than sqlite3's 5 s
    trial = study.ask(SPACE)
    with locked(path, release_after_s=6.0):
        study.tell(trial, 0.5)  # waits for the lock instead of raising after 5 s
    assert study.get_trials()[0].state == optuna.trial.TrialState.COMPLETE


def _left_running(leader: Leader) -> TrialOrder:
    """A trial `leader` asks and leaves running, silent (its worker stopped beating)."""
    order = leader.next_trial()
    assert order is not None and leader.heartbeat is not None
    leader.heartbeat.stop()
    return order


def test_each_ask_first_takes_over_the_trials_of_dead_peers(tmp_path: Path) -> None:
    """A worker, before each trial it asks, fails the trials of a peer that died (its pid
    gone) or went silent (its heartbeat a minute old), uncounted, and enqueues them again:
    its ask is one of them, with its architecture, not a new proposal."""
    settings = tiny_settings(tmp_path, "tracker=none", "study.enqueue_seeds=false")
    Path(settings.studies_dir).mkdir(parents=True)
    peer, live = Leader(settings, owner="peer:1"), Leader(settings, owner=storage.this_owner())
    try:
        left = [_left_running(peer), _left_running(peer)]
        records = StudyRecords(live.study)
        dead, silent = (records.trial_by_number(order.number) for order in left)
        records.set_trial_user_attr(dead, OWNER, dead_owner())
        silence(settings.storage_url, [silent])
        taken = _left_running(live)
    finally:
        for leader in (peer, live):
            leader.close()
    trials = live.study.get_trials()
    assert {trials[o.number].state for o in left} == {optuna.trial.TrialState.FAIL}
    assert not any(counted(trials[o.number]) for o in left)
    retries = {t.user_attrs["retry_of"]: t for t in trials if "retry_of" in t.user_attrs}
    assert sorted(retries) == [o.number for o in left]
    assert {t.state.name for t in retries.values()} == {"RUNNING", "WAITING"}
    retry_of = trials[taken.number].user_attrs["retry_of"]
    assert taken.architecture == next(o.architecture for o in left if o.number == retry_of)


def test_a_retried_child_keeps_its_evolution_parent(tmp_path: Path) -> None:
    """A child whose worker died is asked again from its parameters alone; the retry is
    still its parent's child with the same edit, so at inherited fidelity it inherits, in
    seconds, instead of training from scratch to the full budget (the soak found that)."""
    settings = tiny_settings(tmp_path, "tracker=none")
    Path(settings.studies_dir).mkdir(parents=True)
    peer, live = Leader(settings, owner="peer:1"), Leader(settings, owner=storage.this_owner())
    try:
        while (child := peer.next_trial()) is not None and child.parent is None:
            peer.finish(child.number, Outcome(TrialEnd.COMPLETE, {}, [1.0 + child.number]))
        assert child is not None and peer.heartbeat is not None
        peer.heartbeat.stop()
        records = StudyRecords(live.study)
        records.set_trial_user_attr(records.trial_by_number(child.number), OWNER, dead_owner())
        retried = _left_running(live)
    finally:
        for leader in (peer, live):
            leader.close()
    trials = live.study.get_trials()
    assert trials[retried.number].user_attrs[storage.RETRY_OF] == child.number
    assert storage.first_attempt(trials, retried.number).number == child.number
    assert (retried.architecture, retried.parent, retried.edited) == (
        child.architecture,
        child.parent,
        child.edited,
    )


def test_workers_started_with_one_seed_do_not_propose_the_same_architecture(
    tmp_path: Path,
) -> None:
    """Two workers on one study with one `seed`: the second asks while the first trains,
    so its sampler is reseeded first and proposes another architecture; a worker alone
    proposes what its seed says, as the first did."""
    settings = tiny_settings(tmp_path, "tracker=none", "study.enqueue_seeds=false")
    alone = tiny_settings(tmp_path, "tracker=none", "study.enqueue_seeds=false", "study.name=a")
    Path(settings.studies_dir).mkdir(parents=True)
    orders = []
    for config, owner in ((settings, "peer:1"), (settings, storage.this_owner()), (alone, None)):
        leader = Leader(config, owner=owner or storage.this_owner())
        try:
            orders.append(_left_running(leader))
        finally:
            leader.close()
    first, second, by_itself = (order.architecture for order in orders)
    assert second != first and by_itself == first


def test_an_architecture_a_peer_trains_now_is_a_duplicate_not_trained_twice(
    tmp_path: Path,
) -> None:
    """As when two workers that created the study at once both enqueued the seeds: a copy
    of the architecture a peer trains, asked while it trains, is failed as its duplicate,
    uncounted, and the worker asks another."""
    settings = tiny_settings(tmp_path, "tracker=none", "study.enqueue_seeds=false")
    Path(settings.studies_dir).mkdir(parents=True)
    peer, live = Leader(settings, owner="peer:1"), Leader(settings, owner=storage.this_owner())
    try:
        training = _left_running(peer)
        live.study.enqueue_trial(live.study.trials[training.number].params)  # the second copy
        taken = _left_running(live)
    finally:
        for leader in (peer, live):
            leader.close()
    trials = live.study.get_trials()
    copies = [t for t in trials if t.user_attrs.get(DUPLICATE_OF) == training.number]
    assert len(copies) == 1 and not counted(copies[0])
    assert copies[0].user_attrs["fail_reason"] == (
        f"Duplicate: trial {training.number} trains this architecture"
    )
    assert taken.architecture != training.architecture and taken.number > copies[0].number


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process states from /proc")
def test_an_owner_killed_but_not_yet_reaped_is_gone() -> None:
    """A worker killed while its parent has not polled it yet is a zombie: signal 0 still
    reaches its pid, but its trials are orphans all the same (a peer retries them now, not
    when the parent gets round to it)."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    owner = f"{socket.gethostname()}:{child.pid}"
    try:
        assert storage.owner_alive(owner)
        child.kill()
        deadline = time.monotonic() + 10
        while not procfs.has_exited(child.pid):
            assert time.monotonic() < deadline, "the killed child never became a zombie"
            time.sleep(0.01)
        assert not storage.owner_alive(owner)  # not reaped yet, and gone
    finally:
        child.wait()


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_processes_opening_a_new_database_at_once_all_open_it(tmp_path: Path) -> None:
    """A worker and the gRPC proxy (or two workers) may be the first to open a database:
    both create Optuna's tables, the database refuses the second, and that one opens it as
    it is. Four processes open each of ten fresh SQLite files at the same moment (without
    it, one of them failed on most files)."""
    urls = [f"sqlite:///{tmp_path / f'new-{n}.db'}" for n in range(10)]
    code = (
        "import sys, time; from nas.storage.opening import make_storage\n"
        "start = float(sys.argv[1])\n"
        "for n, url in enumerate(sys.argv[2:]):\n"
        "    time.sleep(max(0.0, start + 0.3 * n - time.time()))\n"
        "    make_storage(url)\n"
    )
    start = str(time.time() + 5)  # after every process's imports
    opening = [
        subprocess.Popen([sys.executable, "-c", code, start, *urls], stderr=subprocess.PIPE)
        for _ in range(4)
    ]
    errors = [p.communicate(timeout=100)[1].decode() for p in opening]
    assert all(p.returncode == 0 for p in opening), [e[-500:] for e in errors if e]
