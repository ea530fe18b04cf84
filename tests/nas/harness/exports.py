"""Exported model folders, damaged as users' copies get damaged (`bad_inputs`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from nas.settings import NasSettings, TaskSettings
from nas.study import training
from nas.tasks import get_task
from search_spaces.evolved_transformer import evolved_transformer
from tests.nas.corpora import write_tsv
from tests.nas.export.common import export_built

__all__ = ["DAMAGES", "damaged_export", "export_of"]

DAMAGES = ("missing-tensor", "wrong-shape", "foreign-tokenizer", "broken-config")
WEIGHTS, TOKENIZER, CONFIG = "model.safetensors", "tokenizer.json", "config.json"


def export_of(root: Path, vocab_size: int) -> Path:
    """A model of a BPE corpus task with `vocab_size` pieces, freshly initialised, exported
    to `root` (made once)."""
    folder = root / f"export-{vocab_size}"
    if (folder / CONFIG).exists():
        return folder
    options = {
        "path": str(write_tsv(root / "pairs.tsv")),
        "tokenizer": "bpe",
        "vocab_size": vocab_size,
    }
    task = get_task("corpus", **options)
    arch = evolved_transformer(32, n_heads=4, n_enc=1, n_dec=1)
    _, parameters = training.compile_model(arch, task, dropout=0.1)
    settings = NasSettings(task=TaskSettings(name="corpus", options=options))
    export_built(folder, arch, task, settings, seed=5, metrics={"params": parameters})
    return folder


def damaged_export(root: Path, damage: str) -> Path:
    """A copy of an exported folder with `damage` (one of `DAMAGES`) done to it."""
    whole = export_of(root, 150)
    folder = root / f"damaged-{damage}"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(whole, folder)
    tensors = load_file(str(folder / WEIGHTS))
    first = sorted(tensors)[0]
    if damage == "missing-tensor":
        del tensors[first]
        save_file(tensors, str(folder / WEIGHTS))
    elif damage == "wrong-shape":
        tensors[first] = tensors[first].new_zeros(*(n + 1 for n in tensors[first].shape))
        save_file(tensors, str(folder / WEIGHTS))
    elif damage == "foreign-tokenizer":
        shutil.copy(export_of(root, 120) / TOKENIZER, folder / TOKENIZER)
    elif damage == "broken-config":
        (folder / CONFIG).write_text("{broken")
    else:
        raise ValueError(f"damage={damage!r} is not one of {DAMAGES}")
    return folder
