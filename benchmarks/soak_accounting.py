"""What the soak checks at its end, from the study's storage and the files alone.

After a soak (`soak.py`) nothing of the harness is asked: the study is read from its
database, the weights from the artifact store, the retraining from its model folders and
what the workers said from their job logs. Each check returns its figures and a list of
violations (empty: it holds):

    trials      no trial left RUNNING; every FAIL has its cause (`nas.study.trials.fail_reason`:
                its own, or for one Optuna's heartbeat check failed, the study's record);
                a trial left WAITING is a retry enqueued after the workers' last ask (the
                budget ran out), which a rerun trains first
    retries     no architecture trained more often than the retry cap allows
                (1 + `study.max_retries`), and every repeat names the trial it retries
    inherited   every child that took weights took them from its own evolution parent: from
                its worker's own copy (written or checked before), or from an artifact (kept
                with the trial, or late or again on the study) that was whole when it
                started (checked now, or damaged by the nemesis only after); every child of
                a parent whose artifact the nemesis damaged, started after the damage,
                refused it and trained from scratch, unless its worker had its own copy or
                the weights were kept again
    results     every trial a worker logged as told is in the storage in that state with
                that value, and the study's best is the best of those logged
    retraining  every model folder's export loads (`nas.load_model`), every run record
                reads, no claim, partial record or checkpoint of a recorded run is left, and
                every worker's last retraining selected the same model (its job log)
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from nas import load_model, storage
from nas.search.lineage import KEY_PARENT
from nas.study.inheritance import INHERITED_FROM
from nas.study.kept_weights import (
    INHERIT_REFUSED,
    INHERITED_COPY,
    WEIGHTS_ARTIFACT,
    WEIGHTS_NOT_KEPT,
    WEIGHTS_SHA256,
    check_weights,
    late_weights_key,
)
from nas.study.phases import shares
from nas.study.trials import INVALID, counted, fail_reason

__all__ = ["account", "candidates_per_hour"]

_TOLD = re.compile(r"trial (\d+) (complete|pruned): (.*)$")


def account(
    study: optuna.Study,
    store: Path,
    logs: Iterable[Path],
    models: Path | None,
    damaged: list[dict[str, Any]],
    max_retries: int = storage.MAX_RETRIES,
) -> dict[str, Any]:
    """Every check of the module doc: {check: {figures..., "violations": [...]}}."""
    trials = study.get_trials(deepcopy=False)
    logs = list(logs)
    checks = {
        "trials": _trials(trials, study.user_attrs),
        "retries": _retries(trials, max_retries),
        "inherited": _inherited(trials, store, damaged, _kept_late(study, trials)),
        "results": _results(study, trials, logs),
    }
    if models is not None:
        checks["retraining"] = _retraining(models, logs)
    return checks


def candidates_per_hour(study: optuna.Study) -> dict[str, Any]:
    """Counted trials (complete or pruned, not interrupted or invalid) per hour of the
    search's wall time: from the first trial's start to the last one's end; and where the
    trials' seconds went (`nas.study.phases`: a restart's cost is its next trial's "before")."""
    trials = [t for t in study.get_trials(deepcopy=False) if t.datetime_complete is not None]
    starts = [t.datetime_start for t in trials if t.datetime_start is not None]
    ends = [t.datetime_complete for t in trials if t.datetime_complete is not None]
    if not starts or not ends:
        return {"candidates": 0, "hours": 0.0, "per_hour": 0.0}
    hours = (max(ends) - min(starts)).total_seconds() / 3600
    candidates = sum(counted(t) for t in trials)
    trial_s, by_phase = shares(t.user_attrs for t in trials)
    return {
        "candidates": candidates,
        "hours": hours,
        "per_hour": candidates / hours,
        "trial_seconds": trial_s,
        "time_share_by_phase": by_phase,
    }


