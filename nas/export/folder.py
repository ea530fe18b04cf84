"""The files of an exported model's folder: `config.json`, strict weights, the old layout.

`nas.export.pretrained` builds the model classes on this: `ModelConfig` is `config.json` (read and
checked, each wrong field a `ModelFolderError` naming the file) with the text of
`tokenizer.json` (and `source_tokenizer.json`, for a model whose source has a vocabulary
of its own) beside it when its vocabulary is subword pieces, `read_folder` reads a
folder of this layout or of the old one (`architecture.json`, format
"elastic-nas-model/1", weights named `<layer key>.<parameter>`), `load_weights` loads a
state strictly (a missing, an extra or a misshapen tensor is named), and `resolve` turns a
name into a local folder (fetching a Hub repository id, and only that, with
`huggingface_hub`). Imports only torch, safetensors, `search_spaces` and `pipeline`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self, cast

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

from pipeline.pure.checks import is_int
from search_spaces.architecture import Architecture, from_json

__all__ = [
    "CARD",
    "CONFIG",
    "EXTRAS",
    "FORMAT",
    "LEGACY_CONFIG",
    "LEGACY_FORMAT",
    "METRICS",
    "SOURCE_TOKENIZER",
    "TOKENIZER",
    "WEIGHTS",
    "ModelConfig",
    "ModelFolder",
    "ModelFolderError",
    "load_weights",
    "read_folder",
    "read_json",
    "resolve",
    "write_json",
]

FORMAT = "elastic-nas-model/2"
LEGACY_FORMAT = "elastic-nas-model/1"
CONFIG, WEIGHTS, CARD, METRICS = "config.json", "model.safetensors", "README.md", "metrics.json"
LEGACY_CONFIG = "architecture.json"
TOKENIZER = "tokenizer.json"  # a subword vocabulary (`nas.text.subwords`), as `tokenizers` saves it
SOURCE_TOKENIZER = "source_tokenizer.json"  # the source's, where each side has its own
# the tokenizer file each vocabulary of config.json may name
_TOKENIZER_FILES = {"vocab": TOKENIZER, "source_vocab": SOURCE_TOKENIZER}
EXTRAS = ("config.yaml", "architecture.png")  # what the export adds; saving copies them
WHAT = f"an exported model is a folder holding {CONFIG} and {WEIGHTS}"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


class ModelFolderError(FileNotFoundError):
    """A folder that is not a complete exported model; the message names what is wrong."""


@dataclass(frozen=True)
class ModelConfig:
    """`config.json`: everything that rebuilds the model (`nas.export.pretrained` docstring)."""

    architecture: dict[str, Any]
    params: dict[str, Any]
    vocab: dict[str, Any]  # the target's (and the source's, unless `source_vocab`)
    task: dict[str, Any]
    max_len: int
    training: dict[str, Any] = field(default_factory=dict)
    format: str = FORMAT
    source_vocab: dict[str, Any] | None = None  # where the source has its own vocabulary
    # the text of each tokenizer file a vocabulary names ({"tokenizer": "tokenizer.json"}
    # for subword pieces), by file name; not part of config.json
    tokenizers: dict[str, str] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        source = {} if self.source_vocab is None else {"source_vocab": self.source_vocab}
        return {
            "format": self.format,
            "task": self.task,
            "max_len": self.max_len,
            "training": self.training,
            "params": self.params,
            "architecture": self.architecture,
            "vocab": self.vocab,
            **source,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: Path) -> Self:
        """The config in `data`, read from `where`; `ModelFolderError` names what is wrong."""
        if data.get("format") != FORMAT:
            raise ModelFolderError(f"{where} has format {data.get('format')!r}; valid: {FORMAT!r}")
        return cls._checked(data, where, training=data.get("training", {}))

    @classmethod
    def from_legacy(cls, data: Mapping[str, Any], where: Path, metrics: Mapping[str, Any]) -> Self:
        """The config of an `architecture.json` of format "elastic-nas-model/1"."""
        if data.get("format") != LEGACY_FORMAT:
            raise ModelFolderError(
                f"{where} has format {data.get('format')!r}; valid: {LEGACY_FORMAT!r}"
            )
        steps = metrics.get("steps")
        return cls._checked(data, where, training={"steps": steps} if steps else {})

    @classmethod
    def _checked(cls, data: Mapping[str, Any], where: Path, training: Any) -> Self:
        kinds = {"architecture": dict, "params": dict, "vocab": dict, "task": dict}
        wrong = [k for k, kind in kinds.items() if not isinstance(data.get(k), kind)]
        if wrong:
            raise ModelFolderError(f"{where} lacks the object(s) {', '.join(wrong)}")
        max_len = data.get("max_len")
        if not is_int(max_len) or max_len < 1:
            raise ModelFolderError(f"{where} has max_len {max_len!r}; valid: an integer >= 1")
        if not isinstance(training, dict):
            raise ModelFolderError(f"{where} has training {training!r}; valid: an object")
        source = data.get("source_vocab")
        if source is not None and not isinstance(source, dict):
            raise ModelFolderError(f"{where} has source_vocab {source!r:.60}; valid: an object")
        return cls(
            source_vocab=None if source is None else dict(source),
            architecture=dict(data["architecture"]),
            params=dict(data["params"]),
            vocab=dict(data["vocab"]),
            task=dict(data["task"]),
            max_len=max_len,
            training=dict(training),
        )

    def build_architecture(self, where: str = "the config") -> Architecture:
        """The architecture the config holds; `ModelFolderError` naming `where` if invalid."""
        try:
            return from_json(json.dumps(self.architecture))
        except (KeyError, TypeError, ValueError) as error:
            raise ModelFolderError(f"the architecture in {where} is not valid: {error}") from error


@dataclass(frozen=True)
class ModelFolder:
    """What `read_folder` found: the config, the metrics ({} without metrics.json), and
    whether the folder has the old layout."""

    path: Path
    config: ModelConfig
    metrics: dict[str, Any]
    legacy: bool

    @property
    def config_file(self) -> Path:
        return self.path / (LEGACY_CONFIG if self.legacy else CONFIG)

    def load_into(self, model: nn.Module) -> None:
        """Load the folder's weights into `model` strictly (`load_weights`)."""
        weights = self.path / WEIGHTS
        try:
            tensors = load_file(str(weights))
        except (OSError, SafetensorError) as error:
            raise ModelFolderError(f"cannot read {weights}: {error}") from error
        load_weights(
            model,
            tensors,
            source=str(weights),
            architecture=f"the architecture in {self.config_file}",
            name=_legacy_name if self.legacy else None,
        )


