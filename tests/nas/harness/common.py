"""Helpers shared by the harness tests: composed settings, `python -m nas` in a subprocess, a
text file, a locked SQLite file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from nas.config import CONFIG_DIR, register, to_settings
from nas.settings import NasSettings
from pipeline.pure.shape import RuntimeOverheads

# A study that trains in seconds: one worker of 2 stages (the shape set by hand, not chosen
# from a profile), d_model 32, one cell per side, few steps, 8 pairs decoded in the final
# evaluation only.
TINY = (
    "tracker=jsonl",
    "pipeline=cpu_2_stages",
    "study.workers=1",
    "train.steps=6",
    "train.eval_every=3",
    "train.eval_batches=1",
    "train.batch_size=16",
    "train.decode_pairs=0",
    "train.final_decode_pairs=8",
    "search_space.d_model=[32]",
    "search_space.max_cells=1",
)

# Greedy decoding (a pipeline forward per generated character: as many as the longest
# name for an untrained model) is what a tiny study's evaluations spend most on; tests
# that are not about it decode a few pairs in the final evaluations only.
LITTLE_DECODING = ("train.decode_pairs=0", "train.final_decode_pairs=8", "retrain.decode_pairs=8")


def composed(*overrides: str) -> NasSettings:
    """`conf/config.yaml` composed with `overrides`, as typed settings."""
    register()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        return to_settings(compose("config", overrides=list(overrides)))


def tiny_settings(tmp_path: Path, *overrides: str) -> NasSettings:
    """The composed settings of a tiny study under `tmp_path` (overrides win)."""
    return composed(
        *TINY, f"studies_dir={tmp_path / 'studies'}", f"output_dir={tmp_path / 'run'}", *overrides
    )


# What every command-line study in the tests shares: one evaluation batch, small batches,
# the narrowest model, few decoded pairs.
SMALL = (
    "train.eval_batches=1",
    "train.batch_size=16",
    "search_space.d_model=[32]",
    "search_space.max_cells=1",
    *LITTLE_DECODING,
)


def run(
    tmp_path: Path, *overrides: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m nas` with `overrides`, its run folder and studies under `tmp_path`."""
    cmd = [
        sys.executable,
        "-m",
        "nas",
        *overrides,
        f"hydra.run.dir={tmp_path / 'run'}",
        f"studies_dir={tmp_path / 'studies'}",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)


GIVEN_OVERHEADS = RuntimeOverheads(microbatch_s=4e-4, message_s=8e-4, step_s=1e-3)


def small_space(*overrides: str) -> NasSettings:
    """Settings whose seeds are small enough to profile in-process in seconds (the shape's
    tests: `nas.study.shape`, `nas.study.shape_trials`)."""
    return composed(
        "search_space.d_model=[32]", "search_space.max_cells=1", "train.batch_size=16", *overrides
    )


def machine_cache(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Path:
    """This machine's cost cache under `folder`, holding given runtime overheads (their
    measurement starts processes: the CLI test measures them); its path."""
    from nas.study import shape

    monkeypatch.setenv("XDG_CACHE_HOME", str(folder))
    cache = shape.load_cache()
    cache.set_overheads(GIVEN_OVERHEADS)
    shape.save_cache(cache)
    return shape.cache_path()


def offline_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """W&B offline, its home folders under `tmp_path` (nothing read or left in ~)."""
    for name in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")


def write_text(path: Path, chars: int = 4000) -> Path:
    """A UTF-8 file of `chars` characters of real English text (Python's help topics)."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    assert len(text) >= chars
    path.write_text(text[:chars], encoding="utf-8")
    return path


class locked:
    """Hold SQLite's write lock on `path` from another process (a real lock, as another
    worker or a backup tool holds it) until the block ends or `release_after_s`."""

    def __init__(self, path: Path, release_after_s: float | None = None) -> None:
        hold = (
            "import sys, time\nwhile sys.stdin.readline().strip() != 'release': pass\n"
            if release_after_s is None
            else f"import time\ntime.sleep({release_after_s})\n"
        )
        self.code = (
            "import sqlite3, sys\n"
            f"db = sqlite3.connect({str(path)!r}, isolation_level=None)\n"
            "db.execute('BEGIN EXCLUSIVE')\nprint('locked', flush=True)\n"
            + hold
            + "db.execute('COMMIT')\n"
        )

    def __enter__(self) -> locked:
        self.process = subprocess.Popen(
            [sys.executable, "-c", self.code],
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert self.process.stdout is not None and self.process.stdout.readline() == "locked\n"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write("release\n")
            self.process.stdin.flush()
        except BrokenPipeError:  # it released on its own already
            pass
        self.process.wait(timeout=30)
