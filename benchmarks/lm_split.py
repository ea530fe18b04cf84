"""A decoder-only language model on 2 ranks: where the layers are cut decides the throughput.

Why it exists (issue 32): in a language model the head (LayerNorm + projection over a
32000-token vocabulary, and its cross-entropy) costs as much as many Transformer blocks, so
the split a user writes for torch.distributed.pipelining (equal blocks per stage, embedding
first, head last) leaves one rank waiting on the other. This measures how much that costs,
how much a brute-force split at layer boundaries wins back, and where this runtime's
`partition="auto"` (and `schedule="auto"`) lands against both and against the bounds.

The model: token embedding + learned positions (one layer), N causal pre-norm Transformer
blocks (N layers), final LayerNorm + vocabulary projection (the head layer); loss =
cross-entropy over the vocabulary. At these sizes the head alone can cost more than all the
other layers together, and then it bounds every cut: whatever the split, the rank that holds
it does more than half the work. So the benchmark also runs the same model with the head cut
finer (`--head-parts K`, default 2; 1 runs only the one-layer head): K layers, the first
applies the LayerNorm and the first 1/K of the projection's rows and passes the carry
(normed hidden, logits part), each next one appends its rows' logits, the last returns the
logits concatenated over the vocabulary (the loss is unchanged). Each part is cut from the
one-layer head built with the same seed and key, so both models compute the same function
from the same initial weights (the JSON records how far apart their first losses are).

Defaults: d_model 256, 4 heads, 8 blocks, vocabulary 32000, sequence 128, batch 8 (the
largest that M = 8 divides with one process's step near 1 s on one thread: batch 16 took
~5.5 s of CPU, measured on a loaded machine), dropout 0.1 in the blocks, SGD; 2 ranks
(CPU, gloo, 1 thread per rank), M = 4 and 8 micro-batches. Data: random token ids from a
seeded generator (the targets are the inputs shifted by one); throughput does not depend on
the values. Every layer comes from a `LayerSpec` built by `build_layer` with seed 0, so
every run starts from the same weights. Per M, timed side by side in the same two
processes, in interleaved rounds (`timed_rounds`), medians over rounds with their spread:

* torch: Schedule1F1B (one stage per rank), ScheduleInterleaved1F1B (4 chunks, rank r holds
  r and r+2) and ScheduleZBVZeroBubble (4 chunks, V: rank 0 holds 0 and 3) with the user's
  split (blocks as equal as possible, embedding in the first chunk, head in the last) and
  with the best splits by brute force: every cut at layer boundaries is scored by its
  slowest rank (then its slowest chunk) on per-layer forward+backward times measured in
  one process on rank 0 (median of a few runs at the micro-batch size); the best
  `--top` are timed and the fastest measured is kept. Each is checked first: one step
  with dropout off must give the single process's loss and gradients;
* torch by hand (issue 41): Schedule1F1B at every 2-way cut of the model that runs every
  run (between the embedding, the blocks and the head), as a user sweeping cuts would;
* ours: `ElasticPipeline(partition="auto", schedule="auto")`, and with partition "auto"
  each of gpipe, 1f1b, zbh1, interleaved_1f1b, zbv and 2bw (which changes the update
  rule), each trained `--correction-steps` steps (12) before it is timed, so that its plan
  is corrected from the stage times it measured (`ElasticOptions.correct_after`, 10); the
  first step's loss is compared with `ReferenceTrainer`'s (ours is exact by construction,
  the repository's tests check gradients);
* one process: the whole model on rank 0 with gradient accumulation (rank 1 idles);
* bounds (computed, not run): one process / 2 (both ranks half the compute, no messages),
  and the best cut at layer boundaries: one process x the slower rank's share of the
  per-layer time under the best 2-way cut (no bubble, no messages); the same for the best
  split into 4 chunks in each torch layout (loop, V), which can place a head cut into parts.

Both models (head as 1 layer, head as K layers) run the above, except that by default
(`--split-head-runs key`) the K-part model runs only ours (auto), torch's brute-force splits,
one process and the bounds (`all`: every run). Per M and model, the JSON says which layer is
the heaviest, its and the head's share of the per-layer time, and whether one layer bounds
every cut (its share > 1/2). `head_granularity` puts the two models side by side: the gain
of the finer head on the best-cut bound from the cut alone (the K-part model's per-layer
times, with the head's parts summed into one layer or not: the same timings, no noise
between models), the ratio of the two models' bounds and measured samples/s, and the gap
between their first losses; `summary_in_words` says it in sentences.

Writes benchmarks/results/lm_split.json and prints a table. The model and its splits are in
`lm_split_model.py`, the runs in `lm_split_runs.py`, the report in `lm_split_report.py`.

    python benchmarks/lm_split.py [--rounds 6] [--ms 4 8] [--batch 8] [--head-parts 2]
        [--split-head-runs key|all] [--correction-steps 12] [--quick] [--out F]
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Literal

import torch
from _run import RESULTS, Clock, first_line, write_json
from _torch_peer import STAGES
from common import on_ranks
from lm_split_model import LAYER_REPEATS, LMConfig
from lm_split_report import head_granularity, print_table, summarize
from lm_split_runs import GRAD_TOLERANCE, LOSS_TOLERANCE, run_all

SplitHeadRuns = Literal["key", "all"]


def _arguments() -> tuple[argparse.Namespace, list[LMConfig]]:
    """The command line, and the models it asks for (head as 1 layer, and as K), checked."""
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    defaults = LMConfig()
    for f in dataclasses.fields(LMConfig):
        if f.name == "head_parts":
            continue
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            type=type(getattr(defaults, f.name)),
            default=getattr(defaults, f.name),
        )
    parser.add_argument("--ms", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument(
        "--steps", type=int, default=1, help="steps per run per round (2bw: one stream of them)"
    )
    parser.add_argument("--top", type=int, default=2, help="brute-force splits timed per schedule")
    parser.add_argument(
        "--head-parts",
        type=int,
        default=2,
        help="also run the model with the head as this many layers (1: only the one-layer head)",
    )
    parser.add_argument(
        "--split-head-runs",
        choices=["key", "all"],
        default="key",
        help="runs of the split-head model: key = ours (auto), torch brute force, one process",
    )
    parser.add_argument(
        "--correction-steps",
        type=int,
        default=12,
        help="steps ours trains before it is timed: its plan is corrected from measured costs "
        "after 10 (ElasticOptions.correct_after)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny model, 1 round")
    parser.add_argument("--out", type=Path, default=RESULTS / "lm_split.json")
    args = parser.parse_args()
    if args.quick:
        args.d_model, args.blocks, args.vocab, args.seq, args.rounds = 64, 2, 1000, 16, 1
    cfg = LMConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(LMConfig)[:-1]})
    cfgs = [cfg]
    if args.head_parts != 1:
        cfgs.append(dataclasses.replace(cfg, head_parts=args.head_parts))
    try:
        for c in cfgs:
            c.check(args.ms)
    except ValueError as error:
        parser.error(str(error))
    return args, cfgs


def _config(
    args: argparse.Namespace,
    cfgs: list[LMConfig],
    models: list[tuple[LMConfig, bool]],
    registry: list[str],
    clock: Clock,
) -> dict[str, Any]:
    """The JSON's `config`: the sizes, the runs, how they were timed and checked."""
    return {
        **dataclasses.asdict(cfgs[0]),
        "head_parts": [c.head_parts for c in cfgs],
        "models": {c.label: {"layers": c.layers, "every_run": full} for c, full in models},
        "microbatches": args.ms,
        "stages": STAGES,
        "threads_per_stage": 1,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "ours_correction_steps_before_timing": args.correction_steps,
        "hand_sweep": "torch Schedule1F1B at every 2-way cut of the head-as-1-layer model "
        "(between the embedding, the blocks and the head), timed in the same rounds",
        "quick": args.quick,
        "optimizer": "SGD lr 1e-3",
        "data": "random token ids from a seeded generator; targets = inputs shifted by one",
        "torch": torch.__version__,
        "our_schedules_registered": registry,
        "check_tolerances": {"loss_abs": LOSS_TOLERANCE, "grad_rel": GRAD_TOLERANCE},
        "brute_force": (
            f"every split at layer boundaries into the schedule's chunks, scored by the "
            f"slowest rank's summed per-layer fwd+bwd time (ties: slowest chunk), per-layer "
            f"times measured alone in one process on rank 0 at the micro-batch size "
            f"(median of {LAYER_REPEATS}); the best {args.top} by score are timed in the "
            f"rounds and the fastest measured (median) correct one is reported"
        ),
        "wall_s": clock.seconds(),
        **clock.load_average(),
    }


