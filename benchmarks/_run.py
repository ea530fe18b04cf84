"""What every benchmark script does around its measurement, written once.

Why it exists: each script parses a command line whose `--out` defaults to a file in
`benchmarks/results/`, records the wall time and the machine's load average before and after
(a busy machine shows in the JSON), turns per-round step times into medians and samples per
second, picks the fastest run of a kind, and writes its JSON. Each script did these by hand;
here they are once. Only the standard library: the harness-only benchmarks and the pure
planner's import it without torch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def first_line(doc: str | None) -> str:
    """A script's description for `--help`: its docstring's first line."""
    return (doc or "").split("\n")[0]


def first_paragraph(doc: str | None) -> str:
    """A script's description for `--help`: its docstring's first paragraph."""
    return (doc or "").split("\n\n")[0]


def rounds_parser(doc: str | None, rounds: int, steps: int, out: str) -> argparse.ArgumentParser:
    """The command line of a benchmark timed in interleaved rounds: `--rounds`, `--steps`
    (steps per run per round) and `--out` (default: `results/<out>`), in that order."""
    parser = argparse.ArgumentParser(description=first_line(doc))
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--out", type=Path, default=RESULTS / out)
    return parser


def write_json(path: Path, document: Any, *, indent: int = 2, newline: bool = False) -> None:
    """`document` as JSON at `path` (its folder made); what JSON cannot hold as text."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=indent, default=str) + ("\n" if newline else ""))


def print_json(document: Mapping[str, Any], keys: Sequence[str], *, indent: int = 2) -> None:
    """The headline of a report: `keys` of `document` as indented JSON."""
    print(json.dumps({key: document[key] for key in keys}, indent=indent, default=str))


class Clock:
    """Wall seconds and the load average (1, 5, 15 minutes) since it was made."""

    def __init__(self) -> None:
        self.load_before = os.getloadavg()
        self.started = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    def load_average(self) -> dict[str, tuple[float, float, float]]:
        """The load average when the clock was made and now, as the JSON records them."""
        return {
            "load_average_1_5_15_before": self.load_before,
            "load_average_1_5_15_after": os.getloadavg(),
        }


def median_rate(times: Sequence[float], batch: int) -> dict[str, float]:
    """Per-round step seconds as their median and the samples per second at that median."""
    median = statistics.median(times)
    return {"median_step_s": median, "samples_per_s": batch / median}


def fastest(
    runs: Mapping[str, Mapping[str, Any]], ok: Callable[[Mapping[str, Any]], bool]
) -> str | None:
    """The key of the run with the most `samples_per_s` among those that have it and pass
    `ok` (ties: the greater key); None when there is none."""
    candidates = [
        (v["samples_per_s"], k) for k, v in runs.items() if "samples_per_s" in v and ok(v)
    ]
    return max(candidates)[1] if candidates else None


def paired_ratio(ours: Sequence[float], peers: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """Ours against the fastest of `peers` round by round: per round r, the peer run whose
    median step is shortest over the *other* rounds, its step in round r over ours in
    round r (> 1: ours faster); the median of those ratios, each, and the peer chosen.

    Paired, a slow spell of the machine in a round lands on both sides; chosen on the other
    rounds, the fastest of many peers is not also the luckiest in the round it is judged
    on (the fastest of ten noisy medians is faster than its run is). `ours` and each peer
    hold one step time per round, the same rounds."""
    rounds = len(ours)
    usable = {k: v for k, v in peers.items() if len(v) == rounds}
    if rounds < 2 or not usable:
        return {"median": math.nan, "per_round": [], "peer_per_round": []}
    ratios, chosen = [], []
    for r in range(rounds):
        best = min(
            usable,
            key=lambda k: (statistics.median([t for i, t in enumerate(usable[k]) if i != r]), k),
        )
        ratios.append(usable[best][r] / ours[r])
        chosen.append(best)
    return {"median": statistics.median(ratios), "per_round": ratios, "peer_per_round": chosen}


def samples_per_s(runs: Mapping[str, Mapping[str, Any]], key: str | None) -> float:
    """The samples per second of run `key` (NaN for no run)."""
    return float(runs[key]["samples_per_s"]) if key is not None else math.nan


def git(folder: Path, *args: str) -> str:
    """Output of a git command in `folder` ('' outside git)."""
    try:
        return subprocess.run(
            ["git", *args], cwd=folder, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def usable_cores() -> list[int]:
    """The cores this process may run on (every core where the platform cannot say)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))
