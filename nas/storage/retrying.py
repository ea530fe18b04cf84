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

import abc
import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage

# Optuna sees a storage's heartbeats only on a subclass of this private class (its
# `is_heartbeat_enabled`), so the wrapper must be one: the one private name used here.
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.trial import FrozenTrial, TrialState

_Storage = TypeVar("_Storage", bound=BaseStorage)

__all__ = [
    "BACKOFF_S",
    "REMIND_S",
    "RETRIED",
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


def _retried(name: str) -> Callable[..., Any]:
    """`RetryingStorage`'s method `name`: the inner storage's, through `_call`; its name,
    documentation and signature (`inspect.signature`) are Optuna's."""
    declared = getattr(BaseStorage, name, None) or getattr(BaseHeartbeat, name)

    def method(self: RetryingStorage, *args: Any, **kwargs: Any) -> Any:
        return self._call(name, *args, **kwargs)

    functools.update_wrapper(method, declared, updated=())  # not `__isabstractmethod__`
    method.__module__, method.__qualname__ = __name__, f"RetryingStorage.{name}"
    return method


def _retrying(cls: type[_Storage]) -> type[_Storage]:
    """`cls` with a retried method (`_retried`) for each method of Optuna's storage
    interface that reaches the database and that `cls` does not define: the public ones of
    `BaseStorage`, and the heartbeat's two (`RETRIED` lists them)."""
    public = (n for n, f in vars(BaseStorage).items() if inspect.isfunction(f) and n[0] != "_")
    for name in (*public, "record_heartbeat", "_get_stale_trial_ids"):
        if name not in vars(cls):
            setattr(cls, name, _retried(name))
    return abc.update_abstractmethods(cls)


@_retrying
class RetryingStorage(BaseStorage, BaseHeartbeat):
    """`inner`, every call retried while the storage is unreachable (module docstring).

    `name`: how errors and logs name the storage (its URL, password masked). Heartbeats
    are those of `inner`; an inner storage without them (the gRPC proxy) has none here
    either (`get_heartbeat_interval` is None). The methods of Optuna's storage interface
    that reach the database (`RETRIED`) are made by `_retrying`, each a call of `_call`;
    those defined here are not retried.
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
                if outage is not None and _finished_already(
                    self.inner, method, args, kwargs, error
                ):
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

    # -- what is not retried: the inner storage's own answer, at once -----------------------
    def remove_session(self) -> None:
        self.inner.remove_session()

    def check_trial_is_updatable(self, trial_id: int, trial_state: TrialState) -> None:
        self.inner.check_trial_is_updatable(trial_id, trial_state)

    # -- BaseHeartbeat (when the inner storage has heartbeats) -------------------------------
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


RETRIED = tuple(sorted(n for n, f in vars(RetryingStorage).items() if hasattr(f, "__wrapped__")))
"""The storage calls `RetryingStorage` retries (those `_retrying` made)."""


def _finished_already(
    inner: BaseStorage,
    method: str,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    error: BaseException,
) -> bool:
    """A retried `set_trial_state_values` refused because the trial is already in the
    state asked: the attempt before committed it (module docstring)."""
    if method != "set_trial_state_values" or not isinstance(
        error, optuna.exceptions.UpdateFinishedTrialError
    ):
        return False
    asked = _SET_STATE.bind(inner, *args, **kwargs).arguments  # passed by name or not
    try:
        return bool(inner.get_trial(asked["trial_id"]).state == asked["state"])
    except Exception:  # still unreachable, or gone: the refusal stands
        return False


_SET_STATE = inspect.signature(BaseStorage.set_trial_state_values)
