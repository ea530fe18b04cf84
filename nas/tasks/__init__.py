"""Tasks with real data that ships offline (docs/design.md, section 5), behind one `get_task`.

Each task gives the harness a `Vocab`, batches identical on every pipeline rank, a loss
function for the pipeline, metrics, and a unigram baseline a model must beat.

Sizes measured (pycountry 26.2.16, Python 3.11's `pydoc_data`, default options, seed 0):

* translation: 14,411 catalog entries; 10,309 identical to the English and 33 duplicate
  pairs dropped leave 4,069 pairs, and 11 longer than 48 characters leave 4,058:
  3,246 / 406 / 406 train / validation / test. 145 tokens (141 characters). Unigram
  baseline 3.52 nats per target token on validation (uniform: ln 145 = 4.98).
* charlm: 79 topics, 464,970 characters; 418,594 / 23,399 / 23,445 per split (with the
  blank lines joining topic pieces). 107 tokens (103 characters). Unigram baseline 4.79 bits
  per character on validation (uniform: log2 107 = 6.74).
* textfile: 90 / 5 / 5% of the file by characters; at least 20 * (seq_len + 2) characters.
* corpus: the user's parallel corpus (`nas.tasks.corpus`); its splits as named, or 80/10/10.
* messages: the system's German gettext catalogs (`nas.tasks.messages`); on Debian with 86
  catalogs, 33,997 sentences of 3 to 30 words.

The translation tasks share `nas.tasks.parallel.ParallelCorpus` and read characters or
subword pieces (`nas.tasks.tokenizing.TokenizerOptions`; options `tokenizer`: chars, bpe,
unigram, `vocab_size`, `max_tokens`, `shared_vocab`). A task that reads the user's data is
built once by the CLI before a study starts (`check_task`), so that a bad file or option is
one line (`TaskInputError`) rather than a failure in every stage process.

    from nas.tasks import get_task
    task = get_task("translation", seed=0)
    for x, y in task.batches("train", 64, seed=0, epoch=0):
        loss = pipe.train_step(x, y)   # pipe built with loss_fn=masked_cross_entropy
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from nas.tasks.base import (
    BOS,
    EOS,
    PAD,
    SPLITS,
    UNK,
    Batch,
    DecodeShare,
    Direction,
    Task,
    TaskInputError,
    TokenStats,
    TokenVocab,
    Vocab,
    masked_cross_entropy,
)
from nas.tasks.charlm import CharLanguageModel, CharLM
from nas.tasks.corpus import Corpus
from nas.tasks.corpus_files import CorpusError
from nas.tasks.messages import Messages
from nas.tasks.metrics import bleu, bleu_signature, chrf, decode_metrics, exact_match, sentence_chrf
from nas.tasks.options import accepts_any, arguments, groups, option_names
from nas.tasks.parallel import ParallelCorpus
from nas.tasks.textfile import TextFile
from nas.tasks.tokenizing import TokenizerOptions
from nas.tasks.translation import Translation, greedy_decode
from pipeline.pure.registry import Registry

__all__ = [
    "BOS",
    "EOS",
    "PAD",
    "SPLITS",
    "TASKS",
    "UNK",
    "Batch",
    "CharLM",
    "CharLanguageModel",
    "Corpus",
    "CorpusError",
    "DecodeShare",
    "Direction",
    "Messages",
    "ParallelCorpus",
    "Task",
    "TaskInputError",
    "TextFile",
    "TokenStats",
    "TokenVocab",
    "TokenizerOptions",
    "Translation",
    "Vocab",
    "bind_options",
    "bleu",
    "bleu_signature",
    "check_task",
    "chrf",
    "decode_metrics",
    "exact_match",
    "get_task",
    "greedy_decode",
    "known_tasks",
    "masked_cross_entropy",
    "sentence_chrf",
    "task_class",
]

# Every task by name; a user's `Task` subclass is found by import path as well.
TASKS: Registry[type[Task]] = Registry(
    "task",
    {
        "translation": Translation,
        "charlm": CharLM,
        "textfile": TextFile,
        "corpus": Corpus,
        "messages": Messages,
    },
    base=Task,
)


def known_tasks() -> dict[str, type[Task]]:
    """The built-in tasks, then every user's task `task_class` has loaded (by import path)."""
    return TASKS.known()


def task_class(name: str) -> type[Task]:
    """The built-in task called `name`, or a user's `Task` subclass by import path
    ("package.module:ClassName"), which is then known by that path."""
    return TASKS.find(name)


def bind_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The constructor's keyword arguments of the task called `name` for the flat `options`
    users write (`nas.tasks.options`: a group's fields gathered into it), without reading
    any data: TypeError naming an option the task does not take (or a mandatory one not
    given) and the valid ones; `TaskInputError` for a value an option group refuses."""
    cls = task_class(name)
    valid = option_names(cls)
    try:
        unknown = sorted(set(options) - set(valid) - set(groups(cls)))  # a group: as such
        if unknown and not accepts_any(cls):
            raise TypeError(f"unknown options {unknown}")
        bound = arguments(cls, options)
        inspect.signature(cls).bind(**bound)
    except TypeError as error:
        raise TypeError(
            f"bad options for task {name!r}: {error}; valid options: {', '.join(valid)}"
        ) from error
    return bound


def get_task(name: str, **options: Any) -> Task:
    """The task called `name` (`task_class`), built with `options` (e.g. seed, seq_len;
    `bind_options`)."""
    return task_class(name)(**bind_options(name, options))


def check_task(name: str, options: Mapping[str, Any]) -> None:
    """Build the task called `name` with `options` now when it reads the user's data
    (`ParallelCorpus.reads_user_data`): a missing, empty or mis-encoded file, a line with one
    side, or a tokenizer setting it cannot serve raises `TaskInputError` here, in the
    process that was given them, before a study starts any other. Other tasks: nothing."""
    if getattr(task_class(name), "reads_user_data", False):
        get_task(name, **options)
