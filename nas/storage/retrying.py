"""Storage calls that wait out a database server's outage instead of failing the study.

A database server restarts (an upgrade, a fail-over, a crashed host brought back): for some
seconds every query fails. Without help each failure would reach the harness's decisions
and stop the study on every worker. `RetryingStorage` wraps the storage of a server URL
(`postgresql://`, `mysql://`, `grpc://`; `nas.storage.opening.make_storage`), so every call made
through it, by rank 0's decisions, the heartbeat thread, the samplers and pruners and the
harness between launches alike, goes through one `_call`:

    1. the call fails with a transient error (`transient`: the connection was refused,
       dropped or reset, the server is starting or shutting down, the gRPC proxy is
       unavailable): it is made again after 0.5, 1, 2, 4, 5, 5, ... seconds;
    2. the first failure logs a warning naming the storage (password masked) and what
       failed, another every `REMIND_S` seconds while it lasts, and one when the storage
       answers again; the listener (`on_wait`: rank 0's progress bar) hears the same;
    3. once the outage has lasted `wait_s` (`study.storage_wait_s`), the call raises
       `StorageUnavailableError` naming the storage; after that the next calls try once
       each (no second wait) until one succeeds, so a worker whose storage is gone ends
       within about `wait_s`, not once per call;
    4. any other error (a wrong password, a missing table, a finished trial updated) is
       raised at once, as the storage raised it.

A write whose reply was lost (the server committed it, then the connection dropped) is
made again: the one Optuna refuses the second time, finishing a trial, is recognised (the
trial is already in that state) and counts as done. A trial created twice that way would
stay RUNNING with no owner: a window of a few microseconds per outage, left as it is.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Container, Sequence
from typing import TYPE_CHECKING, Any

import optuna
import sqlalchemy.exc
from optuna.distributions import BaseDistribution
from optuna.storages import BaseStorage

# Optuna sees a storage's heartbeats only on a subclass of this private class (its
# `is_heartbeat_enabled`), so the wrapper must be one: the one private name used here.
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

if TYPE_CHECKING:
    from optuna.study._frozen import FrozenStudy

__all__ = [
    "BACKOFF_S",
    "REMIND_S",
    "RetryingStorage",
    "StorageError",
    "StorageUnavailableError",
    "root_cause",
    "transient",
]

BACKOFF_S = (0.5, 1.0, 2.0, 4.0, 5.0)  # then 5 s between attempts
REMIND_S = 10.0  # a warning this often while the storage stays unreachable
# Errors that no wait mends: wrong credentials, a database or table that is not there.
_PERMANENT = (
    "authentication failed",
    "access denied",
    "does not exist",
    "unknown database",
    "permission denied",
    "no pg_hba.conf entry",
)
logger = logging.getLogger("nas.storage.opening")


class StorageError(RuntimeError):
    """A storage that cannot be used (unreachable, refused, misnamed), named, its password
    masked; one line."""


class StorageUnavailableError(StorageError):
    """A storage that stayed unreachable for longer than `study.storage_wait_s`."""


def root_cause(error: BaseException) -> str:
    """One line saying what failed below `error`: the database driver's error when the
    chain holds one (not SQLAlchemy's or Optuna's wrapping of it), a gRPC error's
    details, else the deepest error of the chain."""
    chain: list[BaseException] = []
    seen: BaseException | None = error
    while seen is not None and len(chain) < 20:
        chain.append(seen)
        seen = seen.__cause__ or (None if seen.__suppress_context__ else seen.__context__)
    driver = [e.orig for e in chain if isinstance(e, sqlalchemy.exc.DBAPIError) and e.orig]
    root = driver[0] if driver else next((e for e in reversed(chain) if str(e)), chain[-1])
    details = getattr(root, "details", None)  # a gRPC error's message
    text = str(details() if callable(details) else root).strip()
    return f"{type(root).__name__}: {text.splitlines()[0]}" if text else type(root).__name__


def transient(error: BaseException) -> bool:
    """Whether `error` says the storage is unreachable for now (module docstring, 1.)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, sqlalchemy.exc.DBAPIError) and seen.connection_invalidated:
            return True
        if isinstance(seen, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
            return not any(p in str(seen).lower() for p in _PERMANENT)
        code = getattr(seen, "code", None)  # grpc.RpcError, without importing grpc
        if callable(code) and getattr(code(), "name", "") == "UNAVAILABLE":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class _Outage:
    """One call's wait: since when, the next pause, when to give up."""

    def __init__(self, wait_s: float) -> None:
        self.began = time.monotonic()
        self.deadline = self.began + wait_s
        self.attempt = 0

    def pause(self) -> float | None:
        """Seconds to sleep before the next attempt; None: the wait is over."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            return None
        delay = BACKOFF_S[min(self.attempt, len(BACKOFF_S) - 1)]
        self.attempt += 1
        return min(delay, left)


class RetryingStorage(BaseStorage, BaseHeartbeat):
    """`inner`, every call retried while the storage is unreachable (module docstring).

    `name`: how errors and logs name the storage (its URL, password masked). Heartbeats
    are those of `inner`; an inner storage without them (the gRPC proxy) has none here
    either (`get_heartbeat_interval` is None).
    """

    def __init__(self, inner: BaseStorage, name: str, wait_s: float) -> None:
        self.inner, self.name, self.wait_s = inner, name, wait_s
        self.on_wait: Callable[[str | None], None] | None = None  # the listener (2.)
        self._lock = threading.Lock()
        self._down_since: float | None = None  # shared by the threads that wait
        self._reminded = 0.0
        self._gave_up = False

    # -- the one retry loop ----------------------------------------------------------------
    def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        work = getattr(self.inner, method)
        outage: _Outage | None = None
        while True:
            try:
                result = work(*args, **kwargs)
            except Exception as error:
                if outage is not None and _finished_already(self.inner, method, args, error):
                    result = True  # the first attempt committed; its reply was lost
                elif not transient(error):
                    raise
                else:
                    if outage is None:
                        outage = _Outage(0.0 if self._gave_up else self.wait_s)
                    pause = outage.pause()
                    if pause is None:
                        raise self._give_up(method, error) from error
                    self._waiting(method, error)
                    time.sleep(pause)
                    continue
            self._answered()
            return result

    def _waiting(self, method: str, error: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            first = self._down_since is None
            if first:
                self._down_since = self._reminded = now
            elif now - self._reminded < REMIND_S:
                return
            self._reminded = now
            down = now - (self._down_since or now)
        if first:
            message = (
                f"storage {self.name} unreachable ({method}: {root_cause(error)}); "
                f"retrying with backoff for up to {self.wait_s:g} s (study.storage_wait_s)"
            )
        else:
            message = (
                f"storage {self.name} still unreachable after {down:.0f} s; "
                f"giving up after {self.wait_s:g} s"
            )
        logger.warning(message)
        self._tell_listener(message)

    def _answered(self) -> None:
        if self._down_since is None and not self._gave_up:
            return
        with self._lock:
            began, self._down_since, self._gave_up = self._down_since, None, False
        if began is not None:
            logger.warning(
                "storage %s reachable again after %.1f s", self.name, time.monotonic() - began
            )
            self._tell_listener(None)

    def _give_up(self, method: str, error: BaseException) -> StorageUnavailableError:
        with self._lock:
            self._gave_up = True
        return StorageUnavailableError(
            f"storage {self.name} unreachable for {self.wait_s:g} s (study.storage_wait_s); "
            f"{method} failed: {root_cause(error)}"
        )

    def _tell_listener(self, message: str | None) -> None:
        listener = self.on_wait
        if listener is not None:
            try:
                listener(message)
            except Exception:  # a progress bar must not stop a storage call
                logger.debug("the storage wait listener raised", exc_info=True)

    def __getattr__(self, name: str) -> Any:  # the inner storage's own extras (close, ...)
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- BaseStorage -------------------------------------------------------------------------
    def create_new_study(
        self, directions: Sequence[StudyDirection], study_name: str | None = None
    ) -> int:
        return int(self._call("create_new_study", directions, study_name))

    def delete_study(self, study_id: int) -> None:
        self._call("delete_study", study_id)

    def set_study_user_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call("set_study_user_attr", study_id, key, value)

    def set_study_system_attr(self, study_id: int, key: str, value: Any) -> None:
        self._call("set_study_system_attr", study_id, key, value)

    def get_study_id_from_name(self, study_name: str) -> int:
        return int(self._call("get_study_id_from_name", study_name))

    def get_study_name_from_id(self, study_id: int) -> str:
        return str(self._call("get_study_name_from_id", study_id))

    def get_study_directions(self, study_id: int) -> list[StudyDirection]:
        return list(self._call("get_study_directions", study_id))

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        return dict(self._call("get_study_user_attrs", study_id))

    def get_study_system_attrs(self, study_id: int) -> dict[str, Any]:
        return dict(self._call("get_study_system_attrs", study_id))

    def get_all_studies(self) -> list[FrozenStudy]:
        return list(self._call("get_all_studies"))

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        return int(self._call("create_new_trial", study_id, template_trial))

    def set_trial_param(
        self,
        trial_id: int,
        param_name: str,
        param_value_internal: float,
        distribution: BaseDistribution,
    ) -> None:
        self._call("set_trial_param", trial_id, param_name, param_value_internal, distribution)

    def get_trial_id_from_study_id_trial_number(self, study_id: int, trial_number: int) -> int:
        return int(self._call("get_trial_id_from_study_id_trial_number", study_id, trial_number))

    def get_trial_number_from_id(self, trial_id: int) -> int:
        return int(self._call("get_trial_number_from_id", trial_id))

    def get_trial_param(self, trial_id: int, param_name: str) -> float:
        return float(self._call("get_trial_param", trial_id, param_name))

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        return bool(self._call("set_trial_state_values", trial_id, state, values))

    def set_trial_intermediate_value(
        self, trial_id: int, step: int, intermediate_value: float
    ) -> None:
        self._call("set_trial_intermediate_value", trial_id, step, intermediate_value)

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call("set_trial_user_attr", trial_id, key, value)

    def set_trial_system_attr(self, trial_id: int, key: str, value: Any) -> None:
        self._call("set_trial_system_attr", trial_id, key, value)

    def get_trial(self, trial_id: int) -> FrozenTrial:
        trial: FrozenTrial = self._call("get_trial", trial_id)
        return trial

    def get_all_trials(
        self,
        study_id: int,
        deepcopy: bool = True,
        states: Container[TrialState] | None = None,
    ) -> list[FrozenTrial]:
        return list(self._call("get_all_trials", study_id, deepcopy=deepcopy, states=states))

    def get_n_trials(
        self, study_id: int, state: tuple[TrialState, ...] | TrialState | None = None
    ) -> int:
        return int(self._call("get_n_trials", study_id, state))

    def get_best_trial(self, study_id: int) -> FrozenTrial:
        trial: FrozenTrial = self._call("get_best_trial", study_id)
        return trial

    def get_trial_params(self, trial_id: int) -> dict[str, Any]:
        return dict(self._call("get_trial_params", trial_id))

    def get_trial_user_attrs(self, trial_id: int) -> dict[str, Any]:
        return dict(self._call("get_trial_user_attrs", trial_id))

    def get_trial_system_attrs(self, trial_id: int) -> dict[str, Any]:
        return dict(self._call("get_trial_system_attrs", trial_id))

    def remove_session(self) -> None:
        self.inner.remove_session()

    def check_trial_is_updatable(self, trial_id: int, trial_state: TrialState) -> None:
        self.inner.check_trial_is_updatable(trial_id, trial_state)

    # -- BaseHeartbeat (when the inner storage has heartbeats) -------------------------------
    def record_heartbeat(self, trial_id: int) -> None:
        self._call("record_heartbeat", trial_id)

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        return list(self._call("_get_stale_trial_ids", study_id))

    def get_heartbeat_interval(self) -> int | None:
        if not isinstance(self.inner, BaseHeartbeat):
            return None
        return self.inner.get_heartbeat_interval()

    def get_heartbeat_stale_trial_callback(
        self,
    ) -> Callable[[optuna.Study, FrozenTrial], None] | None:
        if not isinstance(self.inner, BaseHeartbeat):
            return None
        return self.inner.get_heartbeat_stale_trial_callback()


def _finished_already(
    inner: BaseStorage, method: str, args: tuple[Any, ...], error: BaseException
) -> bool:
    """A retried `set_trial_state_values` refused because the trial is already in the
    state asked: the attempt before committed it (module docstring)."""
    if method != "set_trial_state_values" or not isinstance(
        error, optuna.exceptions.UpdateFinishedTrialError
    ):
        return False
    try:
        return bool(inner.get_trial(args[0]).state == args[1])
    except Exception:  # still unreachable, or gone: the refusal stands
        return False
