"""A local server for other processes of this machine: authenticated connections, served in
threads, and a close that never waits on a handshake.

The stage pool's service (`pipeline.distributed.pool_service`) and the harness's leader
service (`nas.study.remote`) both take connections from processes they did not start, one
request stream per connection. `multiprocessing.connection.Listener` gives the socket and
the authentication; what it lacks is a way to stop a thread blocked in `accept()`:

1. The accepting thread loops on `accept()`, and hands each connection to `handle`: in a
   thread of its own (`concurrent=True`) or in the accepting thread itself, one at a time.
2. `close()` sets the flag, then knocks: a bare socket connects and hangs up at once, so an
   `accept()` in progress fails its handshake (caught) and the thread sees the flag and
   ends. A knock never waits for an answer: a thread that is not in `accept()` (serving a
   connection, or already gone) leaves it in the backlog, unread, and nothing blocks.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.connection
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["LocalServer"]

logger = logging.getLogger(__name__)
_FAMILY = "AF_UNIX" if hasattr(socket, "AF_UNIX") else "AF_INET"


class LocalServer:
    """Serve `handle(connection)` to authenticated processes of this machine until `close`."""

    def __init__(
        self, handle: Callable[[Any], None], *, name: str, concurrent: bool = False
    ) -> None:
        self._handle, self._name, self._concurrent = handle, name, concurrent
        self.authkey = os.urandom(32)
        self._listener = multiprocessing.connection.Listener(family=_FAMILY, authkey=self.authkey)
        self._address = self._listener.address
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True, name=name)
        self._thread.start()

    @property
    def address(self) -> Any:
        """Where clients connect: a socket path, or a (host, port) pair (kept after `close`:
        a client that comes late is refused there)."""
        return self._address

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def close(self) -> None:
        """Stop accepting (2.); connections being served end when their clients leave."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            family = socket.AF_UNIX if _FAMILY == "AF_UNIX" else socket.AF_INET
            with socket.socket(family) as knock:
                knock.settimeout(1.0)
                knock.connect(self.address)
        self._thread.join(timeout=5.0)
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                connection = self._listener.accept()  # 1.
            except (OSError, EOFError, multiprocessing.AuthenticationError) as error:
                if not self._closed.is_set():
                    logger.warning("%s: a connection refused: %s", self._name, error)
                continue
            if self._closed.is_set():
                connection.close()
                return
            if self._concurrent:
                threading.Thread(
                    target=self._served, args=(connection,), daemon=True, name=self._name
                ).start()
            else:
                self._served(connection)

    def _served(self, connection: Any) -> None:
        with connection:
            try:
                self._handle(connection)
            except Exception:  # a bug in one connection's handling stops no other
                logger.exception("%s: a connection failed", self._name)
