"""Two workers retraining one study at once train each (model, seed) run once
(`nas.retrain.claims`): a claim is taken by exactly one of many racing takers, a dead
holder's claim or a recorded run's is taken over and a live holder's is not, a waiting
worker names what it waits for and stops after `retrain.claim_wait_s`; and two real
retrainings of one stored study end with the same result, each run trained by one."""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import subprocess
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NoReturn

import optuna
import pytest

from nas.job_log import JOB_LOG_ENV, JobLog
from nas.retrain.claims import Claim, Run, RunClaims, Step, exclusive, holder, release, take
from nas.retrain.runs import record_path, save
from nas.retrain.stage import RetrainRun, retrain
from nas.settings import RetrainSettings
from nas.storage.opening import owner_alive, this_owner
from nas.study.run import run_study
from nas.study.trials import OWNER
from tests.nas.harness.common import tiny_settings


def claim_of(path: Path, owner: str, digest: str | None = None) -> str:
    """Write a claim of `owner` at `path`, as another worker would; returns its text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"owner": owner, "time": "2026-01-01T00:00:00+00:00", "digest": digest})
    path.write_text(text)
    return text


def dead_owner() -> str:
    """The owner tag of a process of this host that has exited."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    owner = f"{socket.gethostname()}:{gone.pid}"
    assert not owner_alive(owner)
    return owner


def race(takers: int, path: Path) -> list[Claim]:
    """`take(path)` in `takers` threads let go together; the claims they took."""
    barrier = threading.Barrier(takers)

    def one(_: int) -> Claim | None:
        barrier.wait()
        return take(path)

    with ThreadPoolExecutor(takers) as pool:
        return [claim for claim in pool.map(one, range(takers)) if claim is not None]


def test_a_claim_is_taken_by_exactly_one_of_racing_takers(tmp_path: Path) -> None:
    for round_ in range(40):
        path = tmp_path / f"round-{round_}" / "seed-0.claim"
        won = race(4, path)
        assert len(won) == 1 and holder(path) == won[0] and won[0].owner == this_owner()
        assert [p.name for p in path.parent.iterdir()] == ["seed-0.claim"]  # nothing beside


def test_a_dead_holders_claim_is_taken_over_by_exactly_one(tmp_path: Path) -> None:
    # 6 takers: a takeover that moved the claim aside to check it let a third taker in
    # (two holders) in about 1 round of 10 here
    for round_ in range(50):
        path = tmp_path / f"round-{round_}" / "seed-0.claim"
        claim_of(path, dead_owner())
        won = race(6, path)
        assert len(won) == 1 and holder(path) == won[0]
        assert [p.name for p in path.parent.iterdir()] == ["seed-0.claim"]


def release_among_takers(run: Run, mine: Claim, takers: int) -> list[Claim]:
    """The holder releases `mine` while `takers` threads take the run's claim, let go
    together; the claims they took."""
    barrier = threading.Barrier(takers + 1)

    def one(taker: int) -> Claim | None:
        barrier.wait()
        if taker == takers:
            release(run.claim, mine)
            return None
        return take(run.claim, run.digest, run.finished)

    with ThreadPoolExecutor(takers + 1) as pool:
        return [claim for claim in pool.map(one, range(takers + 1)) if claim is not None]


def test_a_recorded_runs_claim_released_while_taken_over_removes_only_itself(
    tmp_path: Path,
) -> None:
    # a recorded run's claim is stale whoever holds it: takers may replace one another,
    # but the holder's release never removes a taker's claim, and nothing is left beside
    for round_ in range(30):
        run = Run(tmp_path / f"round-{round_}", 0, "digest")
        mine = take(run.claim, run.digest, run.finished)
        assert mine is not None
        save(run.folder, run.seed, run.digest, {"seed": 0})  # recorded: its claim is stale
        won = release_among_takers(run, mine, 4)
        assert holder(run.claim) in won if won else holder(run.claim) is None
        assert not list(run.claim.parent.glob(".*"))  # no right or partial left behind


def test_a_live_holders_claim_is_kept_until_its_run_is_recorded(tmp_path: Path) -> None:
    run = Run(tmp_path / "trial-0", 1, "digest")
    for owner in (this_owner(), "another-host:1", "not a tag"):  # alive, or cannot be told
        text = claim_of(run.claim, owner, run.digest)
        assert take(run.claim, run.digest, run.finished) is None
        assert run.claim.read_text() == text
    save(run.folder, run.seed, "another digest", {"seed": 1})  # another run's record: held
    assert take(run.claim, run.digest, run.finished) is None
    save(run.folder, run.seed, run.digest, {"seed": 1})  # its holder finished and vanished
    mine = take(run.claim, run.digest, run.finished)
    assert mine is not None and holder(run.claim) == mine
    release(run.claim, Claim.parse(claim_of(tmp_path / "other.claim", "x:1")))  # not mine
    assert holder(run.claim) == mine
    release(run.claim, mine)
    assert not run.claim.exists()


