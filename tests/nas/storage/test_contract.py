"""One contract for every storage kind `nas.storage.url.StorageKind` knows, as Optuna's
`optuna/testing/storages.py` runs one suite over every backend: an SQLite file, a journal
file, a throw-away PostgreSQL server (`nas.storage.postgres`), and Optuna's gRPC proxy
serving an SQLite file (`python -m nas.storage.server serve`), each started once.

Everything goes through `make_storage`, as the harness opens a study: a study is created
once and loaded back, trials and what they record round-trip, a dead worker's RUNNING trial
is failed (by its owner on every kind, by its heartbeat on the RDB kinds, its cause kept) and
its architecture asked again up to `max_retries`, two workers checking at once fail it once,
a worker whose search is over waits for its peers' trials (`settle`),
`dashboard_target` opens the study, and no error shows a password.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from nas import storage
from nas.search.records import StudyRecords
from nas.storage.opening import CONNECT_S
from nas.storage.url import StorageKind, masked
from nas.study.orphans import fail_running, settle
from nas.study.trials import INTERRUPTED, OWNER, counted, fail_reason
from tests.nas.storage.common import (
    SECRET,
    SPACE,
    Backend,
    dead_owner,
    open_study,
    silence,
    started,
)

pytestmark = pytest.mark.filterwarnings("ignore:Heartbeat of storage")


@pytest.fixture(scope="module", params=list(StorageKind), ids=lambda kind: kind.value)
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    kind: StorageKind = request.param
    with started(kind, tmp_path_factory.mktemp(kind.value)) as running:
        yield running


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """The study of this test (one storage holds every test's)."""
    return request.node.name


def test_a_study_is_created_once_and_loaded_back(backend: Backend, name: str) -> None:
    created = optuna.create_study(
        study_name=name,
        storage=storage.make_storage(backend.url),
        directions=["minimize", "maximize"],
    )
    created.set_user_attr("task", "charlm")
    with pytest.raises(optuna.exceptions.DuplicatedStudyError):
        optuna.create_study(study_name=name, storage=storage.make_storage(backend.url))
    loaded = optuna.load_study(study_name=name, storage=storage.make_storage(backend.url))
    assert loaded.directions == [
        optuna.study.StudyDirection.MINIMIZE,
        optuna.study.StudyDirection.MAXIMIZE,
    ]
    assert loaded.user_attrs == {"task": "charlm"}
    assert name in optuna.study.get_all_study_names(storage.make_storage(backend.url))


def test_trials_and_what_they_record_round_trip(backend: Backend, name: str) -> None:
    study = open_study(backend.url, name)
    space: dict[str, optuna.distributions.BaseDistribution] = {
        "x": optuna.distributions.FloatDistribution(0, 1),
        "cells": optuna.distributions.IntDistribution(1, 8),
        "op": optuna.distributions.CategoricalDistribution(["conv", "attention"]),
    }
    done, pruned, failed = (study.ask(space) for _ in range(3))
    done.set_user_attr(OWNER, storage.this_owner())
    done.set_user_attr("blocks", [[1, 2], [3]])
    done.report(0.75, step=2)
    study.tell(done, 0.5)
    pruned.report(0.9, step=1)
    study.tell(pruned, state=TrialState.PRUNED)
    study.tell(failed, state=TrialState.FAIL)
    queued = {"x": 0.25, "cells": 3, "op": "conv"}
    study.enqueue_trial(queued, user_attrs={"retry_of": done.number})

    trials = open_study(backend.url, name).trials  # as another worker reads them
    assert [t.state for t in trials] == [
        TrialState.COMPLETE,
        TrialState.PRUNED,
        TrialState.FAIL,
        TrialState.WAITING,
    ]
    assert [t.params for t in trials[:3]] == [done.params, pruned.params, failed.params]
    assert trials[0].values == [0.5] and trials[0].intermediate_values == {2: 0.75}
    assert trials[0].user_attrs == {OWNER: storage.this_owner(), "blocks": [[1, 2], [3]]}
    assert trials[1].intermediate_values == {1: 0.9} and trials[1].values == [0.9]  # its last
    assert trials[3].system_attrs["fixed_params"] == queued
    assert trials[3].user_attrs == {"retry_of": done.number}
    assert study.ask(space).params == queued  # the queued trial is asked first


def test_only_orphaned_trials_are_failed_and_asked_again(backend: Backend, name: str) -> None:
    """The owner tag: a RUNNING trial whose owner died on this host is failed (uncounted)
    and asked again; a live owner's, another machine's and another worker's are not,
    until that worker says its own stage processes died."""
    study = open_study(backend.url, name)
    orphan, live, remote, mine = (study.ask(SPACE) for _ in range(4))
    gone = dead_owner()
    assert not storage.owner_alive(gone) and storage.owner_alive(storage.this_owner())
    assert storage.owner_alive("another-machine:1") and storage.owner_alive(None)
    orphan.set_user_attr(OWNER, gone)
    live.set_user_attr(OWNER, storage.this_owner())  # another worker, alive
    remote.set_user_attr(OWNER, "another-machine:1")  # unknown: left to its heartbeat
    mine.set_user_attr(OWNER, "me:7")
    assert fail_running(study, "left running") == 1  # a harness starting: orphans only
    states = {t.number: t.state for t in study.get_trials()}
    assert states[orphan.number] == TrialState.FAIL
    assert {states[t.number] for t in (live, remote, mine)} == {TrialState.RUNNING}
    assert fail_running(study, "stage 1 died", owner="me:7") == 1  # its stages died
    trials = study.get_trials()
    assert trials[mine.number].state == TrialState.FAIL
    assert trials[live.number].state == TrialState.RUNNING
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert all(t.user_attrs[INTERRUPTED] and not counted(t) for t in failed)
    retries = [t for t in trials if t.state == TrialState.WAITING]
    assert [t.user_attrs["retry_of"] for t in retries] == [orphan.number, mine.number]
    assert [t.system_attrs["fixed_params"] for t in retries] == [orphan.params, mine.params]


def test_a_dead_workers_architecture_is_asked_again_at_most_max_retries_times(
    backend: Backend, name: str
) -> None:
    study = open_study(backend.url, name, max_retries=2)
    first = study.ask(SPACE)
    first.set_user_attr(OWNER, "me:7")
    attempts = []
    for _ in range(4):  # the worker dies on this architecture every time
        assert fail_running(study, "stage 1 died", owner="me:7", max_retries=2) in (0, 1)
        if not [t for t in study.get_trials() if t.state == TrialState.WAITING]:
            break
        trial = study.ask(SPACE)  # the retry: same parameters, its attempt number
        trial.set_user_attr(OWNER, "me:7")
        attempts.append(trial.user_attrs[storage.ATTEMPT])
        assert trial.params == first.params
    assert attempts == [1, 2]  # then no third retry
    last = study.get_trials()[-1]
    assert last.state == TrialState.FAIL
    assert last.user_attrs["fail_reason"] == "stage 1 died (retried 2 times: not again)"


def test_a_silent_workers_trial_is_failed_by_its_heartbeat_where_trials_beat(
    backend: Backend, name: str
) -> None:
    """On the RDB kinds a trial that beats stays, and one silent longer than the grace is
    failed (uncounted, its cause on the study) and asked again, up to `max_retries`. A journal
    file or the gRPC proxy has no heartbeat: a silent trial of another machine stays."""
    study = open_study(backend.url, name, heartbeat_s=1, grace_s=1, max_retries=1)
    interval = getattr(StudyRecords(study).storage, "get_heartbeat_interval", lambda: None)
    assert (interval() == 1) == backend.has_heartbeats
    trial = study.ask(SPACE)
    trial.set_user_attr(OWNER, "another-machine:1")  # alive as far as this host knows
    beat = storage.Heartbeat(study, trial)
    beat.start()
    if backend.has_heartbeats:
        time.sleep(2.5)  # longer than the grace (SQLite's clock counts whole seconds)
    fail_running(study, "left running")
    beat.stop()
    assert study.get_trials()[0].state == TrialState.RUNNING  # beating, or no heartbeat
    if not backend.has_heartbeats:
        return
    asked = [study.get_trials()[0]]
    while True:  # the worker falls silent on this architecture every time
        silence(backend.url, asked[-1:])
        fail_running(study, "left running")
        if not [t for t in study.get_trials() if t.state == TrialState.WAITING]:
            break
        trial = study.ask(SPACE)
        assert trial.user_attrs == {"retry_of": asked[-1].number, storage.ATTEMPT: len(asked)}
        assert trial.params == asked[0].params
        beat = storage.Heartbeat(study, trial)
        beat.start()
        beat.stop()  # it beat once
        asked.append(study.get_trials()[-1])
    trials = study.get_trials()
    assert [t.number for t in trials] == [t.number for t in asked] and len(asked) == 2
    assert all(t.state == TrialState.FAIL and not counted(t) for t in trials)
    assert not any("fail_reason" in t.user_attrs for t in trials)  # closed: on the study
    causes = [fail_reason(t, study.user_attrs) for t in trials]
    assert causes == [storage.STALE, f"{storage.STALE} (retried 1 times: not again)"]


def test_settle_waits_for_a_peers_trial_fails_a_dead_ones_and_stops_at_its_wait(
    backend: Backend, name: str
) -> None:
    """Before a stage reads the study's results (the retraining picks its best), a worker
    whose search is over waits for its peers' trials: a live peer's trial until it is told,
    a dead peer's failed at once; one still running after the wait is named, not waited
    for forever (the soak's two workers once retrained different models)."""
    study = open_study(backend.url, name)
    peer, orphan = study.ask(SPACE), study.ask(SPACE)
    peer.set_user_attr(OWNER, storage.this_owner())  # alive: this process
    orphan.set_user_attr(OWNER, dead_owner())
    assert settle(study, wait_s=0.2, poll_s=0.05) == [peer.number]
    assert study.get_trials()[orphan.number].state == TrialState.FAIL
    timer = threading.Timer(0.5, lambda: study.tell(peer, 0.25))
    timer.start()
    assert settle(study, wait_s=60, poll_s=0.05) == []
    timer.join()
    assert study.get_trials()[peer.number].state == TrialState.COMPLETE


def test_workers_checking_at_once_fail_and_ask_again_each_orphan_once(
    backend: Backend, name: str
) -> None:
    """Two workers (two storages on one study) run the check before an ask at the same
    moment, over trials whose owner died and, where trials beat, trials whose heartbeat
    went silent: each is failed once and enqueued again once."""
    studies = [open_study(backend.url, name), open_study(backend.url, name)]
    orphans = [studies[0].ask(SPACE) for _ in range(8)]
    gone, silent = dead_owner(), backend.has_heartbeats  # half of them silent there
    for i, trial in enumerate(orphans):
        trial.set_user_attr(OWNER, "another-machine:1" if silent and i % 2 else gone)
    for trial in orphans[1::2] if silent else []:
        beat = storage.Heartbeat(studies[0], trial)
        beat.start()
        beat.stop()  # it beat once
    if silent:
        silence(backend.url, orphans[1::2])
    together = threading.Barrier(2)

    def check(study: optuna.Study) -> int:
        together.wait()
        return fail_running(study, "left running")

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(check, studies))
    trials = studies[1].get_trials()
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert sorted(t.user_attrs["retry_of"] for t in waiting) == [t.number for t in orphans]
    assert {trials[t.number].state for t in orphans} == {TrialState.FAIL}