def load_weights(
    model: nn.Module,
    tensors: Mapping[str, torch.Tensor],
    *,
    source: str,
    architecture: str,
    name: Callable[[str], str] | None = None,
) -> None:
    """Load `tensors` into `model` strictly: every tensor of its state dict, none other,
    each of its shape, else `ModelFolderError` naming the tensor, the `source` of the
    tensors and the `architecture` they do not fit ("the architecture in <file>").
    `name(key)`: what `source` calls the model's `key` (default: the same)."""
    expected = {(name or str)(key): value for key, value in model.state_dict().items()}
    missing = [k for k in expected if k not in tensors]
    if missing:
        raise ModelFolderError(
            f"{source} has no tensor {_listed(missing)}, which {architecture} needs"
        )
    extra = sorted(k for k in tensors if k not in expected)
    if extra:
        raise ModelFolderError(
            f"{source} holds tensor {_listed(extra)}, which {architecture} has no place for"
        )
    for key, value in expected.items():
        if tensors[key].shape != value.shape:
            raise ModelFolderError(
                f"{source}: tensor {key!r} has shape {tuple(tensors[key].shape)}; "
                f"{architecture} needs {tuple(value.shape)}"
            )
    by_model_key = dict(zip(model.state_dict(), (tensors[k] for k in expected), strict=True))
    model.load_state_dict(by_model_key, strict=True)


