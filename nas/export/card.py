"""The model card (`README.md`) of an exported model: what a reader of the folder or the Hub
page needs before loading it.

YAML front matter as the Hugging Face Hub reads it (`library_name`, `license`, `tags`,
`pipeline_tag`), then the architecture picture, the size, the training budget, the
validation and test figures of the exported weights and of every training seed, and how to
load it. Written by hand (the front matter holds only plain strings) so that saving a model
needs no YAML or template library: only the standard library is imported here.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any, Literal

__all__ = ["CardFacts", "render_card"]

LIBRARY = "elastic-nas"
LICENSE = "apache-2.0"  # pyproject.toml's license, as the Hub spells it
PipelineTag = Literal["translation", "text-generation"]
# Per-split figures that describe the evaluation rather than the model.
BOOKKEEPING = frozenset({"tokens", "decoded", "decode_s", "s"})


@dataclass(frozen=True)
class CardFacts:
    """What the card says; `folder` is where the card tells the reader to load from."""

    folder: str
    class_name: str  # the model class in `nas.export.pretrained`
    example_call: str  # what to do with the loaded `model`
    pipeline_tag: PipelineTag
    task: Mapping[str, Any]  # name and options
    training: Mapping[str, Any]  # steps, batch size, learning rate, ...
    metrics: Mapping[str, Any]  # metrics.json
    parameters: int
    vocab_size: int
    max_len: int
    picture: bool  # architecture.png is beside the card
    files: Sequence[str] = field(default_factory=tuple)
    vocab_kind: str = "chars"  # or a subword tokenizer's kind: "bpe", "unigram"
    source_vocab_size: int | None = None  # where the source has a vocabulary of its own


def render_card(facts: CardFacts) -> str:
    """The card's text: front matter, then Markdown."""
    sections = [
        _front_matter(facts),
        _title(facts),
        _training(facts),
        _results(facts.metrics),
        _loading(facts),
        _files(facts.files),
    ]
    return "\n".join(s for s in sections if s)


def _front_matter(facts: CardFacts) -> str:
    name = str(facts.task.get("name", ""))
    tags = [LIBRARY, "neural-architecture-search", "pytorch"]
    if re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name) and name not in tags:
        tags.append(name)  # a built-in task's name; not a plug-in's import path
    lines = [
        "---",
        f"library_name: {json.dumps(LIBRARY)}",
        f"license: {json.dumps(LICENSE)}",
        f"pipeline_tag: {json.dumps(facts.pipeline_tag)}",
        "tags:",
        *(f"- {json.dumps(tag)}" for tag in tags),
        "---",
        "",
    ]
    return "\n".join(lines)


def _title(facts: CardFacts) -> str:
    kind = "language model" if facts.pipeline_tag == "text-generation" else "encoder-decoder"
    options = json.dumps(dict(facts.task.get("options", {})), ensure_ascii=False)
    lines = [
        f"# {PurePath(facts.folder).name}",
        "",
        f"A {_level(facts.vocab_kind)} {kind} whose architecture a neural architecture "
        f"search chose (`{LIBRARY}`, the Evolved Transformer search space), retrained from "
        f"scratch for the task `{facts.task.get('name')}` (options `{options}`).",
        "",
    ]
    if facts.picture:
        lines += ["![The encoder and decoder cells](architecture.png)", ""]
    units = f"{_units(facts.vocab_kind)} and 4 specials"
    if facts.source_vocab_size is None:
        vocabulary = [f"- vocabulary: {facts.vocab_size} tokens ({units})"]
    else:
        vocabulary = [
            f"- source vocabulary: {facts.source_vocab_size} tokens ({units})",
            f"- target vocabulary: {facts.vocab_size} tokens ({units})",
        ]
    lines += [
        f"- parameters: {facts.parameters:,}",
        *vocabulary,
        f"- positions: up to {facts.max_len}",
        "",
    ]
    return "\n".join(lines)


def _training(facts: CardFacts) -> str:
    steps = facts.training.get("steps", facts.metrics.get("steps"))
    batch = facts.training.get("batch_size")
    seeds = [str(row.get("seed")) for row in _per_seed(facts.metrics)]
    lines = ["## Training", ""]
    lines.append(f"- steps: {_count(steps)} per training seed")
    lines.append(f"- batch size: {_count(batch)}")
    if "lr" in facts.training:
        schedule = facts.training.get("lr_schedule", "")
        lines.append(f"- learning rate: {facts.training['lr']} {schedule}".rstrip())
    if seeds:
        lines.append(f"- training seeds: {', '.join(seeds)}")
    if "seed" in facts.metrics:
        lines.append(f"- these weights: training seed {facts.metrics['seed']}")
    return "\n".join([*lines, ""])


