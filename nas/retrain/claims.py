"""Which worker trains which retraining run, when several retrain one study at once.

Several harness workers on one study each run the retrain stage at its end, and they share
`retrain.models_dir` (one machine, or a file system shared by many). Left alone, each would
train every (model, seed) run, and two of them would write one run's checkpoints and its
model's export at once. A run is claimed instead, by a file beside its record
(`nas.retrain.runs`):

    <retrain.models_dir>/<study>/<model>/runs/seed-<seed>.claim

holding its owner ("<host>:<pid>" of the stage process of rank 0 that trains it, as
`nas.storage.opening.this_owner` tags trials), the time it was taken and the run's
fingerprint. Rank 0 of each worker decides, and hands every decision to its other ranks
(`RunClaims.next`, under `Comm.agree`), numbered:

    1. take     before training a run: its claim is written whole beside, then linked into
                place (`os.link`: atomic, and of many workers exactly one succeeds; where the
                file system has no hard links, an `os.open` O_CREAT|O_EXCL create)
    2. skip     a run whose claim another worker holds (its owner alive) is left to it, and
                the next run is tried: a worker trains every run it can take first; a run
                found recorded (also just after its claim was taken) is read, not trained
    3. stale    a claim whose owner is dead (`nas.storage.opening.owner_alive`: on this host
                and gone) or whose run is recorded is taken over by replacing it. The right
                to replace one claim is itself a claim, taken as in 1 (and, if its holder
                died, as in 3): `.seed-<seed>.claim.<the claim's fingerprint>.right`. Its
                holder checks the claim is still the one judged stale, then puts its own in
                its place (`os.replace`: atomic). Nothing else can change a claim that has a
                holder of its right, so of any number of takers exactly one takes it over,
                and a taker that judged an older claim stale finds it gone and backs off
    4. release  once the run's record is written (or it failed: a waiting worker then tries
                it again, as a later retraining would) its holder removes its claim, under
                the claim's right as in 3 (a worker taking a recorded run's claim over may
                be replacing it at that moment)
    5. wait     with only held runs left, the worker polls: a record that appears is read (so
                every worker ends with the same runs, selection and exports), a claim that is
                released or stale is taken (1, 3) and the run trained here. Each wait is
                logged with the run and its holder; with no run recorded or taken for
                `retrain.claim_wait_s` seconds, it stops with an error naming the claim (a
                holder on another machine that died cannot be told from a slow one)
    6. export   a model's export and records are updated by one worker at a time: under
                `runs/export.claim`, taken as in 1 and 3 and waited for (`exclusive`)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from nas.retrain import runs as retrain_runs
from nas.storage.opening import owner_alive, this_owner

__all__ = [
    "POLL_S",
    "Claim",
    "Run",
    "RunClaims",
    "Step",
    "exclusive",
    "export_lock",
    "holder",
    "release",
    "take",
]

POLL_S = 0.5  # how often a waiting worker looks for a held run's record
LOCK_POLL_S = 0.05  # how often `exclusive` tries its claim again (it is held for seconds)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    """A claim as its file holds it: owner "<host>:<pid>", ISO time, fingerprint, and the
    file's whole text (unique to it: what a takeover checks it removes). A file that cannot
    be read as one (being written without hard links) has no owner: held, never stale."""

    owner: str
    time: str
    digest: str | None
    text: str

    @classmethod
    def new(cls, digest: str | None) -> Claim:
        owner, now = this_owner(), datetime.now(UTC).isoformat(timespec="seconds")
        fields = {"owner": owner, "time": now, "digest": digest, "token": uuid.uuid4().hex}
        return cls(owner, now, digest, json.dumps(fields))

    @classmethod
    def parse(cls, text: str) -> Claim:
        try:
            fields = json.loads(text)
            return cls(str(fields["owner"]), str(fields["time"]), fields.get("digest"), text)
        except (ValueError, TypeError, KeyError):
            return cls("", "", None, text)


def take(
    path: Path, digest: str | None = None, finished: Callable[[Claim], bool] | None = None
) -> Claim | None:
    """Claim `path` for this process (steps 1 and 3): the claim, or None when another live
    holder has it. `finished(claim)`: whether the claim's work is done (its claim stale)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mine = Claim.new(digest)
    if _create(path, mine):
        return mine
    found = holder(path)
    why = None if found is None else _stale(found, finished)  # None: released meanwhile
    if found is None or why is None or not _replace(path, found, mine):
        return None  # held (or released or taken over meanwhile: asked again, it is settled)
    logger.info(
        "claim %s of %s is stale (%s): taken over by %s", path, found.owner, why, mine.owner
    )
    return mine