def _legacy_name(key: str) -> str:
    """What a folder of format "elastic-nas-model/1" calls the state-dict entry `key`."""
    return key.removeprefix("layers.")


def resolve(
    name_or_path: str | Path,
    *,
    revision: str | None,
    cache_dir: str | Path | None,
    force_download: bool,
    token: str | bool | None,
    local_files_only: bool,
) -> Path:
    """The local folder of a model: `name_or_path` itself, or the snapshot of the Hub
    repository it names (only a string `owner/name` that is no local path)."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if isinstance(name_or_path, Path) or path.exists() or not _REPO_ID.fullmatch(name_or_path):
        raise ModelFolderError(
            f"{path} is not a folder; {WHAT} (or a Hugging Face Hub id, 'owner/name')"
        )
    from huggingface_hub import snapshot_download

    try:
        snapshot = snapshot_download(
            name_or_path,
            revision=revision,
            cache_dir=cache_dir,
            force_download=force_download,
            token=token,
            local_files_only=local_files_only,
        )
    except (OSError, ValueError) as error:  # offline, no such repository, no access
        raise ModelFolderError(
            f"{name_or_path} is no local folder, and the Hugging Face Hub did not give it: {error}"
        ) from error
    return Path(cast(str, snapshot))


def read_folder(folder: Path) -> ModelFolder:
    """The config and metrics of the model in `folder`, of this layout or the old one;
    `ModelFolderError` names what is missing or wrong."""
    metrics = read_json(folder / METRICS) if (folder / METRICS).is_file() else {}
    if (folder / CONFIG).is_file():
        config, legacy = ModelConfig.from_json(read_json(folder / CONFIG), folder / CONFIG), False
    elif (folder / LEGACY_CONFIG).is_file():
        where = folder / LEGACY_CONFIG
        config, legacy = ModelConfig.from_legacy(read_json(where), where, metrics), True
    else:
        raise ModelFolderError(f"{folder} is not an exported model: missing {CONFIG}; {WHAT}")
    if not (folder / WEIGHTS).is_file():
        raise ModelFolderError(f"{folder} is not a complete exported model: missing {WEIGHTS}")
    return ModelFolder(folder, _with_tokenizers(config, folder), metrics, legacy)


def _with_tokenizers(config: ModelConfig, folder: Path) -> ModelConfig:
    """`config` with the text of every tokenizer file its vocabularies name."""
    texts: dict[str, str] = {}
    for key, vocab in (("vocab", config.vocab), ("source_vocab", config.source_vocab)):
        name = (vocab or {}).get("tokenizer")
        if name is None:
            continue
        if name != _TOKENIZER_FILES[key]:
            raise ModelFolderError(
                f"{folder / CONFIG} names the tokenizer file {name!r} for its {key}; valid: "
                f"{_TOKENIZER_FILES[key]!r}"
            )
        try:
            texts[name] = (folder / name).read_text(encoding="utf-8")
        except OSError as error:
            raise ModelFolderError(
                f"{folder} is not a complete exported model: cannot read {name}, which "
                f"{CONFIG} names as its {key} ({error.strerror or error})"
            ) from error
    return replace(config, tokenizers=texts)


def _listed(names: Sequence[str]) -> str:
    """The first name, then how many more and which (the first few)."""
    if len(names) == 1:
        return repr(names[0])
    shown = ", ".join(repr(n) for n in names[1:4]) + (", ..." if len(names) > 4 else "")
    return f"{names[0]!r} (and {len(names) - 1} more: {shown})"


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False, default=_plain) + "\n")


def read_json(path: Path) -> dict[str, Any]:
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