def _trials(trials: list[FrozenTrial], study_attrs: dict[str, Any]) -> dict[str, Any]:
    violations = [
        f"trial {t.number} is still RUNNING" for t in trials if t.state == TrialState.RUNNING
    ]
    causes = {t.number: fail_reason(t, study_attrs) for t in trials if t.state == TrialState.FAIL}
    violations += [f"trial {n} failed with no cause" for n, c in causes.items() if c is None]
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    violations += [  # a retry queued after the last ask is a rerun's first trial
        f"trial {t.number} waits and retries no trial"
        for t in waiting
        if storage.RETRY_OF not in t.user_attrs
    ]
    return {
        "states": dict(Counter(t.state.name for t in trials)),
        "waiting_retries": len(waiting),
        "failed_by_heartbeat": sum(
            "fail_reason" not in t.user_attrs for t in trials if t.state == TrialState.FAIL
        ),
        "causes": dict(Counter(re.sub(r"\d+", "N", str(c))[:120] for c in causes.values())),
        "violations": violations,
    }


def _retries(trials: list[FrozenTrial], max_retries: int) -> dict[str, Any]:
    by_architecture: dict[str, list[FrozenTrial]] = defaultdict(list)
    for t in trials:
        if not t.user_attrs.get(INVALID) and t.state != TrialState.WAITING:
            by_architecture[json.dumps(t.params, sort_keys=True)].append(t)
    violations = []
    for group in by_architecture.values():
        if len(group) > 1 + max_retries:
            violations.append(
                f"trials {[t.number for t in group]}: one architecture, trained "
                f"{len(group)} times (the cap: {1 + max_retries})"
            )
        unnamed = [t.number for t in group[1:] if storage.RETRY_OF not in t.user_attrs]
        if unnamed:
            violations.append(f"trials {unnamed} repeat trial {group[0].number} naming no retry")
    repeated = [g for g in by_architecture.values() if len(g) > 1]
    return {
        "architectures": len(by_architecture),
        "retried": len(repeated),
        "most_attempts": max((len(g) for g in by_architecture.values()), default=0),
        "violations": violations,
    }


def _inherited(
    trials: list[FrozenTrial],
    store: Path,
    damaged: list[dict[str, Any]],
    late: dict[int, tuple[str, str]],
) -> dict[str, Any]:
    kept = {t.number: found for t in trials if (found := _kept(t, late)) is not None}
    by_artifact = {t.user_attrs.get(WEIGHTS_ARTIFACT): t for t in trials}
    by_artifact |= {artifact: trials[number] for number, (artifact, _) in late.items()}
    damage_at = {d["artifact"]: d["at"] for d in damaged}
    whole: dict[int, bool] = {}
    violations: list[str] = []
    inherited = refused = own = 0
    for child in trials:
        source = child.user_attrs.get(INHERITED_FROM)
        if source is None or child.datetime_start is None:
            continue
        inherited += 1
        parent = trials[int(source)]
        if _parent(trials, child) != parent.number:
            violations.append(
                f"trial {child.number} took trial {parent.number}'s weights, "
                f"not its parent's ({_parent(trials, child)})"
            )
        if child.user_attrs.get(INHERITED_COPY) == "own":
            own += 1  # its worker's copy, whole when written or fetched
            continue
        artifact, sha256 = kept.get(parent.number, (None, None))
        when = damage_at.get(artifact, math.inf)
        if when < child.datetime_start.timestamp():
            violations.append(
                f"trial {child.number} took trial {parent.number}'s weights, "
                "damaged before it started"
            )
        elif when == math.inf and not whole.setdefault(
            parent.number, _whole(store, artifact, sha256)
        ):
            violations.append(
                f"trial {child.number} took trial {parent.number}'s weights, "
                "which no longer load, and the nemesis did not damage them"
            )
    for artifact, at in damage_at.items():
        damaged_parent = by_artifact.get(artifact)
        if damaged_parent is None:
            continue
        for child in trials:
            later = child.datetime_start is not None and child.datetime_start.timestamp() > at
            if not later or _parent(trials, child) != damaged_parent.number:
                continue
            refused += INHERIT_REFUSED in child.user_attrs
    return {
        "children_inherited": inherited,
        "from_own_copy": own,
        "damaged_artifacts": len(damage_at),
        "damaged_refused": refused,
        "refusals": sum(INHERIT_REFUSED in t.user_attrs for t in trials),
        "not_kept": sum(WEIGHTS_NOT_KEPT in t.user_attrs for t in trials),
        "kept_late": len(late),
        "violations": violations,
    }


