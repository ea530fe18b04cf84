"""The report of `lm_split.py`: samples per second, the bests, the bounds and the ratios,
where the per-layer time sits, the two head granularities side by side, in words and as a
table.

Why it exists: `lm_split.py` is the entry point and `lm_split_runs.py` measures; turning
the per-round step times into the JSON's `summary`, `by_model` and `head_granularity` is
its own concern.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from _run import fastest, median_rate, paired_ratio, samples_per_s
from _torch_peer import chunks_of
from lm_split_model import LMConfig, best_splits, rank_times
from lm_split_runs import TORCH_SCHEDULES

LAYOUTS = ("single", "loop", "v")  # the bounds' chunk layouts (see `chunks_of`)


def _correct(v: Mapping[str, Any]) -> bool:
    return v["kind"] == "torch" and bool(v.get("check", {}).get("correct"))


def best_cuts(per_layer: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Per chunk layout: the best split by per-layer time and its slower rank's share."""
    out = {}
    for layout in LAYOUTS:
        if len(per_layer) >= chunks_of(layout, 0)[0]:
            sizes = best_splits(per_layer, layout, 1)[0]
            share = max(rank_times(sizes, layout, per_layer)) / sum(per_layer)
            out[layout] = {"chunk_sizes": sizes, "slower_rank_share": share}
    return out


def cut_analysis(cfg: LMConfig, lt: dict[str, Any]) -> dict[str, Any]:
    """Where the per-layer time sits (shares of its sum, i.e. of one process's step without
    the optimizer): the heaviest layer, the head, and the best split in each chunk layout;
    for a head in parts, also with the parts' times summed into one layer (the same
    timings, so the difference is the cut's alone, free of timing noise between models)."""
    per_layer, names = lt["times_s"], lt["layer_names"]
    total = sum(per_layer)
    top = max(range(len(per_layer)), key=per_layer.__getitem__)
    head = sum(per_layer[cfg.blocks + 1 :])
    merged = best_cuts([*per_layer[: cfg.blocks + 1], head]) if cfg.head_parts > 1 else None
    return {
        "heaviest_layer": names[top],
        "heaviest_layer_share": per_layer[top] / total,
        "one_layer_bounds_every_cut": per_layer[top] > total - per_layer[top],
        "head_layers": names[cfg.blocks + 1 :],
        "head_share": head / total,
        "head_over_half": head > total - head,
        "head_time_over_mean_block_time": head
        / statistics.mean(per_layer[1 : cfg.blocks + 1] or [math.nan]),
        "best_cut_by_layout": best_cuts(per_layer),
        "best_cut_by_layout_head_as_one_layer": merged,
    }


def _rates(batch: int, runs: Mapping[str, dict[str, Any]]) -> None:
    """Each timed run's median step, samples per second, their range and spread, in place."""
    for rec in runs.values():
        if times := rec.get("per_round_step_s"):
            rec |= median_rate(times, batch)
            rec["samples_per_s_min_max"] = [batch / max(times), batch / min(times)]
            rec["spread"] = (max(times) - min(times)) / rec["median_step_s"]


def _where_the_time_sits(
    cfg: LMConfig, m: int, single_s: float, layers: dict[str, Any]
) -> dict[str, Any]:
    """One process, the head's share of its step, the bounds and the best cuts at M = m."""
    cuts = cut_analysis(cfg, layers)
    shares = {k: v["slower_rank_share"] for k, v in cuts["best_cut_by_layout"].items()}
    chunked = min((v for k, v in shares.items() if k != "single"), default=math.nan)
    return {
        "one_process_samples_per_s": cfg.batch / single_s,
        "single_process_loss_dropout_off": layers["ref_loss"],
        "head_share_of_one_process_step": m * sum(layers["times_s"][cfg.blocks + 1 :]) / single_s,
        "bounds_samples_per_s": {
            "half_of_one_process": 2 * cfg.batch / single_s,
            "best_cut_at_layer_boundaries": cfg.batch / (single_s * shares["single"]),
            "best_cut_at_layer_boundaries_4_chunks": cfg.batch / (single_s * chunked),
        },
        "best_2way_cut": cuts["best_cut_by_layout"]["single"]["chunk_sizes"],
        "best_2way_cut_slower_share": shares["single"],
        "cuts": cuts,
    }