def holder(path: Path) -> Claim | None:
    """The claim at `path`, None when there is none."""
    try:
        return Claim.parse(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None


def release(path: Path, claim: Claim) -> None:
    """Remove `claim`, this process's, from `path` (step 4); not a claim that replaced it."""
    _replace(path, claim, None)


@contextmanager
def exclusive(path: Path, wait_s: float) -> Iterator[Claim]:
    """Hold the claim `path` for the block (step 6), waiting up to `wait_s` seconds for
    another holder; TimeoutError naming it after that."""
    deadline = time.monotonic() + wait_s
    while (claim := take(path)) is None:
        if time.monotonic() > deadline:
            found = holder(path)
            raise TimeoutError(
                f"{path} has been held by {found.owner if found else 'another worker'} for "
                f"over {wait_s:g} s (retrain.claim_wait_s); if that worker is gone, delete it"
            )
        time.sleep(LOCK_POLL_S)
    try:
        yield claim
    finally:
        release(path, claim)


def export_lock(model_folder: Path) -> Path:
    """The claim a worker holds while it updates `model_folder`'s export and records."""
    return model_folder / "runs" / "export.claim"


@dataclass(frozen=True)
class Run:
    """One (model, seed) run as the claims see it: its model folder, seed and fingerprint."""

    folder: Path
    seed: int
    digest: str

    @property
    def name(self) -> str:
        return f"{self.folder.name} seed {self.seed}"

    @property
    def claim(self) -> Path:
        """`runs/seed-<seed>.claim`, beside the run's record."""
        return retrain_runs.record_path(self.folder, self.seed).with_suffix(".claim")

    def record(self) -> dict[str, Any] | None:
        """The run's record (`nas.retrain.runs.load`), if it was trained as `digest` says."""
        found = retrain_runs.load(self.folder, self.seed, self.digest)
        return None if found is None else found[0]

    def finished(self, claim: Claim) -> bool:
        """Whether the run `claim` was taken for is recorded (the claim is stale)."""
        digest = claim.digest
        return digest is not None and retrain_runs.load(self.folder, self.seed, digest) is not None


@dataclass(frozen=True)
class Step:
    """Rank 0's decision, shared with every rank: train the run `left[index]` here, take
    its `record` another worker wrote, or wait (rank 0 waited: ask again)."""

    action: Literal["train", "read", "wait"]
    index: int = -1
    record: dict[str, Any] | None = None


class RunClaims:
    """Rank 0's claims of the runs its worker has left (module doc, steps 1-5); a wait with
    nothing recorded or taken for `wait_s` seconds is a TimeoutError."""

    def __init__(self, wait_s: float, poll_s: float = POLL_S) -> None:
        self.wait_s, self.poll_s = wait_s, poll_s
        self._held: dict[Run, Claim] = {}
        self._since = time.monotonic()
        self._told: tuple[Run, str] | None = None  # the wait logged last

    def next(self, left: Sequence[Run]) -> Step:
        """What to do next about `left` (not empty): read the first recorded run, else train
        the first one this worker can take, else wait for the first one (after `poll_s`)."""
        for index, run in enumerate(left):
            step = self._try(index, run)
            if step is not None:
                self._since = time.monotonic()
                return step
        self._wait(left[0])
        return Step("wait")

    def release(self, run: Run) -> None:
        """After `run` was recorded (or failed): its claim goes (step 4)."""
        claim = self._held.pop(run, None)
        if claim is not None:
            release(run.claim, claim)

    def release_all(self) -> None:
        for run in list(self._held):
            self.release(run)

    def _try(self, index: int, run: Run) -> Step | None:
        """Read `run`'s record, else take its claim to train it; None: another worker holds
        it. A record written while the claim was taken (its holder done) is read instead."""
        record = run.record()
        claim = take(run.claim, run.digest, run.finished) if record is None else None
        if claim is not None and (record := run.record()) is not None:
            release(run.claim, claim)
        elif claim is not None:
            self._held[run] = claim
            logger.info("retrain %s: claimed by %s, trained here", run.name, claim.owner)
            return Step("train", index)
        if record is None:
            return None
        logger.info("retrain %s: trained by another worker, its record read", run.name)
        return Step("read", index, record)

    def _wait(self, run: Run) -> None:
        found = holder(run.claim)
        owner = (found.owner or "a worker") if found is not None else "nobody (released)"
        if time.monotonic() - self._since > self.wait_s:
            raise TimeoutError(
                f"retrain {run.name}: no record after {self.wait_s:g} s; {owner} holds its "
                f"claim {run.claim}. If that worker is gone (one on another machine cannot be "
                "checked from here), delete the claim and retrain again; if it is only slow, "
                "raise retrain.claim_wait_s"
            )
        if self._told != (run, owner):
            self._told = (run, owner)
            since = f" since {found.time}" if found is not None and found.time else ""
            logger.info(
                "retrain %s: waiting for its record; %s trains it%s", run.name, owner, since
            )
        time.sleep(self.poll_s)


def _create(path: Path, claim: Claim) -> bool:
    """Step 1: `claim` at `path` if there is none there (written whole beside first)."""
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    partial.write_text(claim.text, encoding="utf-8")
    try:
        return _link(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _link(source: Path, target: Path) -> bool:
    """Give `target` the text of `source` if `target` does not exist (atomic: of many
    callers one succeeds): a hard link; an O_CREAT|O_EXCL create without hard links."""
    try:
        os.link(source, target)
    except FileExistsError:
        return os.stat(source).st_nlink > 1  # NFS: a retried link answers EEXIST yet linked
    except OSError:  # a file system without hard links
        try:
            fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(source.read_text(encoding="utf-8"))
    return True


def _stale(found: Claim, finished: Callable[[Claim], bool] | None) -> str | None:
    """Why `found` is stale (step 3), or None: it is held."""
    if not owner_alive(found.owner):
        return "its process is gone"
    if finished is not None and finished(found):
        return "its run is recorded"
    return None


def _replace(path: Path, claim: Claim, new: Claim | None) -> bool:
    """Put `new` in place of `claim` at `path` (None: remove it), unless `path` holds
    another claim by then; whether it did (steps 3 and 4). Under the claim's right: a claim
    of its own (module doc), whose holder is alive while it holds it, so only it changes
    `path` from `claim` to anything else."""
    fingerprint = hashlib.sha256(claim.text.encode()).hexdigest()[:32]
    right = path.with_name(f".{path.name}.{fingerprint}.right")
    held = take(right)
    if held is None:
        return False  # another worker replaces it (or removes it) now
    try:
        found = holder(path)
        if found is None or found.text != claim.text:
            return False  # replaced or removed already
        if new is None:
            path.unlink()
            return True
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
        partial.write_text(new.text, encoding="utf-8")
        os.replace(partial, path)
        return True
    finally:
        right.unlink(missing_ok=True)  # never stale while this process lives: still ours
