"""`nas.tasks.parallel`: the tokenizer a translation task reads (characters, or BPE and
unigram pieces trained on the training split only, the same for a seed), the lengths the
model's positions follow, and greedy decoding scored on the detokenized text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sacrebleu
import torch

from nas.study import training
from nas.tasks import (
    SPLITS,
    UNK,
    Corpus,
    TaskInputError,
    TokenizerOptions,
    Translation,
    Vocab,
    bind_options,
    get_task,
)
from nas.text.subwords import SubwordVocab
from search_spaces.evolved_transformer import evolved_transformer
from tests.nas.corpora import PAIRS, write_tsv


def corpus(path: Path, **options: Any) -> Corpus:
    task = get_task("corpus", path=str(path), **options)
    assert isinstance(task, Corpus)
    return task


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_a_subword_vocabulary_is_the_same_for_a_seed(tmp_path: Path, kind: str) -> None:
    path = write_tsv(tmp_path / "p.tsv")
    task = corpus(path, tokenizer=kind, vocab_size=150, seed=1)
    assert isinstance(task.vocab, SubwordVocab) and task.vocab.kind == kind
    again = corpus(path, tokenizer=kind, vocab_size=150, seed=1)
    assert again.vocab.to_json() == task.vocab.to_json()
    assert again._encoded == task._encoded
    assert task.describe()["tokenizer"] == kind


def test_pieces_are_learned_from_the_training_split_only(tmp_path: Path) -> None:
    held_out = ("7 cannot open the quiz", "7 kann das Quiz nicht öffnen")  # Q, q: new
    write_tsv(tmp_path / "train.tsv", PAIRS[:80])
    write_tsv(tmp_path / "validation.tsv", [*PAIRS[80:85], held_out])
    write_tsv(tmp_path / "test.tsv", PAIRS[85:])
    task = corpus(tmp_path, tokenizer="bpe", vocab_size=200, seed=4)
    texts = [text for pair in PAIRS[:80] for text in pair]
    assert task.vocab == SubwordVocab.train(texts, "bpe", 200, seed=4)
    assert SubwordVocab.train([*texts, *held_out], "bpe", 200, seed=4) != task.vocab
    source, target = task._encoded["validation"][-1]
    assert UNK in source and UNK in target  # "q" and "Q" never occur in training


def test_positions_follow_the_longest_sequence_in_tokens(tmp_path: Path) -> None:
    path = write_tsv(tmp_path / "p.tsv")
    pieces = corpus(path, tokenizer="bpe", vocab_size=150)
    longest = max(len(ids) for split in SPLITS for pair in pieces._encoded[split] for ids in pair)
    assert pieces.max_tokens == longest and training.max_len(pieces) == longest + 2
    assert pieces.max_tokens < pieces.max_chars  # pieces make shorter sequences
    arch = evolved_transformer(32, n_heads=4, n_enc=1, n_dec=1)
    specs, _ = training.compile_model(arch, pieces, dropout=0.0)
    shapes = [tuple(p.shape) for spec in specs for p in spec.factory().parameters()]
    assert (len(pieces.vocab), 32) in shapes  # one embedding table of the shared vocabulary
    capped = corpus(path, tokenizer="bpe", vocab_size=150, max_tokens=longest - 1)
    assert capped.max_tokens <= longest - 1  # the longest of the pairs kept
    dropped = capped.describe()["cleaning"]["too_many_tokens"]
    assert dropped > 0 and capped.counts["pairs"] == len(PAIRS) - dropped
    fixed = corpus(path, tokenizer="bpe", vocab_size=150, fixed_length=True)
    (src, tgt), _ = next(fixed.batches("train", 8))
    assert src.shape[1] == fixed.max_tokens and tgt.shape[1] == fixed.max_tokens + 1


@pytest.mark.parametrize("kind", ["chars", "bpe"])
def test_each_side_may_have_its_own_vocabulary(tmp_path: Path, kind: str) -> None:
    path = write_tsv(tmp_path / "p.tsv")
    size = {"vocab_size": 100} if kind == "bpe" else {}
    shared = corpus(path, tokenizer=kind, **size)
    assert shared.source_vocab is shared.vocab and "source_vocab_size" not in shared.describe()
    task = corpus(path, tokenizer=kind, shared_vocab=False, **size)
    assert task.source_vocab != task.vocab
    if kind == "bpe":
        sources, targets = zip(*task.pairs("train"), strict=True)
        assert task.source_vocab == SubwordVocab.train(list(sources), "bpe", 100, seed=0)
        assert task.vocab == SubwordVocab.train(list(targets), "bpe", 100, seed=0)
    (source, target), (src_ids, tgt_ids) = task.pairs("test")[0], task._encoded["test"][0]
    assert task.source_vocab.decode(src_ids) == source and task.vocab.decode(tgt_ids) == target
    assert task.describe()["source_vocab_size"] == len(task.source_vocab)
    arch = evolved_transformer(32, n_heads=4, n_enc=1, n_dec=1)
    specs, parameters = training.compile_model(arch, task, dropout=0.0)
    layers = {spec.key: spec.factory() for spec in specs}
    assert sum(p.numel() for layer in layers.values() for p in layer.parameters()) == parameters
    embeddings = {
        key: layers[key].get_parameter("embed.tokens.weight").shape[0]
        for key in ("embed_src", "embed_tgt")
    }
    assert embeddings == {"embed_src": len(task.source_vocab), "embed_tgt": len(task.vocab)}
    x, y = next(task.batches("train", 4))
    assert torch.isfinite(task.loss_fn(_forward(layers, x), y))


def _forward(layers: dict[str, torch.nn.Module], x: object) -> torch.Tensor:
    carry = x
    for layer in layers.values():
        carry = layer(carry)
    assert isinstance(carry, torch.Tensor)
    return carry


def test_shared_vocab_must_be_a_boolean(tmp_path: Path) -> None:
    with pytest.raises(TaskInputError, match=r"shared_vocab='no' is not valid; valid: true"):
        corpus(write_tsv(tmp_path / "p.tsv"), tokenizer="chars", shared_vocab="no")


def test_characters_keep_the_name_tasks_lengths(tmp_path: Path) -> None:
    chars = corpus(write_tsv(tmp_path / "p.tsv"), tokenizer="chars")
    assert isinstance(chars.vocab, Vocab) and not hasattr(chars, "max_tokens")
    assert chars.max_chars == max(len(side) for pair in PAIRS for side in pair)
    assert training.max_len(chars) == chars.max_chars + 2
    names = get_task("translation")
    assert isinstance(names, Translation) and training.max_len(names) == 50


def oracle(task: Corpus, split: str, wrong: int = 0) -> Any:
    """A step function that predicts each reference's next piece (for `wrong` of the
    sources, one of them is always the first non-special piece instead)."""
    answers = {tuple(src): tgt for src, tgt in task._encoded[split]}
    spoiled = {tuple(src) for src, _ in task._encoded[split][:wrong]}

    def step(src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        logits = torch.zeros(src.shape[0], len(task.vocab), tgt_in.shape[1])
        for row, ids in enumerate(src.tolist()):
            key = tuple(i for i in ids if i != 0)
            target = [*answers[key], 2]
            for t in range(tgt_in.shape[1]):
                token = target[t] if t < len(target) else 0
                logits[row, 4 if key in spoiled and t == 1 else token, t] = 1.0
        return logits

    return step


def test_decoding_scores_the_detokenized_text(tmp_path: Path) -> None:
    task = corpus(write_tsv(tmp_path / "p.tsv"), tokenizer="unigram", vocab_size=150)
    references = [tgt for _, tgt in task.pairs("validation")]
    assert task.generate(oracle(task, "validation"), "validation", batch_size=4) == references
    perfect = task.generation_metrics(oracle(task, "validation"), "validation", batch_size=4)
    assert perfect["chrf"] == pytest.approx(100) and perfect["bleu"] == pytest.approx(100)
    assert perfect["exact_match"] == 1.0
    spoiled = oracle(task, "validation", wrong=4)
    hypotheses = task.generate(spoiled, "validation", batch_size=4)
    scores = task.generation_metrics(spoiled, "validation", batch_size=4)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hypotheses, [references]).score)
    same = sum(h == r for h, r in zip(hypotheses, references, strict=True))
    assert scores["exact_match"] == pytest.approx(same / len(references)) and same < 9


def test_the_tokenizer_options_are_one_group_users_write_flat(tmp_path: Path) -> None:
    """`vocab_size` alone keeps the corpus task's default tokenizer (BPE): the flat options
    are gathered over the task's default `TokenizerOptions`."""
    assert bind_options("corpus", {"path": "p.tsv", "vocab_size": 150}) == {
        "path": "p.tsv",
        "tokenization": TokenizerOptions("bpe", vocab_size=150),
    }
    assert bind_options("translation", {"seed": 3}) == {"seed": 3}  # the default group
    path = write_tsv(tmp_path / "p.tsv")
    assert corpus(path, vocab_size=150).tokenization == TokenizerOptions("bpe", 150)
    direct = Corpus(path, tokenization=TokenizerOptions("unigram", vocab_size=150))
    assert direct.describe()["tokenizer"] == "unigram"
    both = {"path": "p.tsv", "vocab_size": 100, "tokenization": TokenizerOptions()}
    with pytest.raises(TypeError, match=r"tokenization and its fields \['vocab_size'\]"):
        bind_options("corpus", both)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tokenizer": "wordpiece"}, "tokenizer='wordpiece' is not valid; valid tokenizers: chars"),
        ({"tokenizer": "bpe", "vocab_size": "8k"}, "vocab_size='8k' is not valid; valid: an"),
        ({"shared_vocab": 1}, "shared_vocab=1 is not valid; valid: true"),
        ({"max_tokens": 40}, "max_tokens=40 is not valid for tokenizer='chars'"),
        ({"tokenizer": "bpe", "max_tokens": -1}, "max_tokens=-1 is not valid; valid: an integer"),
    ],
)
def test_tokenizer_options_name_a_value_they_cannot_take(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(TaskInputError, match=message):
        TokenizerOptions(**options)
