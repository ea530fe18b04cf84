"""What the main job prints at its end: a trials table that fits 80 columns with every
architecture readable, and commands that work in what the README's first command installs."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import optuna
from rich.console import Console

from nas.report import report_study
from tests.nas.harness.common import tiny_settings

NAMES = [
    "d32 e1 d1 2attn 1xattn 2ffn",
    "d32 e2 d2 6ffn 4attn 2xattn 2glu 1sepconv 1lconv 1conv",
    "d48 e1 d2 3ffn 3attn 2xattn",
]


def test_the_trials_fit_80_columns_with_every_architecture_whole(tmp_path: Path) -> None:
    settings = tiny_settings(tmp_path, "study.name=shown")
    Path(settings.studies_dir).mkdir(parents=True)
    Path(settings.output_dir).mkdir(parents=True)
    study = optuna.create_study(study_name="shown", storage=settings.storage_url)
    for i, name in enumerate(NAMES):
        trial = study.ask()
        for key, value in {
            "short_name": name,
            "parameters": 73_125 + 9_001 * i,
            "samples_per_s": 812.345 + i,
            "peak_memory_bytes": 1_234_567 * 10**i,  # 1.2, 12 and 118 MB
            "n_stages": 1 + i % 2,
            "validation_accuracy": 0.41234 + i / 10,
            "validation_chrf": 21.2345 + i,
            "validation_bleu": 3.14159 + i,
            "validation_exact_match": 0.001234 * i,
            "partition": [7],
            "steps": 20,
        }.items():
            trial.set_user_attr(key, value)
        study.tell(trial, 0.712345 + i / 100)
    console = Console(width=80, record=True)
    report_study(settings, None, console=console)
    table = console.export_text().split("best architecture")[0]  # commands stay unwrapped
    assert max(len(line) for line in table.splitlines()) <= 80, table
    flat = re.sub(r"\s+", " ", table)  # a listed name may wrap at the edge, never be cut
    assert all(name in flat for name in NAMES), table
    assert " stg " in table and " 1.2 " in table and " 118 " in table


def test_the_printed_dashboard_command_comes_with_the_nas_extra() -> None:
    wanted = [r for r in importlib.metadata.requires("elastic-nas") or [] if "nas" in r]
    assert any(r.startswith("optuna-dashboard") and 'extra == "nas"' in r for r in wanted)
