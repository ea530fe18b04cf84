"""What every test session shares: the project's bytecode, compiled once before any test.

The multiprocess tests start hundreds of Python processes (harnesses, workers, stage
processes), each importing the project. Where `PYTHONDONTWRITEBYTECODE` is set (as on some
CI machines) no import writes the `.pyc` files, so every one of those processes would compile
every module of the project again; `compileall` writes them regardless of that setting, and
the processes read them.
"""

from __future__ import annotations

import compileall
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parent.parent
_PACKAGES = ("pipeline", "search_spaces", "nas", "tests")


def pytest_configure(config: pytest.Config) -> None:
    for package in _PACKAGES:
        compileall.compile_dir(_ROOT / package, quiet=1, workers=1)
