"""How long a user's 100,000-pair corpus takes to become a task (issue 43: under 30 s here).

A study on one's own data starts by reading the file, cleaning and splitting it and training
its subword vocabulary on the training split (`task=corpus`, `nas.tasks.corpus`). This
measures that on real sentences: the English->German pairs of the system's gettext catalogs
(`task=messages`), two at a time joined into one pair (drawn with a seeded RNG until
`--pairs` distinct pairs), written as a TSV. Each round times, on that file:

* `read`: `read_corpus` alone (parse, clean, deduplicate);
* `corpus_<tokenizer>`: the whole `Corpus` task with that tokenizer (read, split, vocabulary
  trained on the training split, every split encoded), for bpe, unigram and chars.

Medians over `--rounds`. Run it alone on an idle machine: the JSON records the load
average before and after.

    python benchmarks/corpus_load.py [--pairs 100000] [--vocab-size 8000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _run import Clock, first_paragraph, write_json

from nas.tasks import Corpus, Messages, TokenizerOptions
from nas.tasks.corpus_files import read_corpus
from nas.tasks.tokenizing import TokenizerName

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "corpus_load.json"
TOKENIZERS: tuple[TokenizerName, ...] = ("bpe", "unigram", "chars")


def write_corpus(path: Path, pairs: int, seed: int) -> dict[str, Any]:
    """`pairs` distinct pairs of two joined catalog sentences each, as a TSV at `path`."""
    messages = Messages(tokenization=TokenizerOptions("chars"))
    sentences = [
        pair for split in ("train", "validation", "test") for pair in messages.pairs(split)
    ]
    rng, chosen = random.Random(seed), set[tuple[str, str]]()
    while len(chosen) < pairs:
        (a, b), (c, d) = rng.sample(sentences, 2)
        chosen.add((f"{a} {c}", f"{b} {d}"))
    rows = sorted(chosen)
    rng.shuffle(rows)
    path.write_text("".join(f"{src}\t{tgt}\n" for src, tgt in rows), encoding="utf-8")
    return {"sentences": len(sentences), "bytes": path.stat().st_size}


def timed(work: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = work()
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=first_paragraph(__doc__))
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    clock = Clock()
    folder = Path(tempfile.mkdtemp(prefix="corpus_load_"))
    path = folder / "pairs.tsv"
    source = write_corpus(path, args.pairs, seed=0)
    seconds: dict[str, list[float]] = {"read": [], **{f"corpus_{t}": [] for t in TOKENIZERS}}
    facts: dict[str, Any] = {}
    for _ in range(args.rounds):
        took, read = timed(lambda: read_corpus(path))
        seconds["read"].append(took)
        facts["kept"] = read.counts["kept"]
        for tokenizer in TOKENIZERS:
            size = None if tokenizer == "chars" else args.vocab_size
            took, task = timed(
                lambda t=tokenizer, v=size: Corpus(
                    path, tokenization=TokenizerOptions(t, vocab_size=v)
                )
            )
            seconds[f"corpus_{tokenizer}"].append(took)
            facts[tokenizer] = {
                "vocab": len(task.vocab),
                "max_length": task.max_length,
                "pairs": {split: task.size(split) for split in ("train", "validation", "test")},
            }
    document = {
        "pairs": args.pairs,
        "vocab_size": args.vocab_size,
        "rounds": args.rounds,
        "source": source,
        "median_s": {name: statistics.median(values) for name, values in seconds.items()},
        "seconds": seconds,
        "tasks": facts,
        **clock.load_average(),
    }
    write_json(args.out, document, indent=1, newline=True)
    print(json.dumps({"median_s": document["median_s"], "tasks": facts}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