def main() -> None:
    args, cfgs = _arguments()
    split_head_runs: SplitHeadRuns = args.split_head_runs
    models = [(c, c.head_parts == 1 or split_head_runs == "all") for c in cfgs]
    clock = Clock()
    result = on_ranks(
        run_all,
        STAGES,
        timeout_s=600.0,
        models=models,
        ms=args.ms,
        rounds=args.rounds,
        steps=args.steps,
        top=args.top,
        correction_steps=args.correction_steps,
    )
    by_model = {
        c.label: summarize(c, args.ms, result["records"][c.label], result["layer_times"][c.label])
        for c in cfgs
    }
    granularity, words = head_granularity(cfgs, by_model, args.ms)
    report = {
        "config": _config(args, cfgs, models, result["registry"], clock),
        "layer_times": result["layer_times"],
        "summary_in_words": words,
        "head_granularity": granularity,
        "summary": {
            label: {k: {kk: vv for kk, vv in v.items() if kk != "runs"} for k, v in by_m.items()}
            for label, by_m in by_model.items()
        },
        "by_model": by_model,
    }
    write_json(args.out, report)
    for label, by_m in by_model.items():
        print(f"\n== {label.replace('_', ' ')}")
        print_table(by_m, result["layer_times"][label])
    print("\n" + "\n".join(words))


if __name__ == "__main__":
    main()