def _bests(runs: dict[str, dict[str, Any]]) -> dict[str, str | None]:
    """The fastest run of each kind that counts (torch's: checked correct)."""
    return {
        "torch_user_split": fastest(runs, lambda v: _correct(v) and v["user_split"]),
        "torch_brute_force": fastest(
            runs, lambda v: _correct(v) and v["brute_force_rank"] is not None
        ),
        "torch_1f1b_hand_swept": fastest(runs, lambda v: _correct(v) and v["hand_swept"]),
        "torch_1f1b_equal_split": fastest(
            runs, lambda v: _correct(v) and v["user_split"] and v["layout"] == "single"
        ),
        "ours_auto": "ours_auto" if "samples_per_s" in runs.get("ours_auto", {}) else None,
        "ours_best_exact": fastest(runs, lambda v: v["kind"] == "ours" and v["exact"]),
    }


def _per_schedule(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, str | None]]:
    """Per torch schedule: its fastest correct run on the user's and a brute-force split."""
    out = {}
    for name in TORCH_SCHEDULES:
        of = {k: v for k, v in runs.items() if k.startswith(f"torch_{name}_")}
        user = fastest(of, lambda v: _correct(v) and v["user_split"])
        found = fastest(of, lambda v: _correct(v) and v["brute_force_rank"] is not None)
        out[name] = {"user_split": user, "brute_force_fastest_measured": found}
    return out


def _ours_auto_against(
    runs: dict[str, dict[str, Any]], best: dict[str, str | None], bounds: dict[str, float]
) -> dict[str, Any]:
    """The bests' samples per second and ours (auto) over each of them and the bounds."""
    sps = {k: samples_per_s(runs, v) for k, v in best.items()}
    auto = runs.get("ours_auto", {})
    return {
        "best": best,
        "best_samples_per_s": sps,
        "torch_per_schedule": _per_schedule(runs),
        "ours_auto_chose": {k: auto.get(k) for k in ("chosen_schedule", "partition")},
        "ours_auto_vs_torch_best_user_split": sps["ours_auto"] / sps["torch_user_split"],
        "ours_auto_vs_torch_best_brute_force": sps["ours_auto"] / sps["torch_brute_force"],
        "ours_auto_vs_torch_1f1b_best_hand_swept": sps["ours_auto"] / sps["torch_1f1b_hand_swept"],
        "ours_auto_vs_torch_1f1b_equal_split": sps["ours_auto"] / sps["torch_1f1b_equal_split"],
        "torch_1f1b_best_hand_swept_cut": runs.get(best["torch_1f1b_hand_swept"] or "", {}).get(
            "chunk_sizes"
        ),
        "ours_auto_vs_torch_1f1b_paired_by_round": _paired(runs, best),
        "ours_auto_vs_best_cut_bound": sps["ours_auto"] / bounds["best_cut_at_layer_boundaries"],
        "ours_auto_vs_half_of_one_process": sps["ours_auto"] / bounds["half_of_one_process"],
        "runs": runs,
    }


def _paired(runs: dict[str, dict[str, Any]], best: dict[str, str | None]) -> dict[str, Any]:
    """Ours (auto) against torch 1F1B round by round (`_run.paired_ratio`): against the
    hand-swept cut fastest on the other rounds, and against the equal split."""
    ours = runs.get("ours_auto", {}).get("per_round_step_s")
    if not ours:
        return {}
    swept = {
        k: v["per_round_step_s"]
        for k, v in runs.items()
        if _correct(v) and v["hand_swept"] and "per_round_step_s" in v
    }
    equal = best["torch_1f1b_equal_split"]
    return {
        "hand_swept": paired_ratio(ours, swept),
        "equal_split": paired_ratio(ours, {equal: runs[equal]["per_round_step_s"]})
        if equal is not None
        else {},
    }


def summarize(
    cfg: LMConfig, ms: Sequence[int], records: dict[str, Any], layers: dict[str, Any]
) -> dict[str, Any]:
    """Per M: samples/s per run, the bests, the bounds and ours(auto)'s ratios to them."""
    out: dict[str, Any] = {}
    for m in ms:
        mine = {k[: -len(f"_M{m}")]: v for k, v in records.items() if k.endswith(f"_M{m}")}
        _rates(cfg.batch, mine)
        single_s = mine["single_process"]["median_step_s"]
        res = _where_the_time_sits(cfg, m, single_s, layers[f"M{m}"])
        out[f"M{m}"] = res | _ours_auto_against(mine, _bests(mine), res["bounds_samples_per_s"])
    return out


