"""What checkpoints cost: save and load time and size against the state's bytes, and the
training time lost to `CheckpointOptions(every=100)` against no checkpoints.

The 8-layer Transformer stack of throughput.py (d_model 256, 4 heads, sequence 64, batch
32, 8 micro-batches, 1F1B) on 2 stages (CPU, gloo, 1 thread per stage), Adam (two moments
per parameter, so the state is about 3x the weights). In one launch:

* save: `pipe.save_checkpoint(folder)` timed barrier to barrier, and the folder's bytes on
  disk against the state's bytes (parameters, buffers, optimizer state);
* load: constructing a pipeline with `resume_from=` against constructing it without (the
  difference is the load: finding, checking and reading the shards, putting them in place);
* overhead: two pipelines in the same processes, one saving every `--every` steps (keeping
  one checkpoint) and one not, trained in interleaved rounds of `--steps` steps.

Every number is a median over `--rounds` rounds. Prints JSON and writes it to
benchmarks/results/checkpoint.json.

    python benchmarks/checkpoint.py [--rounds 3] [--steps 200] [--every 100]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _run import RESULTS, first_line, print_json, write_json
from common import barrier_timed, on_ranks

from pipeline import CheckpointOptions, ElasticPipeline, PlanOptions, StageContext
from pipeline.local.models import transformer_stack
from pipeline.pure.partition import equal_sizes

HEADS, SEQ, STAGES = 4, 64, 2
ADAM = functools.partial(torch.optim.Adam, lr=1e-4)


def state_bytes(pipe: ElasticPipeline) -> dict[str, int]:
    """Parameters, buffers and optimizer state of every rank, in bytes."""
    mine = torch.zeros(3, dtype=torch.int64)
    for module in pipe.layers.values():
        mine[0] += sum(p.numel() * p.element_size() for p in module.parameters())
        mine[1] += sum(b.numel() * b.element_size() for b in module.buffers())
    for optimizer in pipe.optimizers:
        for state in optimizer.state.values():
            mine[2] += sum(
                v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v)
            )
    dist.all_reduce(mine)
    return dict(zip(("parameters", "buffers", "optimizer"), (int(v) for v in mine), strict=True))


def _save_and_load(
    make: Callable[..., ElasticPipeline], pipe: ElasticPipeline, target: Path, rounds: int
) -> dict[str, list[float]]:
    """Per round: saving `pipe` to `target`, building a pipeline that resumes from it, and
    building a fresh one (the construction the resume includes)."""
    save_s, load_s, build_s = [], [], []
    for _ in range(rounds):
        save_s.append(barrier_timed(lambda: pipe.save_checkpoint(target))[0])
        seconds, resumed = barrier_timed(lambda: make(CheckpointOptions(resume_from=target)))
        load_s.append(seconds)
        resumed.close()
        seconds, fresh = barrier_timed(make)
        build_s.append(seconds)
        fresh.close()
    return {"save_s": save_s, "load_s": load_s, "build_s": build_s}


def _training(
    make: Callable[..., ElasticPipeline],
    xy: tuple[torch.Tensor, torch.Tensor],
    args: argparse.Namespace,
    folder: Path,
) -> tuple[dict[str, list[float]], int]:
    """Seconds per step without checkpoints and with one every `args.every` steps, in
    interleaved rounds; and how many checkpoints were kept."""
    plain = make()
    saving = make(CheckpointOptions(directory=folder / "auto", every=args.every, keep_last=1))
    step_s: dict[str, list[float]] = {"none": [], f"every_{args.every}": []}
    for p in (plain, saving):
        for _ in range(2):
            p.train_step(*xy)

    def train(p: ElasticPipeline) -> None:
        for _ in range(args.steps):
            p.train_step(*xy)

    for _ in range(args.rounds):
        for name, p in zip(step_s, (plain, saving), strict=True):
            seconds, _ = barrier_timed(functools.partial(train, p))
            step_s[name].append(seconds / args.steps)
    saves = len([e for e in (folder / "auto").iterdir() if not e.name.startswith(".")])
    plain.close()
    saving.close()
    return step_s, saves


def run(ctx: StageContext, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    specs = transformer_stack(args.layers, args.d_model, HEADS, dropout=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, SEQ, args.d_model, generator=g)
    y = torch.randn(args.batch, SEQ, args.d_model, generator=g)

    def make(checkpoint: CheckpointOptions | None = None) -> ElasticPipeline:
        return ElasticPipeline(
            specs,
            optimizer=ADAM,
            loss_fn=F.mse_loss,
            schedule="1f1b",
            n_microbatches=args.microbatches,
            planning=PlanOptions(partition=equal_sizes(args.layers, STAGES)),
            checkpoint=checkpoint,
        )

    pipe = make()
    for _ in range(2):  # Adam's state exists after a step
        pipe.train_step(x, y)
    target = folder / "bench"
    times = _save_and_load(make, pipe, target, args.rounds)
    on_disk = sum(p.stat().st_size for p in target.iterdir())
    state = state_bytes(pipe)
    pipe.close()
    step_s, saves = _training(make, (x, y), args, folder)
    return {
        **times,
        "bytes_on_disk": on_disk,
        "state_bytes": state,
        "step_s": step_s,
        "checkpoints_kept": saves,
    }


def _report(args: argparse.Namespace, raw: dict[str, Any]) -> dict[str, Any]:
    """Medians, rates and the training overhead from the rounds' raw figures."""
    med = {k: statistics.median(raw[k]) for k in ("save_s", "load_s", "build_s")}
    state = sum(raw["state_bytes"].values())
    none, every = (statistics.median(v) for v in raw["step_s"].values())
    load_only = med["load_s"] - med["build_s"]
    return {
        "config": {
            "layers": args.layers,
            "d_model": args.d_model,
            "heads": HEADS,
            "seq": SEQ,
            "batch": args.batch,
            "microbatches": args.microbatches,
            "stages": STAGES,
            "schedule": "1f1b",
            "optimizer": "Adam",
            "threads_per_stage": 1,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
            "every": args.every,
            "torch": torch.__version__,
        },
        "state_bytes": {**raw["state_bytes"], "total": state},
        "bytes_on_disk": raw["bytes_on_disk"],
        "disk_over_state": raw["bytes_on_disk"] / state,
        "median_s": {
            "save": med["save_s"],
            "resume_construction": med["load_s"],
            "plain_construction": med["build_s"],
            "load": load_only,
        },
        "MB_per_s": {
            "save": state / med["save_s"] / 1e6,
            "load": state / max(load_only, 1e-9) / 1e6,
        },
        "training": {
            "median_step_s_none": none,
            f"median_step_s_every_{args.every}": every,
            "overhead": every / none - 1,
            "save_s_per_step_amortized": med["save_s"] / args.every,
            "checkpoints_kept": raw["checkpoints_kept"],
        },
        "per_round": {k: raw[k] for k in ("save_s", "load_s", "build_s", "step_s")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=first_line(__doc__))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="training steps per round")
    parser.add_argument("--every", type=int, default=100, help="CheckpointOptions.every")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--folder", type=Path, default=None, help="where to write (a temp dir)")
    parser.add_argument("--out", type=Path, default=RESULTS / "checkpoint.json")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        raw = on_ranks(run, STAGES, args=args, folder=Path(tmp))
    report = _report(args, raw)
    write_json(args.out, report)
    print_json(report, ("state_bytes", "median_s", "training"))


if __name__ == "__main__":
    main()
