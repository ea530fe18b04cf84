"""Exported models as Hugging Face-style folders, loaded with the core install alone.

A retrained model (`nas.export.writing.export_model`) is a folder in the layout of
`huggingface_hub.PyTorchModelHubMixin`, loaded and saved with the same calls:

    config.json         what rebuilds the model: `format`, the architecture (`search_spaces`
                        JSON), the search-space `params` that gave it, the `vocab`, the
                        positions (`max_len`), the `task` (name, options) and the `training`
                        budget (steps, batch size, learning rate)
    model.safetensors   the weights, named as `model.state_dict()` names them
                        (`layers.<layer key>.<parameter>`); a missing or an extra tensor is
                        an error naming it
    tokenizer.json      a subword vocabulary (BPE or unigram pieces, `nas.text.subwords`) as
                        Hugging Face `tokenizers` saves it; `config.json`'s `vocab` names it
                        (a character vocabulary is in `config.json` itself)
    source_tokenizer.json   the source's, for a model whose source and target have
                        vocabularies of their own (`config.json`'s `source_vocab`; `vocab`
                        is then the target's)
    README.md           the model card (`nas.export.card`)
    metrics.json        what it scored (optional for loading; `model.metrics`)
    config.yaml, architecture.png   written by the export; `save_pretrained` copies them

    model = TranslationModel.from_pretrained("outputs/models/small/trial-3")
    model = nas.load_model("outputs/models/small/trial-3")   # the short form
    model.save_pretrained("elsewhere")

`ExportedModel` runs the layers the pipeline trained (`search_spaces.compile`) in order;
a model with an encoder is a `TranslationModel` and also translates text to text (greedy,
decoded as the evaluation decodes, with characters or its subword tokenizer).
`ExportedModel.from_pretrained` gives whichever the folder holds.

Why not the mixin itself: `huggingface_hub.hub_mixin` imports PyYAML (for its model cards),
and loading must need only torch, numpy and safetensors. This module imports neither
Optuna, Hydra, W&B, matplotlib, the tasks' metric scorers, rich nor YAML (`tokenizers`, for
a subword vocabulary, is part of the core install); `huggingface_hub` is imported
only to fetch a Hub repository id (`owner/name`), never for a local folder.

Folders written before this layout (`architecture.json`, format "elastic-nas-model/1",
weights named `<layer key>.<parameter>`) still load; `save_pretrained` into the same folder
(or `python -m nas.export convert <folder>`) rewrites them in this one. Reading and
checking the files is `nas.export.folder`'s part.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal, Self, cast

import torch
from safetensors.torch import save_file
from torch import nn

from nas.export.card import CardFacts, PipelineTag, render_card
from nas.export.folder import (
    CARD,
    CONFIG,
    EXTRAS,
    FORMAT,
    LEGACY_CONFIG,
    LEGACY_FORMAT,
    METRICS,
    SOURCE_TOKENIZER,
    TOKENIZER,
    WEIGHTS,
    WHAT,
    ModelConfig,
    ModelFolderError,
    read_folder,
    read_json,
    resolve,
    write_json,
)
from nas.text.decoding import translate_ids
from nas.text.vocab import SPECIALS, TokenVocab, Vocab
from pipeline.local.carry import through
from search_spaces.architecture import Architecture
from search_spaces.compile import compile as compile_arch

__all__ = [
    "CONFIG",
    "FORMAT",
    "LEGACY_FORMAT",
    "WEIGHTS",
    "ExportedModel",
    "ModelConfig",
    "ModelFolderError",
    "TranslationModel",
    "load_model",
    "load_vocab",
    "vocab_config",
]


def vocab_config(vocab: TokenVocab, file: str = TOKENIZER) -> tuple[dict[str, Any], dict[str, str]]:
    """What `config.json` says of `vocab`, and the tokenizer file that goes with it
    ({file: its text} for a subword vocabulary; {} for characters, which `config.json`
    holds itself)."""
    if isinstance(vocab, Vocab):
        return json.loads(vocab.to_json()), {}
    kind = getattr(vocab, "kind", None)
    if kind is None:
        raise TypeError(f"cannot export a {type(vocab).__name__}: a Vocab or a SubwordVocab")
    return {"specials": list(SPECIALS), "kind": kind, "tokenizer": file}, {file: vocab.to_json()}


def load_vocab(config: ModelConfig, side: Literal["target", "source"] = "target") -> TokenVocab:
    """The vocabulary of `side` that `config` describes (the source's is the target's unless
    it has `source_vocab`): characters, or the subword tokenizer it carries; ValueError
    naming what does not fit."""
    described = config.source_vocab if side == "source" else config.vocab
    if described is None:
        return load_vocab(config)
    if "tokenizer" not in described:
        return Vocab.from_json(json.dumps(described))
    name = str(described["tokenizer"])
    if name not in config.tokenizers:
        raise ValueError(f"its {side} vocabulary is {name}, which was not read with it")
    from nas.text.subwords import SubwordVocab

    try:
        return SubwordVocab.from_json(config.tokenizers[name])
    except Exception as error:  # tokenizers raises a bare Exception for a bad file
        raise ValueError(f"{name} is not a subword vocabulary: {error}") from error


class ExportedModel(nn.Module):
    """The layers of an exported model in order: `forward(x)` is the pipeline's forward.

    `config` is `config.json`; `architecture`, `params`, `vocab`, `task` are read from it,
    `metrics` from `metrics.json`. Built from a config, the weights are freshly initialised:
    `from_pretrained` loads them.
    """

    example_call: ClassVar[str] = "model(x)"  # what the model card shows
    pipeline_tag: ClassVar[PipelineTag] = "text-generation"

    def __init__(self, config: ModelConfig, metrics: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.config = config
        self.architecture: Architecture = config.build_architecture()
        self.vocab = load_vocab(config)
        self.source_vocab = (
            self.vocab if config.source_vocab is None else load_vocab(config, "source")
        )
        self.params: dict[str, Any] = dict(config.params)
        self.task: dict[str, Any] = dict(config.task)
        self.metrics: dict[str, Any] = dict(metrics or {})
        self.folder: Path | None = None  # where it was loaded from
        specs = compile_arch(
            self.architecture,
            len(self.vocab),
            max_len=config.max_len,
            dropout=0.0,
            source_vocab_size=len(self.source_vocab),
        )
        with torch.random.fork_rng(devices=[]):  # initialising leaves the caller's RNG alone
            layers = {spec.key: spec.factory() for spec in specs}
        self.layers = nn.ModuleDict(layers)  # in order: the keys are the layer keys

    def forward(self, x: Any) -> Any:
        return through(self.layers.items(), x)

    @classmethod
    def class_for(cls, config: ModelConfig, where: str = "the config") -> type[Self]:
        """The class of a model of `config`: `cls` itself, or the class it derives from
        that fits, a `TranslationModel` for an encoder-decoder, else an `ExportedModel`."""
        decoder_only = config.build_architecture(where).decoder_only
        natural = ExportedModel if decoder_only else TranslationModel
        if issubclass(natural, cls):
            return cast(type[Self], natural)
        if issubclass(cls, natural) and issubclass(cls, TranslationModel) != decoder_only:
            return cls  # a user's subclass of the class that fits
        kind = "decoder-only model" if decoder_only else "encoder-decoder"
        raise ModelFolderError(
            f"{where} describes a {kind}, which a {cls.__name__} cannot hold: load it with "
            f"{natural.__name__}.from_pretrained or nas.load_model"
        )

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | Path,
        *,
        map_location: str | torch.device = "cpu",
        revision: str | None = None,
        cache_dir: str | Path | None = None,
        force_download: bool = False,
        token: str | bool | None = None,
        local_files_only: bool = False,
    ) -> Self:
        """The model in a local folder (or, for an `owner/name` string that is no local
        path, in that Hugging Face Hub repository), in eval mode on `map_location`.
        Raises `ModelFolderError` naming the folder and the file that is missing or wrong."""
        folder = resolve(
            pretrained_model_name_or_path,
            revision=revision,
            cache_dir=cache_dir,
            force_download=force_download,
            token=token,
            local_files_only=local_files_only,
        )
        found = read_folder(folder)
        model_class = cls.class_for(found.config, str(found.config_file))
        try:
            model = model_class(found.config, found.metrics)
        except (KeyError, TypeError, ValueError) as error:
            raise ModelFolderError(
                f"{found.config_file} does not describe a model: {error}"
            ) from error
        try:
            found.load_into(model)
        except ModelFolderError as error:
            raise ModelFolderError(f"{error}{_vocabulary_note(model)}") from None
        model.folder = folder
        return model.to(map_location).eval()

    def save_pretrained(self, save_directory: str | Path) -> Path:
        """Write the model folder (module docstring) to `save_directory`; returns it. The
        export's `config.yaml` and `architecture.png` come along from the folder the model
        was loaded from; an `architecture.json` of the old layout there is removed."""
        folder = Path(save_directory)
        folder.mkdir(parents=True, exist_ok=True)
        if self.folder is not None and self.folder.resolve() != folder.resolve():
            for name in EXTRAS:
                if (self.folder / name).is_file():
                    shutil.copyfile(self.folder / name, folder / name)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, str(folder / WEIGHTS), metadata={"format": FORMAT})
        write_json(folder / CONFIG, self.config.to_json())
        for name, text in self.config.tokenizers.items():
            (folder / name).write_text(text, encoding="utf-8")
        if self.metrics:
            write_json(folder / METRICS, self.metrics)
        (folder / CARD).write_text(self.model_card(folder))
        old = folder / LEGACY_CONFIG
        if old.is_file() and read_json(old).get("format") == LEGACY_FORMAT:
            old.unlink()
        return folder

    def model_card(self, folder: str | Path) -> str:
        """The README.md of this model saved in `folder` (`nas.export.card`)."""
        where = Path(folder)
        files = [CONFIG, WEIGHTS, TOKENIZER, SOURCE_TOKENIZER, METRICS, *EXTRAS]
        separate = self.source_vocab is not self.vocab
        return render_card(
            CardFacts(
                folder=str(folder),
                class_name=type(self).__name__,
                example_call=self.example_call,
                pipeline_tag=self.pipeline_tag,
                task=self.task,
                training=self.config.training,
                metrics=self.metrics,
                parameters=sum(p.numel() for p in self.parameters()),
                vocab_size=len(self.vocab),
                source_vocab_size=len(self.source_vocab) if separate else None,
                vocab_kind=str(self.config.vocab.get("kind", "chars")),
                max_len=self.config.max_len,
                picture=(where / "architecture.png").is_file(),
                files=[name for name in files if (where / name).is_file()],
            )
        )


class TranslationModel(ExportedModel):
    """An exported encoder-decoder: `translate(sources)` greedily, as the evaluation does."""

    example_call = "model.translate(['Germany', 'France'])"
    pipeline_tag = "translation"

    def __init__(self, config: ModelConfig, metrics: Mapping[str, Any] | None = None) -> None:
        super().__init__(config, metrics)
        if self.architecture.decoder_only:
            raise ValueError(
                "a TranslationModel needs an encoder-decoder architecture; this one is "
                "decoder-only: build an ExportedModel"
            )
        self.subword = "tokenizer" in config.vocab
        self.unit = "tokens" if self.subword else "characters"
        self.max_length = config.max_len - 2  # the longest source, in `unit`
        if not self.subword:
            options = self.task.get("options", {})
            self.max_length = min(self.max_length, int(options.get("max_chars", self.max_length)))
        self.fixed_length = bool(self.task.get("options", {}).get("fixed_length", False))

    @torch.no_grad()
    def translate(self, sources: Sequence[str], *, batch_size: int = 128) -> list[str]:
        """Greedy translations of the texts `sources`, as text (characters or pieces the
        model never saw become UNK)."""
        if isinstance(sources, str):
            raise TypeError("translate() takes a list of sources, not one string")
        encoded = [self.source_vocab.encode(s) for s in sources]
        for source, ids in zip(sources, encoded, strict=True):
            if len(ids) > self.max_length:
                raise ValueError(
                    f"source {source!r:.80} has {len(ids)} {self.unit}; "
                    f"this model reads at most {self.max_length}"
                )
        if not sources:
            return []
        return translate_ids(
            lambda src, tgt: self((src, tgt)),
            self.vocab,
            encoded,
            batch_size=batch_size,
            max_len=self.max_length + 1,
            width=self.max_length if self.fixed_length else None,
            device=next(self.parameters()).device,
        )


def _vocabulary_note(model: ExportedModel) -> str:
    """What a weights file at odds with its folder's tokenizer files may mean: a tokenizer
    copied from another model ("" for a character vocabulary, kept in config.json)."""
    files = ", ".join(model.config.tokenizers)
    if not files:
        return ""
    return f" (the vocabulary read from {files} has {len(model.vocab)} pieces: another model's?)"


def load_model(path: str | Path, *, map_location: str | torch.device = "cpu") -> ExportedModel:
    """The model exported to the local folder `path`, in eval mode (a `TranslationModel`
    when it has an encoder): `ExportedModel.from_pretrained` without the Hub."""
    if not Path(path).is_dir():
        raise ModelFolderError(f"{path} is not a folder; {WHAT}")
    return ExportedModel.from_pretrained(Path(path), map_location=map_location)
