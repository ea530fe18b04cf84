"""A retrained model on disk: what a search hands over, as a Hugging Face-style folder.

`export_model` writes one folder per model (`outputs/models/<study>/<name>/`):

    config.json         what rebuilds the model: format, architecture, search-space
                        parameters, vocabulary, task, positions, training budget
    tokenizer.json      a subword task's tokenizer (BPE or unigram pieces), which
                        `translate` reads text with (the target's, and
                        source_tokenizer.json the source's, where each side has its own)
    model.safetensors   the weights, named as the model's `state_dict()` names them
    README.md           the model card: picture, size, training budget, validation and test
                        figures of every training seed, how to load it (`nas.export.card`)
    metrics.json        what the model scored (validation and test, whole splits), its
                        parameter count, training steps and seed, every seed's figures
    config.yaml         the resolved configuration of the run that trained it
    architecture.png    the encoder and decoder cells, drawn (`nas.export.pictures`)

It loads with the core install alone (`nas.export.pretrained`, where the model classes live):
`TranslationModel.from_pretrained(folder)` or `nas.load_model(folder)`. The names this
module held before (`load_model`, `ExportedModel`, `TranslationModel`, `ModelFolderError`)
are re-exported here.

A folder written before this layout (`architecture.json`, format "elastic-nas-model/1")
still loads; `python -m nas.export convert <folder> ...` rewrites it in this one.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from nas.export.folder import SOURCE_TOKENIZER, load_weights
from nas.export.pretrained import (
    CONFIG,
    FORMAT,
    LEGACY_FORMAT,
    WEIGHTS,
    ExportedModel,
    ModelConfig,
    ModelFolderError,
    TranslationModel,
    load_model,
    vocab_config,
)
from search_spaces.architecture import Architecture, to_json

if TYPE_CHECKING:
    from nas.settings import NasSettings
    from nas.tasks import Task

__all__ = [
    "FILES",
    "FORMAT",
    "LEGACY_FORMAT",
    "ExportedModel",
    "ModelFolderError",
    "TranslationModel",
    "convert",
    "export_model",
    "load_model",
    "main",
    "write_model_card",
]

FILES = (
    CONFIG,
    WEIGHTS,
    "tokenizer.json",  # subword vocabularies only
    "README.md",
    "metrics.json",
    "config.yaml",
    "architecture.png",
)


def export_model(
    directory: str | Path,
    *,
    state: Mapping[str, Mapping[str, torch.Tensor]],
    arch: Architecture,
    params: Mapping[str, Any],
    task: Task,
    settings: NasSettings,
    metrics: Mapping[str, Any],
    max_len: int,
) -> Path:
    """Write a model folder (module docstring) from the pipeline's `full_state_dict()`
    (layer key -> parameter name -> tensor); a state that does not fit `arch` exactly is a
    `ModelFolderError` naming the tensor."""
    from nas.export.pictures import save_architecture

    vocab, tokenizers = vocab_config(task.vocab)
    source_vocab = None
    if task.source_vocab is not task.vocab:
        source_vocab, more = vocab_config(task.source_vocab, SOURCE_TOKENIZER)
        tokenizers |= more
    config = ModelConfig(
        architecture=json.loads(to_json(arch)),
        params=dict(params),
        vocab=vocab,
        task=dataclasses.asdict(settings.task),
        max_len=max_len,
        training=_training(settings, metrics),
        source_vocab=source_vocab,
        tokenizers=tokenizers,
    )
    model = ExportedModel.class_for(config)(config, metrics)
    tensors = {
        f"layers.{key}.{name}": value
        for key, layer in state.items()
        for name, value in layer.items()
    }
    load_weights(
        model, tensors, source="the pipeline's state", architecture="the exported architecture"
    )
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    _write_config(folder / "config.yaml", settings)
    if not _drawn(folder, config):  # a later, better seed of the model: the same picture
        save_architecture(arch, folder / "architecture.png")
    return model.eval().save_pretrained(folder)  # the card sees the picture


def convert(folder: str | Path) -> bool:
    """Rewrite a folder of the old layout (`architecture.json`) in this one; False when it
    has this layout already. Raises `ModelFolderError` for a folder that does not load."""
    model = load_model(folder)
    if (Path(folder) / CONFIG).is_file():
        return False
    model.save_pretrained(folder)
    return True


def write_model_card(folder: str | Path) -> Path:
    """Write the folder's README.md again from its config.json and metrics.json (after
    metrics.json changed, e.g. a later training seed's figures were added)."""
    model = load_model(folder)
    path = Path(folder) / "README.md"
    path.write_text(model.model_card(folder))
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m nas.export convert FOLDER...`: rewrite old-layout folders (module doc)."""
    parser = argparse.ArgumentParser(prog="python -m nas.export", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    converting = commands.add_parser("convert", help="rewrite old-layout folders in place")
    converting.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args(argv)
    failed = 0
    for folder in args.folders:
        try:
            done = convert(folder)
        except ModelFolderError as error:
            print(f"{folder}: {error}", file=sys.stderr)
            failed += 1
            continue
        print(f"{folder}: {'converted' if done else f'already in the {FORMAT} layout'}")
    return 1 if failed else 0


def _training(settings: NasSettings, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The training budget of the exported weights, as the model card shows it."""
    train = settings.train
    steps = metrics.get("steps") or settings.retrain.steps or train.steps
    return {
        "steps": int(steps),
        "batch_size": train.batch_size,
        "lr": train.lr,
        "lr_schedule": train.lr_schedule,
        "warmup_steps": train.warmup_steps,
        "dropout": train.dropout,
    }


def _drawn(folder: Path, config: ModelConfig) -> bool:
    """Whether `folder` holds the picture of `config`'s architecture already: an export of
    it whose config.json (written after the picture) names the same architecture."""
    if not (folder / "architecture.png").is_file() or not (folder / CONFIG).is_file():
        return False
    try:
        written = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(written, dict) and written.get("architecture") == config.architecture


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(f"cannot write {value!r} as JSON")


def _write_config(path: Path, settings: NasSettings) -> None:
    import yaml

    plain = json.loads(json.dumps(dataclasses.asdict(settings), default=_plain))
    path.write_text(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True))


if __name__ == "__main__":
    sys.exit(main())
