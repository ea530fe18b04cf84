"""English->German names from pycountry: pairs, split, batches, decoding and baselines."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from nas.tasks import BOS, EOS, PAD, SPLITS, DecodeShare, Translation, get_task, greedy_decode
from nas.tasks.translation import DECODE_ROWS, StepFn, decode_rows, load_pairs, split_pairs


@pytest.fixture(scope="module")
def task() -> Translation:
    return Translation(seed=0)


def test_pairs_are_distinct_translations(task: Translation) -> None:
    pairs, counts = load_pairs()
    assert 3_900 <= len(pairs) <= 4_400  # 4,069 with pycountry 26.2.16
    assert len(set(pairs)) == len(pairs) and pairs == sorted(pairs)
    assert all(en and de and en != de for en, de in pairs)
    assert all(en == " ".join(en.split()) and de == " ".join(de.split()) for en, de in pairs)
    assert ("Germany", "Deutschland") in pairs
    assert counts["identical"] > 0 and counts["duplicates"] > 0
    assert task.counts["pairs"] == len(pairs) - task.counts["too_long"]
    assert sum(task.size(s) for s in SPLITS) == task.counts["pairs"]
    assert all(max(len(en), len(de)) <= 48 for s in SPLITS for en, de in task.pairs(s))


def test_split_is_disjoint_covering_and_stable(task: Translation) -> None:
    splits = {s: task.pairs(s) for s in SPLITS}
    everything = [p for s in SPLITS for p in splits[s]]
    assert sorted(everything) == sorted(p for p in load_pairs()[0] if max(map(len, p)) <= 48)
    sources = {s: {en for en, _ in splits[s]} for s in SPLITS}
    assert not sources["train"] & sources["validation"]
    assert not sources["train"] & sources["test"] and not sources["validation"] & sources["test"]
    assert 0.09 < len(splits["validation"]) / len(everything) < 0.11
    assert 0.09 < len(splits["test"]) / len(everything) < 0.11
    assert splits["validation"][:3] == [  # the seed-0 fingerprint (pycountry 26.2.16)
        ("Adamorobe Sign Language", "Adamorobe-Gebärdensprache"),
        ("Adasen", "Itneg"),
        ("Adivasi Oriya", "Oriya Adivasi"),
    ]
    again = split_pairs(everything, seed=0)
    assert again == task.splits
    assert split_pairs(everything, seed=1)["validation"] != splits["validation"]
    with pytest.raises(ValueError, match="fractions"):
        split_pairs(everything, seed=0, fractions=(0.5, 0.5))


def test_batches_identical_across_constructions_and_vary_with_seed_and_epoch(
    task: Translation,
) -> None:
    other = Translation(seed=0)  # another rank builds its own task

    def first(t: Translation, seed: int, epoch: int) -> list[torch.Tensor]:
        (src, tgt_in), tgt_out = next(t.batches("train", 16, seed=seed, epoch=epoch))
        return [src, tgt_in, tgt_out]

    for a, b in zip(first(task, 3, 1), first(other, 3, 1), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(first(task, 3, 1)[2], first(task, 3, 2)[2])
    assert not torch.equal(first(task, 3, 1)[2], first(task, 4, 1)[2])
    n = sum(1 for _ in task.batches("train", 64, seed=0, epoch=0))
    assert n == task.size("train") // 64


def test_padding_bos_eos_and_dtypes(task: Translation) -> None:
    lookup: dict[str, set[str]] = {}
    for en, de in task.pairs("train"):
        lookup.setdefault(en, set()).add(de)
    (src, tgt_in), tgt_out = next(task.batches("train", 32, seed=0, epoch=0))
    assert src.dtype == tgt_in.dtype == tgt_out.dtype == torch.int64
    assert src.shape[0] == 32 and tgt_in.shape == tgt_out.shape
    assert int((src != PAD).sum(1).max()) == src.shape[1]  # padded to the longest
    for i in range(32):
        en, de = task.vocab.decode(src[i]), task.vocab.decode(tgt_out[i])
        assert de in lookup[en]
        n = len(de)
        assert tgt_in[i, 0] == BOS and torch.equal(tgt_in[i, 1 : n + 1], tgt_out[i, :n])
        assert tgt_out[i, n] == EOS
        assert (tgt_out[i, n + 1 :] == PAD).all() and (tgt_in[i, n + 1 :] == PAD).all()
        assert (src[i, len(en) :] == PAD).all()
    fixed = Translation(seed=0, fixed_length=True)
    (src, tgt_in), tgt_out = next(fixed.batches("train", 8, seed=0, epoch=0))
    assert src.shape == (8, 48) and tgt_in.shape == tgt_out.shape == (8, 49)


def test_evaluation_batches_cover_the_split_once_in_full_batches(task: Translation) -> None:
    seen = []
    for (src, tgt_in), tgt_out in task.batches("validation", 64):
        assert src.shape[0] == tgt_in.shape[0] == tgt_out.shape[0] == 64
        for i in range(64):
            if (tgt_out[i] != PAD).any():
                seen.append((task.vocab.decode(src[i]), task.vocab.decode(tgt_out[i])))
            else:  # a filler row: row 0's inputs, nothing to predict
                assert torch.equal(src[i], src[0]) and torch.equal(tgt_in[i], tgt_in[0])
    assert seen == task.pairs("validation")


def oracle(task: Translation) -> tuple[dict[str, str], StepFn]:
    """A step_fn that knows the references: one-hot logits of the next target character."""
    answers = {en: de for s in SPLITS for en, de in task.pairs(s)}

    targets: dict[tuple[int, ...], list[int]] = {}  # src ids -> the reference's ids + EOS

    def step_fn(src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        rows = []
        for key in map(tuple, src.tolist()):
            if key not in targets:
                targets[key] = task.vocab.encode(answers[task.vocab.decode(key)], eos=True)
            row = targets[key][: tgt_in.shape[1]]
            rows.append(row + [EOS] * (tgt_in.shape[1] - len(row)))
        one_hot = torch.nn.functional.one_hot(torch.tensor(rows), len(task.vocab))
        return one_hot.float().transpose(1, 2)  # (B, V, T)

    return answers, step_fn


def test_greedy_decode_and_generation_metrics(task: Translation) -> None:
    answers, step_fn = oracle(task)
    hyps = task.generate(step_fn, "validation", batch_size=50)
    assert hyps == [answers[en] for en, _ in task.pairs("validation")]
    metrics = task.generation_metrics(step_fn, "validation")
    assert metrics["exact_match"] >= 0.99 and metrics["chrf"] >= 99.0
    with pytest.raises(ValueError, match="evaluation split"):
        task.generate(step_fn, "train")


def test_greedy_decode_stops_at_eos_and_max_len() -> None:
    fed: list[list[int]] = []

    def counting(src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        # source 0 emits 5, 6, EOS; source 1 always emits 7 (the rows it is fed, named by
        # their sources: rows that ended are dropped once half the batch has)
        fed.append(src[:, 0].tolist())
        logits = torch.zeros(src.shape[0], 10, tgt_in.shape[1])
        for row, source in enumerate(src[:, 0].tolist()):
            token = [5, 6, EOS][min(tgt_in.shape[1] - 1, 2)] if source == 0 else 7
            logits[row, token, -1] = 1.0
        return logits

    src = torch.tensor([[0, 0, 0], [1, 1, 1]])
    assert greedy_decode(counting, src, 6) == [[5, 6], [7, 7, 7, 7, 7, 7]]
    assert fed == [[0, 1]] * 3 + [[1]] * 3  # one row left of two: fed alone

    def wrong(src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        return torch.zeros(2, tgt_in.shape[1], 10)

    with pytest.raises(ValueError, match=r"logits \(B, V, T\)"):
        greedy_decode(wrong, torch.zeros(2, 3, dtype=torch.long), 4)


def test_greedy_decode_feeds_fewer_rows_as_they_end_and_translates_the_same() -> None:
    """Source k emits k tokens, then EOS: rows end one after another; the batch fed halves
    whenever its rows still translating fit in half, and every row's translation is what
    it is decoded alone."""
    sizes: list[int] = []

    def emits_its_length(src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        sizes.append(src.shape[0])
        logits = torch.zeros(src.shape[0], 12, tgt_in.shape[1])
        for row, length in enumerate(src[:, 0].tolist()):
            logits[row, EOS if tgt_in.shape[1] > length else 4 + length % 8, -1] = 1.0
        return logits

    src = torch.arange(8)[:, None].repeat(1, 2)
    together = greedy_decode(emits_its_length, src, 10)
    assert together == [[4 + k % 8] * k for k in range(8)]
    assert sizes == [8, 8, 8, 8, 4, 4, 2, 1]
    alone = [greedy_decode(emits_its_length, src[k : k + 1], 10)[0] for k in range(8)]
    assert alone == together


def test_metrics_and_unigram_baseline(task: Translation) -> None:
    _, tgt_out = next(task.batches("validation", 8))
    uniform = task.metrics(torch.zeros(8, len(task.vocab), tgt_out.shape[1]), tgt_out)
    assert uniform["loss"] == pytest.approx(math.log(len(task.vocab)))
    assert uniform["tokens"] == int((tgt_out != PAD).sum())
    for split in SPLITS:
        baseline = task.unigram_baseline(split)
        assert 0 < baseline < math.log(len(task.vocab)) and math.isfinite(baseline)
    assert task.baseline_metric == "loss"


def test_facade_and_errors(task: Translation) -> None:
    assert isinstance(get_task("translation", seed=0), Translation)
    with pytest.raises(ValueError, match="valid splits: train, validation, test"):
        task.size("dev")
    with pytest.raises(ValueError, match="batch_size"):
        next(task.batches("train", 0))


def test_evaluate_scores_teacher_forcing_and_greedy_decoding(task: Translation) -> None:
    _, step_fn = oracle(task)

    def forward(x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return step_fn(*x)

    full = task.evaluate(forward, batch_size=64)  # the final evaluation: everything
    assert full["accuracy"] == 1.0 and full["tokens"] == sum(
        len(de) + 1 for _, de in task.pairs("validation")
    )
    assert full["chrf"] >= 99.0 and full["exact_match"] >= 0.99  # two names have 2 answers
    assert full["decoded"] == task.size("validation") and full["decode_s"] > 0
    part = task.evaluate(forward, batch_size=64, max_batches=1, decode=16)
    assert part["decoded"] == 16 and part["tokens"] < full["tokens"]
    assert "chrf" not in task.evaluate(forward, batch_size=64, max_batches=1, decode=0)
    subset = task.decode_subset("validation", 16)  # evenly spaced over the sorted split
    assert subset == sorted(set(subset)) and subset[0] == 0
    assert subset[-1] >= 0.9 * task.size("validation")
    assert task.decode_subset("validation", None) == list(range(task.size("validation")))
    with pytest.raises(ValueError, match="pairs=-1 is not valid"):
        task.decode_subset("validation", -1)


def test_decoding_sizes_its_batches_to_the_pairs_in_multiples_of_the_batch(
    task: Translation,
) -> None:
    pairs = (0, 1, 16, 17, 100, 128, 500)
    assert [decode_rows(n, 16) for n in pairs] == [16, 16, 16, 32, 112, 128, 128]
    assert decode_rows(500, 48) == 96 and decode_rows(3, 200) == 200  # a batch at least
    assert DECODE_ROWS == 128
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got 0"):
        decode_rows(4, 0)
    _, step_fn = oracle(task)
    rows: list[int] = []

    def forward(x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        rows.append(x[0].shape[0])
        return step_fn(*x)

    few = task.evaluate(forward, batch_size=8, max_batches=1, decode=4)
    assert few["decoded"] == 4 and max(rows) == 8  # not 128 rows for 4 pairs
    rows.clear()  # (fewer rows once the rows that ended fill half: greedy_decode)
    assert task.evaluate(forward, batch_size=8, max_batches=1, decode=4, decode_batch_size=24)
    assert rows[:2] == [8, 24] and max(rows) == 24


def test_decoding_shared_among_callers_scores_what_one_caller_scores(task: Translation) -> None:
    """Three callers (threads, gathering at a barrier) each decode a third of the pairs with
    their own model, as a pipeline's ranks do with replicas: every caller gets the metrics
    one caller gets decoding every pair."""
    _, oracle_fn = oracle(task)

    def flawed(src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        logits = oracle_fn(src, tgt_in)  # every third source's translation ends early
        cut = (src != PAD).sum(1) % 3 == 0
        if tgt_in.shape[1] > 2:
            logits[cut, :, -1] = torch.nn.functional.one_hot(
                torch.tensor(EOS), len(task.vocab)
            ).float()
        return logits

    def forward(x: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return flawed(*x)

    alone = task.evaluate(forward, batch_size=16, max_batches=2, decode=50)
    assert 0 < alone["exact_match"] < 1
    world, barrier = 3, threading.Barrier(3)
    posted: dict[int, list[str]] = {}
    results: dict[int, dict[str, float]] = {}

    def caller(rank: int) -> None:
        def gather(outputs: list[str]) -> list[list[str]]:
            posted[rank] = outputs
            barrier.wait(timeout=60)
            return [posted[r] for r in range(world)]

        share = DecodeShare(forward, rank, world, gather)
        results[rank] = task.evaluate(forward, batch_size=16, max_batches=2, decode=50, share=share)

    threads = [threading.Thread(target=caller, args=(rank,)) for rank in range(world)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(len(part) for part in posted.values()) == [16, 17, 17]
    for rank in range(world):
        shared = {k: v for k, v in results[rank].items() if k != "decode_s"}
        assert shared == {k: v for k, v in alone.items() if k != "decode_s"}