def test_exclusive_waits_for_its_holder_and_names_it(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "export.claim"
    with exclusive(path, wait_s=5) as held:
        assert holder(path) == held
        late = pytest.raises(TimeoutError, match=r"export\.claim has been held by .*delete it")
        with late, exclusive(path, wait_s=0.1):
            pass
    assert not path.exists()
    claim_of(path, dead_owner())  # a worker killed while it exported
    with exclusive(path, wait_s=5) as held:
        assert held.owner == this_owner()


def test_a_waiting_worker_names_the_run_and_its_holder_then_reads_or_times_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = Run(tmp_path / "trial-3", 0, "d"), Run(tmp_path / "trial-3", 1, "d")
    claim_of(first.claim, "elsewhere:7", "d")
    claims = RunClaims(wait_s=0.3, poll_s=0.01)
    assert claims.next([first, second]) == Step("train", 1)  # the held run is skipped
    claims.release(second)
    assert not second.claim.exists()
    with caplog.at_level(logging.INFO, logger="nas.retrain.claims"):
        assert claims.next([first]) == Step("wait")
        assert claims.next([first]) == Step("wait")
    waits = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    since = "since 2026-01-01T00:00:00+00:00"
    assert waits == [
        f"retrain trial-3 seed 0: waiting for its record; elsewhere:7 trains it {since}"
    ]
    with pytest.raises(TimeoutError, match=r"trial-3 seed 0: no record after 0\.3 s; elsewhere:7"):
        while True:
            claims.next([first])
    save(first.folder, 0, "d", {"seed": 0})
    assert claims.next([first]) == Step("read", 0, {"seed": 0})


def test_claim_wait_s_is_seconds() -> None:
    assert RetrainSettings().claim_wait_s == 7200
    for bad in (0, -1.0, math.inf, True, "1"):
        with pytest.raises(ValueError, match="retrain.claim_wait_s=.* is not valid"):
            RetrainSettings(claim_wait_s=bad)  # type: ignore[arg-type]


def test_a_missing_study_on_a_server_is_named_without_its_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = tiny_settings(tmp_path, "study.storage=postgresql://u:secret@db.example/nas")

    def not_there(**_: object) -> NoReturn:
        raise KeyError("nas")  # what Optuna raises for a study its storage does not hold

    monkeypatch.setattr("nas.storage.make_storage", lambda url, **_: None)
    monkeypatch.setattr("optuna.load_study", not_there)
    with pytest.raises(ValueError, match="no study 'nas' in postgresql://u:\\*\\*\\*@db") as error:
        retrain(settings)
    assert "secret" not in str(error.value)


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_two_retrainings_at_once_train_each_run_once_and_end_alike(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = tiny_settings(
        tmp_path,
        "study.name=two",
        "study.n_trials=1",
        "tracker=none",
        "train.steps=2",  # the search: one trial of 2 steps
        "train.eval_every=8",  # the retraining: scored at its end only
        "train.decode_pairs=0",
        "train.final_decode_pairs=0",
        "retrain.top_k=1",
        "retrain.seeds=[0,1]",
        "retrain.steps=4",
        "retrain.decode_pairs=2",
        f"retrain.models_dir={tmp_path / 'models'}",
    )
    run_study(settings)
    log = tmp_path / "workers.log"  # both workers' stage processes log here
    monkeypatch.setenv(JOB_LOG_ENV, JobLog(str(log), logging.INFO, "%(message)s").to_env())
    with ThreadPoolExecutor(2) as pool:
        first, second = pool.map(lambda _: retrain(settings), range(2))

    assert first == second  # the same runs (the trained one and its record), selection, export
    assert [(r.model, r.seed, r.error) for r in first.runs] == [
        ("trial-0", s, None) for s in (0, 1)
    ]
    trained = re.findall(r"retrain (\S+) seed (\d): claimed by \S+, trained here", log.read_text())
    assert Counter(trained) == {("trial-0", "0"): 1, ("trial-0", "1"): 1}, log.read_text()
    folder = Path(first.exported["trial-0"])
    for run in first.runs:  # every record whole, and no claim left behind
        record = json.loads(record_path(folder, run.seed).read_text())
        assert RetrainRun(**record["run"]) == run
    assert not list(folder.glob("runs/*claim*")) and not list(folder.glob("runs/.*"))
    metrics = json.loads((folder / "metrics.json").read_text())
    best = min(first.runs, key=lambda r: r.metrics["validation_loss"])
    assert metrics["seed"] == best.seed and [e["seed"] for e in metrics["per_seed"]] == [0, 1]


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_a_worker_done_searching_chooses_after_its_peers_trial_ends(tmp_path: Path) -> None:
    """The soak's two workers once retrained different models: one chose while the other
    still trained a trial that then led. A worker whose search is over waits for its
    peers' trials (`nas.study.orphans.settle`) and chooses the model that trial trained."""
    settings = tiny_settings(
        tmp_path,
        "study.name=peers",
        "study.n_trials=1",
        "search_space.seeds=[evolved_transformer]",  # one seed: none left waiting
        "tracker=none",
        "retrain.top_k=1",
        "retrain.seeds=[0]",
        "retrain.steps=2",
        "retrain.seed_models=false",
        "retrain.decode_pairs=2",
        f"retrain.models_dir={tmp_path / 'models'}",
    )
    run_study(settings)
    study = optuna.load_study(study_name="peers", storage=settings.storage_url)
    [mine] = study.get_trials()
    study.enqueue_trial(mine.params)
    peer = study.ask(mine.distributions)  # a peer's trial of this architecture, training
    peer.set_user_attr(OWNER, this_owner())
    assert mine.value is not None
    better = mine.value - 1.0
    told = threading.Timer(1.0, lambda: study.tell(peer, better))  # it will lead
    told.start()
    result = retrain(settings)
    told.join()
    assert result.selected == f"trial-{peer.number}"