def _model_row(res: dict[str, Any]) -> dict[str, Any]:
    cuts, sps = res["cuts"], res["best_samples_per_s"]
    return {
        **{k: cuts[k] for k in ("heaviest_layer", "heaviest_layer_share")},
        **{k: cuts[k] for k in ("one_layer_bounds_every_cut", "head_share", "head_over_half")},
        "head_share_of_one_process_step": res["head_share_of_one_process_step"],
        **{
            f"best_cut_slower_share_by_layout{tail}": {
                k: v["slower_rank_share"] for k, v in (cuts[f"best_cut_by_layout{tail}"]).items()
            }
            for tail in ("", "_head_as_one_layer")
            if cuts[f"best_cut_by_layout{tail}"] is not None
        },
        "bounds_samples_per_s": res["bounds_samples_per_s"],
        "one_process_samples_per_s": res["one_process_samples_per_s"],
        "ours_auto_samples_per_s": sps["ours_auto"],
        "torch_brute_force_samples_per_s": sps["torch_brute_force"],
        "torch_1f1b_hand_swept_samples_per_s": sps["torch_1f1b_hand_swept"],
        "torch_1f1b_equal_split_samples_per_s": sps["torch_1f1b_equal_split"],
        "torch_1f1b_best_hand_swept_cut": res["torch_1f1b_best_hand_swept_cut"],
        "ours_auto_partition": res["ours_auto_chose"]["partition"],
        "ours_auto_paired_by_round": {
            k: v.get("median", math.nan)
            for k, v in res["ours_auto_vs_torch_1f1b_paired_by_round"].items()
        },
    }


def _sentence(m: int, label: str, row: dict[str, Any]) -> str:
    b = row["bounds_samples_per_s"]
    shares = row["best_cut_slower_share_by_layout"]
    chunked = min((v for k, v in shares.items() if k != "single"), default=math.nan)
    over = "more" if row["head_over_half"] else "less"
    heavy = f"{row['heaviest_layer']}, {row['heaviest_layer_share']:.0%}"
    return (
        f"M{m}, {label.replace('_', ' ')}: the head is {row['head_share']:.0%} of the per-layer "
        f"time ({row['head_share_of_one_process_step']:.0%} of the one-process step), {over} "
        "than all other layers together; "
        + (
            f"one layer ({heavy}) bounds every cut"
            if row["one_layer_bounds_every_cut"]
            else f"no single layer bounds every cut (heaviest: {heavy})"
        )
        + f". The best 2-way cut leaves {shares['single']:.0%} on the slower rank (bound "
        f"{b['best_cut_at_layer_boundaries']:.1f} samples/s), the best 4-chunk cut {chunked:.0%} "
        f"(bound {b['best_cut_at_layer_boundaries_4_chunks']:.1f}); measured: ours (auto) "
        f"{row['ours_auto_samples_per_s']:.1f}, torch brute force "
        f"{row['torch_brute_force_samples_per_s']:.1f}, one process "
        f"{row['one_process_samples_per_s']:.1f} samples/s." + _swept_sentence(row)
    )


def _swept_sentence(row: dict[str, Any]) -> str:
    """Ours against torch 1F1B's hand sweep (only the model every run ran has one)."""
    swept, equal = (row[f"torch_1f1b_{k}_samples_per_s"] for k in ("hand_swept", "equal_split"))
    if not math.isfinite(swept):
        return ""
    ours = row["ours_auto_samples_per_s"]
    return (
        f" Against torch 1F1B: the best hand-swept cut {row['torch_1f1b_best_hand_swept_cut']} "
        f"{swept:.2f} samples/s, the equal split {equal:.2f}; ours (auto, cut "
        f"{row['ours_auto_partition']} after its measured correction) x{ours / swept:.3f} and "
        f"x{ours / equal:.3f}" + _paired_words(row["ours_auto_paired_by_round"]) + "."
    )


def _paired_words(paired: dict[str, float]) -> str:
    if not paired:
        return ""
    return (
        f"; paired by round (the cut chosen on the other rounds): "
        f"x{paired.get('hand_swept', math.nan):.3f} and x{paired.get('equal_split', math.nan):.3f}"
    )


