"""The process table, read from Linux's /proc: who is alive, who is whose child.

Why it exists: signal 0 cannot tell a process that has exited but waits for its parent to
reap it (a zombie) from a live one, and Python has no portable view of the process tree.
Stages watch their caller with it (`processes`), the study's storage judges a trial's owner
with it (`nas.storage.opening`), and the tests and the soak find the processes to kill or to
wait for with it. Off Linux (no /proc) every reading is "unknown": no state, no children.

A line of /proc/<pid>/stat is `pid (name) state ppid ...`, where the name may hold spaces
and parentheses: everything is read after the last ")".
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["children", "command_line", "descendants", "has_exited", "parents", "running", "state"]

_PROC = Path("/proc")


def _fields(pid: int | str) -> list[str]:
    """The fields of `pid`'s stat line after its name (state first), or [] when unreadable."""
    try:
        return (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):  # gone meanwhile, or no /proc (not Linux)
        return []


def state(pid: int) -> str | None:
    """`pid`'s state letter (R, S, D, Z, X, ...), or None when it is gone or unknown."""
    fields = _fields(pid)
    return fields[0] if fields else None


def has_exited(pid: int) -> bool:
    """Whether `pid` has exited and only waits to be reaped (Z or X). False when unknown:
    a process gone altogether is the caller's to tell (signal 0 raises)."""
    return state(pid) in ("Z", "X")


def running(pid: int) -> bool:
    """Whether `pid` is there and has not exited (False when unknown)."""
    return state(pid) not in (None, "Z", "X")


def parents() -> dict[int, int]:
    """Every readable process's parent: {pid: parent pid}."""
    found: dict[int, int] = {}
    if not _PROC.is_dir():
        return found
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and len(fields := _fields(entry.name)) > 1:
            found[int(entry.name)] = int(fields[1])
    return found


def children(pid: int) -> list[int]:
    """`pid`'s direct children."""
    return sorted(child for child, parent in parents().items() if parent == pid)


def descendants(pid: int) -> list[int]:
    """Every process below `pid`: its children, their children, and so on."""
    tree: dict[int, list[int]] = {}
    for child, parent in parents().items():
        tree.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        below = tree.get(todo.pop(), [])
        found += below
        todo += below
    return found


def command_line(pid: int) -> str:
    """`pid`'s command line, its arguments joined by spaces ("" when unreadable)."""
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()
