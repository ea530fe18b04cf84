"""What a `study.storage` URL names, checked before anything connects, and how it is shown.

Four kinds of storage, told apart by the URL's scheme:

    sqlite:///path/study.db          an SQLite file (the default; one machine)
    journal:///path/study.log        an Optuna journal file (a shared file system)
    grpc://host:port                 Optuna's gRPC storage proxy (`nas.storage.server serve`)
    postgresql://user:pw@host/db     any other SQLAlchemy URL: a database server

A URL may hold a password; whatever the harness prints or logs about a storage (errors,
waits, the dashboard command) shows it masked (`masked`) or left out (`without_password`).
This module imports nothing heavy: the settings check URLs with it.
"""

from __future__ import annotations

import enum
import re
from urllib.parse import urlsplit

__all__ = [
    "GRPC",
    "JOURNAL",
    "StorageKind",
    "grpc_address",
    "kind",
    "masked",
    "without_password",
]

JOURNAL = "journal://"
GRPC = "grpc://"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9]*(\+[A-Za-z0-9_]+)?://")
_VALID = (
    "valid: sqlite:///path.db, postgresql://user:password@host:port/database (any "
    "SQLAlchemy URL), grpc://host:port, journal:///path/to/file.log"
)


class StorageKind(enum.Enum):
    SQLITE = "sqlite"
    JOURNAL = "journal"
    GRPC = "grpc"
    SERVER = "server"  # a database server reached by SQLAlchemy (PostgreSQL, MySQL, ...)


def kind(url: str) -> StorageKind:
    """The kind of storage `url` names; ValueError naming the URL (masked) when it names
    none."""
    if not isinstance(url, str) or not _SCHEME.match(url):
        raise ValueError(f"study.storage={masked(url)!r} is not a storage URL; {_VALID}")
    if url.startswith(JOURNAL):
        if not url[len(JOURNAL) :]:
            raise ValueError(f"study.storage={url!r} names no file; e.g. journal:///tmp/s.log")
        return StorageKind.JOURNAL
    if url.startswith(GRPC):
        grpc_address(url)
        return StorageKind.GRPC
    if url.startswith("sqlite"):
        return StorageKind.SQLITE
    return StorageKind.SERVER


def grpc_address(url: str) -> tuple[str, int]:
    """(host, port) of a `grpc://host:port` URL; ValueError naming it when either is
    missing."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "grpc" or not parts.hostname or port is None or parts.path.strip("/"):
        raise ValueError(f"study.storage={masked(url)!r} is not valid; use grpc://host:port")
    return parts.hostname, port


def masked(url: object) -> str:
    """`url` with its password shown as `***` (what errors and logs show)."""
    return _replace_password(url, "***")


def without_password(url: str) -> str:
    """`url` without its password: what a command shown to the user takes (a PostgreSQL
    client then reads the password from `PGPASSWORD` or `~/.pgpass`)."""
    return _replace_password(url, None)


# scheme://user:password@rest; the password runs to the last "@" (so one that holds an
# unescaped "@" or "/" is hidden whole: on doubt, more is hidden, never less)
_LOGIN = re.compile(r"^(?P<head>[^/@]*//)(?P<user>[^:@/]*):(?P<password>.*)@(?P<rest>[^@]*)$", re.S)


def _replace_password(url: object, replacement: str | None) -> str:
    text = str(url)
    found = _LOGIN.match(text)
    if found is None:
        return text
    login = found["user"] if replacement is None else f"{found['user']}:{replacement}"
    return f"{found['head']}{login}@{found['rest']}"