def head_granularity(
    cfgs: Sequence[LMConfig], by_model: dict[str, Any], ms: Sequence[int]
) -> tuple[dict[str, Any], list[str]]:
    """Per M: the models (head as 1 layer, as K) side by side, with the finer head's gains
    (its number over the one-layer head's), and the same in sentences."""
    out: dict[str, Any] = {}
    words = []
    for m in ms:
        row = {c.label: _model_row(by_model[c.label][f"M{m}"]) for c in cfgs}
        words += [_sentence(m, c.label, row[c.label]) for c in cfgs]
        if len(cfgs) == 2:
            one, fine = (row[c.label] for c in cfgs)
            shares = [  # the K-part model's timings, its head summed into one layer or not
                fine[f"best_cut_slower_share_by_layout{tail}"]
                for tail in ("_head_as_one_layer", "")
            ]
            chunked = [min(v for k, v in sh.items() if k != "single") for sh in shares]
            gain = {  # the bound's gain from the cut alone (same timings), then across models
                **{
                    f"best_cut_bound_{k}_same_timings": v / shares[1][k]
                    for k, v in shares[0].items()
                },
                "best_cut_bound_4_chunks_same_timings": chunked[0] / chunked[1],
                **{
                    f"bound_{k}": fine["bounds_samples_per_s"][k] / v
                    for k, v in one["bounds_samples_per_s"].items()
                },
                **{
                    k: fine[f"{k}_samples_per_s"] / one[f"{k}_samples_per_s"]
                    for k in ("one_process", "ours_auto", "torch_brute_force")
                },
            }
            losses = [by_model[c.label][f"M{m}"]["single_process_loss_dropout_off"] for c in cfgs]
            row |= {
                "finer_head_over_one_layer_head": gain,
                "single_process_loss_abs_diff": abs(losses[1] - losses[0]),
            }
            words.append(
                f"M{m}: on the same per-layer times, the head as {cfgs[1].head_parts} layers "
                f"takes the slower rank's share of the best cut from {shares[0]['single']:.0%} "
                f"to {shares[1]['single']:.0%} (2-way) and from {chunked[0]:.0%} to "
                f"{chunked[1]:.0%} (4 chunks): x{gain['best_cut_bound_single_same_timings']:.2f} "
                f"and x{gain['best_cut_bound_4_chunks_same_timings']:.2f} on the best-cut bound "
                f"(the two models' bounds, each with its own timings and one-process time: "
                f"x{gain['bound_best_cut_at_layer_boundaries']:.2f} and "
                f"x{gain['bound_best_cut_at_layer_boundaries_4_chunks']:.2f}); "
                f"measured x{gain['ours_auto']:.2f} for ours (auto), "
                f"x{gain['torch_brute_force']:.2f} for torch brute force, "
                f"x{gain['one_process']:.2f} for one process (the models' first losses differ "
                f"by {row['single_process_loss_abs_diff']:.1e})."
            )
        out[f"M{m}"] = row
    return out, words


def print_table(by_m: dict[str, Any], layers: dict[str, Any]) -> None:
    for label, res in by_m.items():
        lt = layers[label]
        print(
            f"\n{label}: per-layer fwd+bwd ms (one process, micro-batch): "
            + ", ".join(
                f"{n} {1e3 * t:.1f}" for n, t in zip(lt["layer_names"], lt["times_s"], strict=True)
            )
        )
        print(f"  {'run':<34}{'samples/s':>10}{'min':>8}{'max':>8}  note")
        for name, rec in res["runs"].items():
            if "samples_per_s" not in rec:
                print(f"  {name:<34}  error: {rec.get('error', '?')[:70]}")
                continue
            lo, hi = rec["samples_per_s_min_max"]
            note = ""
            if rec["kind"] == "torch":
                tags = ["user split"] if rec["user_split"] else []
                if rec["brute_force_rank"] is not None:
                    tags.append(f"brute force #{rec['brute_force_rank']}")
                note = ", ".join(tags) + ("" if rec["check"]["correct"] else " INCORRECT")
            elif rec["kind"] == "ours":
                note = (
                    f"{rec['chosen_schedule']} {rec['partition']} dloss {rec['loss_abs_diff']:.1e}"
                )
            print(f"  {name:<34}{rec['samples_per_s']:>10.2f}{lo:>8.2f}{hi:>8.2f}  {note}")
        for k, v in res["bounds_samples_per_s"].items():
            print(f"  bound {k}: {v:.2f} samples/s")
        for k in (
            "torch_best_user_split",
            "torch_best_brute_force",
            "best_cut_bound",
            "half_of_one_process",
        ):
            print(f"  ours(auto) / {k}: {res[f'ours_auto_vs_{k}']:.3f}")