def _results(metrics: Mapping[str, Any]) -> str:
    names = _metric_names([metrics, *_per_seed(metrics)])
    if not names:
        return ""
    seed = metrics.get("seed")
    whose = f"training seed {seed}" if seed is not None else "these weights"
    lines = ["## Results", "", f"Whole splits, {whose}:", ""]
    lines += ["| metric | validation | test |", "| --- | ---: | ---: |"]
    for name in names:
        cells = [_number(metrics.get(f"{split}_{name}")) for split in ("validation", "test")]
        lines.append(f"| {name.replace('_', ' ')} | {cells[0]} | {cells[1]} |")
    lines += _seed_table(_per_seed(metrics), names, seed)
    return "\n".join([*lines, *_signature_notes(metrics, names), ""])


def _signature_notes(metrics: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """How a metric of the tables was computed, where the task's description (`data`,
    `Task.describe`) records its scorer's signature as `<metric>_signature`."""
    data = metrics.get("data")
    if not isinstance(data, Mapping):
        return []
    notes = [
        f"{name.replace('_', ' ')}: scorer signature `{signature}`."
        for name in names
        if isinstance(signature := data.get(f"{name}_signature"), str)
    ]
    return [line for note in notes for line in ("", note)]  # a paragraph each


def _seed_table(rows: Sequence[Mapping[str, Any]], names: Sequence[str], seed: Any) -> list[str]:
    """Every training seed's figures, the exported one marked; [] without per-seed rows."""
    if not rows:
        return []
    columns = [
        f"{split}_{name}"
        for name in names
        for split in ("validation", "test")
        if any(f"{split}_{name}" in row for row in rows)
    ]
    lines = ["", "Every training seed:", ""]
    lines.append("| seed | " + " | ".join(c.replace("_", " ") for c in columns) + " |")
    lines.append("| --- |" + " ---: |" * len(columns))
    for row in rows:
        mark = " (these weights)" if row.get("seed") == seed else ""
        cells = " | ".join(_number(row.get(c)) for c in columns)
        lines.append(f"| {row.get('seed')}{mark} | {cells} |")
    return lines


def _loading(facts: CardFacts) -> str:
    folder = json.dumps(facts.folder)
    return "\n".join(
        [
            "## How to load",
            "",
            "With the core install alone (torch, numpy, safetensors, huggingface_hub; no "
            "Optuna, Hydra or W&B), in evaluation mode on the CPU:",
            "",
            "```python",
            f"from nas.export.pretrained import {facts.class_name}",
            "",
            f"model = {facts.class_name}.from_pretrained({folder})",
            f"print({facts.example_call})",
            "```",
            "",
            "or, the short form:",
            "",
            "```python",
            "import nas",
            "",
            f"model = nas.load_model({folder})",
            "```",
            "",
            "`model.save_pretrained(folder)` writes the folder again.",
            "",
        ]
    )


def _files(files: Sequence[str]) -> str:
    meaning = {
        "config.json": "what rebuilds the model (architecture, search-space parameters, "
        "vocabulary, task, training budget)",
        "model.safetensors": "the weights, named as `model.state_dict()` names them",
        "tokenizer.json": "the subword vocabulary (Hugging Face `tokenizers`), which "
        "`translate` reads and writes text with",
        "source_tokenizer.json": "the source's own subword vocabulary, which `translate` "
        "reads text with (`tokenizer.json` is then the target's)",
        "metrics.json": "every figure above, and more (timings, token counts)",
        "config.yaml": "the resolved configuration of the run that trained it",
        "architecture.png": "the cells, drawn",
    }
    rows = [f"- `{name}`: {meaning[name]}" for name in files if name in meaning]
    return "\n".join(["## Files", "", *rows, ""]) if rows else ""


def _level(vocab_kind: str) -> str:
    return "character-level" if vocab_kind == "chars" else f"subword-level ({vocab_kind.upper()})"


def _units(vocab_kind: str) -> str:
    return "characters" if vocab_kind == "chars" else f"{vocab_kind.upper()} pieces"


def _per_seed(metrics: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    rows = metrics.get("per_seed", [])
    return [row for row in rows if isinstance(row, Mapping)] if isinstance(rows, list) else []


def _metric_names(sources: Sequence[Mapping[str, Any]]) -> list[str]:
    """Metrics with a validation or test figure, in the order they first appear."""
    names: dict[str, None] = {}
    for source in sources:
        for key, value in source.items():
            split, _, name = key.partition("_")
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            if split in ("validation", "test") and name not in BOOKKEEPING and numeric:
                names[name] = None
    return list(names)


def _number(value: Any) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return "-"
    return "nan" if math.isnan(value) else f"{value:.4g}"


def _count(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) else "not recorded (see config.yaml)"
