"""Automatic rebalancing of a heterogeneous stack, live, against the best plan found offline.

The unbalanced stack of `common.uneven_stack` (16 Transformer layers, the first eight with an
8x wider feed-forward block; d_model 256, sequence 64, batch 32, 16 micro-batches, 1F1B)
starts on equal layer counts on 2 stages (CPU gloo, 1 thread per stage) with
`elastic=ElasticOptions(rebalance_every=4)`: after 4 steps the runtime re-plans from the
costs it measured and migrates layers live. Then automatic rebalancing is switched off and,
in interleaved rounds on the same processes (`repartition` between them, so drift of the
machine hits all alike), the following are timed; reported side by side:

* throughput before (equal counts) vs after the rebalance (target >= 1.25x);
* after vs the best split found offline by timing every [k, 16 - k], k = 3..8
  (target >= 0.95);
* bytes moved vs the moved layers' state (parameters, buffers, AdamW moments and steps);
* pause per migration vs bytes / the link bandwidth measured with a large send.

    python benchmarks/rebalance.py [--rounds 3] [--steps 2]
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from _run import print_json, rounds_parser, write_json
from common import (
    UNEVEN_BATCH,
    UNEVEN_LAYERS,
    UNEVEN_MICROBATCHES,
    batch,
    on_ranks,
    uneven_config,
    uneven_stack,
)

from pipeline import ElasticOptions, ElasticPipeline, PlanOptions, StageContext
from pipeline.distributed.triggers import ReplanTriggers

MICROBATCHES, LAYERS, EVERY = UNEVEN_MICROBATCHES, UNEVEN_LAYERS, 4
EQUAL = [LAYERS // 2, LAYERS - LAYERS // 2]
OFFLINE_SPLITS = range(3, 9)  # stage 0 sizes tried offline
OPTIMIZER = functools.partial(torch.optim.AdamW, lr=1e-4)


def step_times(pipe: ElasticPipeline, steps: int) -> list[float]:
    x, y = batch(size=UNEVEN_BATCH)
    times = []
    for _ in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        pipe.train_step(x, y)
        times.append(time.perf_counter() - t0)
    return times


def link_bandwidth(n_bytes: int = 64 << 20) -> float:
    """Bytes per second of one gloo send from stage 0 to stage 1 (median of 3)."""
    buf = torch.empty(n_bytes, dtype=torch.uint8)
    runs = []
    for _ in range(3):
        dist.barrier()
        t0 = time.perf_counter()
        if dist.get_rank() == 0:
            dist.send(buf, 1)
        elif dist.get_rank() == 1:
            dist.recv(buf, 0)
        dist.barrier()
        runs.append(time.perf_counter() - t0)
    return n_bytes / statistics.median(runs)


def moved_state_bytes(pipe: ElasticPipeline, keys: set[str]) -> int:
    """Parameters, buffers and optimizer state (all tensors) of the layers in `keys`."""
    state = pipe.optimizer.state if pipe.optimizer is not None else {}
    total = 0
    for key, module in pipe.layers.items():
        if key in keys:
            total += sum(v.numel() * v.element_size() for v in module.state_dict().values())
            total += sum(
                v.numel() * v.element_size()
                for p in module.parameters()
                for v in state.get(p, {}).values()
                if torch.is_tensor(v)
            )
    totals: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(totals, total)
    return sum(totals)


def run(ctx: StageContext, rounds: int, steps: int) -> dict[str, Any]:
    pipe = ElasticPipeline(
        uneven_stack(),
        optimizer=OPTIMIZER,
        loss_fn=F.mse_loss,
        n_microbatches=MICROBATCHES,
        planning=PlanOptions(partition=EQUAL),
        elastic=ElasticOptions(rebalance_every=EVERY),
    )
    during = step_times(pipe, EVERY)  # the 4th step ends with the automatic rebalance
    migration = pipe.migrations[-1] if pipe.migrations else None
    moved = {key for key, _, _ in migration.moved} if migration else set()
    state_bytes = moved_state_bytes(pipe, moved)
    assert pipe.plan is not None
    rebalanced = (list(pipe.sizes), list(pipe.plan.actions))
    pipe.triggers = ReplanTriggers()  # from here on the benchmark picks the partitions
    configs: dict[str, tuple[list[int], list[str] | None]] = {
        "before": (EQUAL, None),
        "after": rebalanced,
        **{f"offline_{k}": ([k, LAYERS - k], None) for k in OFFLINE_SPLITS},
    }
    seconds: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(rounds):  # interleaved: every configuration once per round
        for name, (sizes, actions) in configs.items():
            pipe.repartition(sizes, actions)
            step_times(pipe, 1)  # warm-up on this partition
            seconds[name] += step_times(pipe, steps)
    out = {
        "seconds": seconds,
        "during_s": during,
        "rebalanced_sizes": rebalanced[0],
        "migration": None if migration is None else vars(migration),
        "moved_state_bytes": state_bytes,
        "bandwidth": link_bandwidth(),
        "events": [e.to_dict() for e in pipe.events if e.kind in ("replan", "migration")][:2],
    }
    pipe.close()
    return out


def main() -> None:
    args = rounds_parser(__doc__, rounds=3, steps=2, out="rebalance.json").parse_args()
    r = on_ranks(run, rounds=args.rounds, steps=args.steps)
    med = {name: statistics.median(t) for name, t in r["seconds"].items()}
    before, after = med["before"], med["after"]
    offline = {int(name.split("_")[1]): t for name, t in med.items() if name.startswith("offline")}
    best_k, best = min(offline.items(), key=lambda kv: kv[1])
    m = r["migration"]
    report = {
        "config": {
            **uneven_config(),
            "rebalance_every": EVERY,
            "start": EQUAL,
            "rounds": args.rounds,
            "steps_per_round": args.steps,
        },
        "rebalanced_sizes": r["rebalanced_sizes"],
        "median_step_s": {"before": before, "after": after, "best_offline": best},
        "best_offline_sizes": [int(best_k), LAYERS - int(best_k)],
        "offline_step_s": offline,
        "samples_per_s": {
            "before": UNEVEN_BATCH / before,
            "after": UNEVEN_BATCH / after,
            "best_offline": UNEVEN_BATCH / best,
        },
        "step_s_while_training_before_rebalance": r["during_s"],
        "per_round_step_s": r["seconds"],
        "throughput_after_vs_before": before / after,
        "throughput_after_vs_best_offline": best / after,
        "migration": m,
        "bytes_moved": None if m is None else m["bytes_moved"],
        "moved_layers_state_bytes": r["moved_state_bytes"],
        "link_bandwidth_bytes_per_s": r["bandwidth"],
        "pause_s": None if m is None else m["pause_s"],
        "bytes_over_bandwidth_s": None if m is None else m["bytes_moved"] / r["bandwidth"],
        "targets": {"after_vs_before": 1.25, "after_vs_best_offline": 0.95},
        "events": r["events"],
    }
    write_json(args.out, report)
    keys = (
        "rebalanced_sizes",
        "best_offline_sizes",
        "median_step_s",
        "throughput_after_vs_before",
        "throughput_after_vs_best_offline",
        "bytes_moved",
        "moved_layers_state_bytes",
        "pause_s",
        "bytes_over_bandwidth_s",
    )
    print_json(report, keys)


if __name__ == "__main__":
    main()