def test_the_dashboard_target_opens_the_study(
    backend: Backend, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the report tells `optuna-dashboard` to open: the study's storage, without its
    password (the server's client reads PGPASSWORD); for the proxy, the database behind it
    (the dashboard speaks SQL, not gRPC)."""
    open_study(backend.url, name)
    target = storage.dashboard_target(backend.url)
    if backend.kind == StorageKind.GRPC:
        assert target == f"<the --storage URL of the proxy at {backend.url}>"
        return
    if backend.password is not None:
        assert backend.password not in target
        monkeypatch.setenv("PGPASSWORD", backend.password)
    journal = backend.kind == StorageKind.JOURNAL
    opened = JournalStorage(JournalFileBackend(target)) if journal else target
    assert name in optuna.study.get_all_study_names(opened)


def test_no_error_shows_a_password(backend: Backend) -> None:
    """A URL of this kind that cannot be used fails at once, in one line naming it with
    its password masked."""
    if not backend.unopenable:
        pytest.skip(f"a {backend.kind.value} URL is a file's path: it holds no password")
    for url, says in backend.unopenable:
        began = time.monotonic()
        with pytest.raises((storage.StorageError, ValueError), match=says) as caught:
            storage.make_storage(url)
        said = str(caught.value)
        assert time.monotonic() - began < CONNECT_S
        assert masked(url) in said and SECRET not in said and "\n" not in said
        assert backend.password is None or backend.password not in said
