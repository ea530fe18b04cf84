"""What the export tests share: a model exported from built layers (`export_built`), a folder
copied, and a Python that has the core install alone.

`core_venv` makes a virtual environment that sees this one's packages except the harness's
(`NOT_CORE`: Optuna, Hydra, W&B, matplotlib, ...) and this checkout; `run_in` runs code in a
Python and reads back the JSON it prints last. Together they show that an exported model
loads with the core install alone.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import torch

from nas.export.writing import export_model
from nas.settings import NasSettings
from nas.study import training
from nas.tasks import Task
from pipeline.local.spec import build_layer
from search_spaces.architecture import Architecture
from search_spaces.evolved_transformer import seed_params

__all__ = ["NOT_CORE", "ROOT", "copy_folder", "core_venv", "run_in"]

ROOT = Path(__file__).resolve().parents[3]

# What the core install (torch, numpy, safetensors, huggingface_hub) lacks, and the
# checkout's own editable-install hooks (the checkout is put on the path instead).
NOT_CORE = (
    "optuna*",
    "hydra*",
    "omegaconf*",
    "wandb*",
    "matplotlib*",
    "sacrebleu*",
    "rich*",
    "scipy*",
    "pycountry*",
    "sqlalchemy*",
    "alembic*",
    "yaml*",
    "_yaml*",
    "pyyaml*",
    "__editable__*",
    "*elastic_nas*",
)


def copy_folder(source: Path, target: Path) -> Path:
    """A copy of the files of folder `source` (not its subfolders) in a new folder `target`."""
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def core_venv(tmp_path: Path) -> Path:
    """The python of a new virtual environment that sees this one's packages but those of
    `NOT_CORE`, and the checkout."""
    venv = tmp_path / "core-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    links = tmp_path / "core-packages"
    links.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not any(fnmatch.fnmatch(entry.name.lower(), p) for p in NOT_CORE):
            (links / entry.name).symlink_to(entry)
    [site] = venv.glob("lib/python*/site-packages")
    (site / "core.pth").write_text(f"{links}\n{ROOT}\n")
    return venv / "bin" / "python"


def run_in(python: Path | str, code: str, args: list[str], cwd: Path) -> dict:
    """`code` run by `python` with `args` (this environment's PYTHONPATH left out): the JSON
    of the last line it prints."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(python), "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def export_built(
    folder: Path,
    arch: Architecture,
    task: Task,
    settings: NasSettings,
    *,
    seed: int,
    metrics: dict[str, Any],
) -> dict[str, torch.nn.Module]:
    """Export `arch`'s layers for `task`, built with `seed`, into `folder`; the layers."""
    specs, _ = training.compile_model(arch, task, dropout=0.1)
    layers = {spec.key: build_layer(spec, seed, torch.device("cpu")) for spec in specs}
    export_model(
        folder,
        state={key: layer.state_dict() for key, layer in layers.items()},
        arch=arch,
        params=seed_params(arch),
        task=task,
        settings=settings,
        metrics=metrics,
        max_len=training.max_len(task),
    )
    return layers
