"""The character language model on the user's own UTF-8 text file.

A search is only useful on the data one cares about, so the harness accepts any text file:
the same task as `charlm.py`, with the whole file cut by characters into its first 90%
(train), the next 5% (validation) and the last 5% (test). The smallest split must hold one
window of `seq_len + 1` characters, so the file needs at least `20 * (seq_len + 2)`
characters (1,320 for the default seq_len=64); a shorter, empty, missing or non-UTF-8 file
is refused with a message naming the path.
"""

from __future__ import annotations

import os
from pathlib import Path

from nas.tasks.charlm import CharLanguageModel, split_text

__all__ = ["TextFile", "minimum_chars", "read_text"]


def minimum_chars(seq_len: int) -> int:
    """The shortest text whose 5% validation and test pieces hold a full window."""
    return 20 * (seq_len + 2)


def read_text(path: str | os.PathLike[str], seq_len: int = 64) -> str:
    """The file's text, or a clear error if it cannot serve the task."""
    path = Path(path).expanduser()
    need = minimum_chars(seq_len)
    if not path.exists():
        raise FileNotFoundError(f"text file {path} does not exist")
    if not path.is_file():
        raise IsADirectoryError(f"text file {path} is not a regular file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"text file {path} is not UTF-8 ({error.reason} at byte {error.start})"
        ) from error
    if not text:
        raise ValueError(
            f"text file {path} is empty; the textfile task needs at least {need:,} "
            f"characters (seq_len={seq_len})"
        )
    if len(text) < need:
        raise ValueError(
            f"text file {path} has {len(text):,} characters; the textfile task "
            f"needs at least {need:,} (seq_len={seq_len})"
        )
    return text


class TextFile(CharLanguageModel):
    """Next-character prediction on a text file; the same metrics as `CharLM`."""

    name = "textfile"

    def __init__(self, path: str | os.PathLike[str], *, seq_len: int = 64) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.path = Path(path).expanduser()
        train, validation, test = split_text(read_text(self.path, seq_len))
        super().__init__({"train": train, "validation": validation, "test": test}, seq_len=seq_len)