def _kept_late(study: optuna.Study, trials: list[FrozenTrial]) -> dict[int, tuple[str, str]]:
    """{trial: (artifact, SHA-256)} of the weights kept after their trial was told (late, or
    again after a child refused them as damaged)."""
    attrs, late = study.user_attrs, {}
    for trial in trials:
        found = attrs.get(late_weights_key(trial.number))
        if found:
            late[trial.number] = (found["artifact"], found["sha256"])
    return late


def _kept(trial: FrozenTrial, late: dict[int, tuple[str, str]]) -> tuple[str, str] | None:
    """Where a trial's weights are in the store, and their SHA-256, as a child fetches them
    (kept late or again: those; None: nowhere)."""
    if trial.number in late:
        return late[trial.number]
    artifact = trial.user_attrs.get(WEIGHTS_ARTIFACT)
    return None if artifact is None else (artifact, trial.user_attrs.get(WEIGHTS_SHA256, ""))


def _parent(trials: list[FrozenTrial], child: FrozenTrial) -> int | None:
    """A child's evolution parent, as its first attempt recorded it (a retry's too)."""
    return storage.first_attempt(trials, child.number).system_attrs.get(KEY_PARENT)


def _whole(store: Path, artifact: str | None, sha256: str | None) -> bool:
    if artifact is None:
        return False
    try:
        check_weights(store / artifact, sha256 or None)
    except (OSError, ValueError):
        return False
    return True


def _results(
    study: optuna.Study, trials: list[FrozenTrial], logs: Iterable[Path]
) -> dict[str, Any]:
    told: dict[int, tuple[str, str]] = {}
    for log in logs:
        for line in log.read_text(errors="replace").splitlines() if log.exists() else []:
            found = _TOLD.search(line)
            if found:
                told[int(found[1])] = (found[2], found[3])
    violations = []
    values: list[float] = []
    for number, (state, text) in sorted(told.items()):
        stored = trials[number] if number < len(trials) else None
        if stored is None or stored.state.name.lower() != state:
            violations.append(
                f"trial {number} was told {state}, the storage has "
                f"{None if stored is None else stored.state.name}"
            )
            continue
        if state == "complete":
            logged = [float(v) for v in re.findall(r"[-+]?\d+\.\d*(?:e[-+]?\d+)?|nan|inf", text)]
            if not stored.values or not all(
                math.isclose(a, b, rel_tol=1e-9)
                for a, b in zip(logged, stored.values, strict=False)
            ):
                violations.append(
                    f"trial {number} was told {logged}, the storage has {stored.values}"
                )
            values.extend(logged[:1])
    best = None
    if values and len(study.directions) == 1:
        pick = min if study.direction == optuna.study.StudyDirection.MINIMIZE else max
        best = pick(values)
        if not math.isclose(best, study.best_value, rel_tol=1e-9):
            violations.append(f"the study's best {study.best_value} is not the best told, {best}")
    return {"told": len(told), "best_told": best, "violations": violations}


def _retraining(models: Path, logs: Iterable[Path]) -> dict[str, Any]:
    violations: list[str] = []
    said = [re.findall(r"retrain done, \d+ runs, selected (\S+)", log.read_text()) for log in logs]
    chosen = {found[-1] for found in said if found}  # each worker's last retraining
    if len(chosen) > 1:
        violations.append(f"the workers retrained to different choices: {sorted(chosen)}")
    exports = records = 0
    for folder in sorted(p for p in models.iterdir() if p.is_dir()) if models.is_dir() else []:
        runs = folder / "runs"
        for record in sorted(runs.glob("seed-*.json")):
            records += 1
            try:
                json.loads(record.read_text())["run"]
            except (OSError, ValueError, KeyError) as error:
                violations.append(f"{record} does not read: {error}")
            left = folder / "checkpoints" / record.stem
            if left.exists():
                violations.append(f"{left} is left beside its recorded run")
        for stray in [*runs.glob("*.claim"), *runs.glob(".*.right"), *runs.glob("*.partial")]:
            violations.append(f"{stray} is left over")
        if (folder / "config.json").exists():
            exports += 1
            try:
                load_model(folder)
            except Exception as error:
                violations.append(f"{folder}'s export does not load: {error}")
    return {
        "exports": exports,
        "records": records,
        "selected": sorted(chosen),
        "violations": violations,
    }
