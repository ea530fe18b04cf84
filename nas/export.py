"""A retrained model on disk, and back as a plain `torch.nn.Module`: what a search hands over.

`export_model` writes one folder per model (`outputs/models/<study>/<name>/`):

    architecture.json   what rebuilds the model: the search-space parameters (`params`), the
                        architecture they give (`architecture`, `search_spaces` JSON), the
                        task and its options, the vocabulary, the positions (`max_len`)
    model.safetensors   the weights, `<layer key>.<parameter name>` -> tensor
    metrics.json        what the model scored (validation and test, whole splits), its
                        parameter count, training steps and seed
    config.yaml         the resolved configuration of the run that trained it
    architecture.png    the encoder and decoder cells, drawn (`nas.pictures`)

`load_model(path)` rebuilds it in one process: no pipeline, no Optuna, no W&B. The layers
are the ones the pipeline trained (`search_spaces.compile`), run in order; a model with an
encoder (a source and a target, as for translation) also translates
(`TranslationModel.translate`, greedy, decoded exactly as the evaluation decodes).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nas.settings import NasSettings
from nas.tasks import Task, Vocab
from nas.tasks.translation import translate_ids
from pipeline.local.carry import as_carry, unwrap
from search_spaces.architecture import Architecture, from_json, to_json
from search_spaces.compile import compile as compile_arch

__all__ = [
    "FILES",
    "ExportedModel",
    "ModelFolderError",
    "TranslationModel",
    "export_model",
    "load_model",
]

FILES = ("architecture.json", "model.safetensors", "metrics.json", "config.yaml")
FORMAT = "elastic-nas-model/1"


class ModelFolderError(FileNotFoundError):
    """A folder that is not a complete exported model; the message names what is wrong."""


class ExportedModel(nn.Module):
    """The layers of an exported model in order: `forward(x)` is the pipeline's forward.

    `architecture`, `params`, `metrics` and `vocab` are what the folder says of it.
    """

    def __init__(
        self, layers: Mapping[str, nn.Module], info: Mapping[str, Any], metrics: Mapping[str, Any]
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleDict(dict(layers))  # in order: the keys are the layer keys
        self.architecture: Architecture = from_json(json.dumps(info["architecture"]))
        self.params: dict[str, Any] = dict(info.get("params", {}))
        self.vocab = Vocab.from_json(json.dumps(info["vocab"]))
        self.task: dict[str, Any] = dict(info["task"])
        self.metrics: dict[str, Any] = dict(metrics)

    def forward(self, x: Any) -> Any:
        carry = as_carry(x, "the model input")
        for key, layer in self.layers.items():
            carry = as_carry(layer(unwrap(carry)), key)
        return unwrap(carry)


class TranslationModel(ExportedModel):
    """An exported encoder-decoder: `translate(sources)` greedily, as the evaluation does."""

    def __init__(
        self, layers: Mapping[str, nn.Module], info: Mapping[str, Any], metrics: Mapping[str, Any]
    ) -> None:
        super().__init__(layers, info, metrics)
        options = self.task.get("options", {})
        self.max_chars = int(options.get("max_chars", int(info["max_len"]) - 2))
        self.fixed_length = bool(options.get("fixed_length", False))

    @torch.no_grad()
    def translate(self, sources: Sequence[str], *, batch_size: int = 128) -> list[str]:
        """Greedy translations of `sources` (characters the model never saw become UNK)."""
        if isinstance(sources, str):
            raise TypeError("translate() takes a list of sources, not one string")
        too_long = [s for s in sources if len(s) > self.max_chars]
        if too_long:
            raise ValueError(
                f"source {too_long[0]!r} has {len(too_long[0])} characters; "
                f"this model reads at most {self.max_chars}"
            )
        if not sources:
            return []
        encoded = [self.vocab.encode(s) for s in sources]
        return translate_ids(
            lambda src, tgt: self((src, tgt)),
            self.vocab,
            encoded,
            batch_size=batch_size,
            max_len=self.max_chars + 1,
            width=self.max_chars if self.fixed_length else None,
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
    """Write a model folder (module docstring) from the pipeline's `full_state_dict()`."""
    from safetensors.torch import save_file

    from nas.pictures import save_architecture

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    info = {
        "format": FORMAT,
        "task": dataclasses.asdict(settings.task),
        "params": dict(params),
        "architecture": json.loads(to_json(arch)),
        "vocab": json.loads(task.vocab.to_json()),
        "max_len": max_len,
    }
    _write_json(folder / "architecture.json", info)
    tensors = {
        f"{key}.{name}": value.detach().cpu().contiguous()
        for key, layer in state.items()
        for name, value in layer.items()
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": FORMAT})
    _write_json(folder / "metrics.json", dict(metrics))
    _write_config(folder / "config.yaml", settings)
    save_architecture(arch, folder / "architecture.png")
    return folder


def load_model(path: str | Path) -> ExportedModel:
    """The model exported to folder `path`, in eval mode (a `TranslationModel` when it has an
    encoder). Raises `ModelFolderError` naming the path and what is missing."""
    from safetensors.torch import load_file

    folder = Path(path)
    if not folder.is_dir():
        raise ModelFolderError(
            f"{folder} is not a folder; an exported model is a folder holding {', '.join(FILES)}"
        )
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise ModelFolderError(
            f"{folder} is not a complete exported model: missing {', '.join(missing)}"
        )
    info = _read_json(folder / "architecture.json")
    if info.get("format") != FORMAT:
        raise ModelFolderError(
            f"{folder / 'architecture.json'} has format {info.get('format')!r}; valid: {FORMAT!r}"
        )
    arch = from_json(json.dumps(info["architecture"]))
    vocab = Vocab.from_json(json.dumps(info["vocab"]))
    specs = compile_arch(arch, len(vocab), max_len=int(info["max_len"]), dropout=0.0)
    tensors = load_file(str(folder / "model.safetensors"))
    layers: dict[str, nn.Module] = {}
    for spec in specs:
        layer = spec.factory()
        prefix = f"{spec.key}."
        layer_state = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
        try:
            layer.load_state_dict(layer_state)
        except RuntimeError as error:
            raise ModelFolderError(
                f"{folder / 'model.safetensors'} does not fit the "
                f"architecture in architecture.json at layer {spec.key!r}: "
                f"{error}"
            ) from error
        layers[spec.key] = layer
    cls = ExportedModel if arch.decoder_only else TranslationModel  # a source: translate()
    return cls(layers, info, _read_json(folder / "metrics.json")).eval()


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=_plain) + "\n")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelFolderError(f"cannot read {path}: {error}") from error
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path} does not hold a JSON object")
    return data


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(f"cannot write {value!r} as JSON")


def _write_config(path: Path, settings: NasSettings) -> None:
    import yaml

    plain = json.loads(json.dumps(dataclasses.asdict(settings), default=_plain))
    path.write_text(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True))
