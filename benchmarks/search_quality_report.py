"""The JSON and the picture of `search_quality.py`: this run's parts merged over what an
earlier run of other parts wrote, the goal and warm against cold judged on the retrained
models, `proxy_rank.json`'s figures, best-so-far against minutes, and the printed brief.

Why it exists: `search_quality.py` runs the studies (`search_quality_studies.py`) and
retrains their picks; putting the results together is this module's.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from _run import RESULTS
from search_quality_studies import headline_pruning


def merge(
    path: Path,
    run: dict[str, Any],
    studies: dict[str, Any],
    summary: dict[str, Any],
    retrained: dict[str, Any] | None,
    experiment: str,
) -> dict[str, Any]:
    """This run's parts over what an earlier run of other parts left in `path` (each part
    can be run, or re-run, on its own): studies and summaries by key, retrained models by
    the study they were picked from (the seeds with the headline)."""
    old = json.loads(path.read_text()) if path.exists() else {}
    models = old["retrained"] if isinstance(old.get("retrained"), list) else []  # else: v1
    retrain = old.get("retrain") or {}
    if retrained is not None:
        roles = set(retrained["picks"]) | ({None} if "goal" in retrained else set())
        models = [m for m in models if m.get("study") not in roles] + retrained["models"]
        table = {r["model"]: r for r in [*retrain.get("table", []), *retrained["table"]]}
        picks = {**retrain.get("picks", {}), **retrained["picks"]}
        retrain = {
            **retrain,
            **{k: v for k, v in retrained.items() if v is not None},
            "table": list(table.values()),
            "picks": picks,
        }
        retrain.pop("models", None)
    studies = {**old.get("studies", {}), **studies}
    return {
        "runs": [*old.get("runs", []), run],
        "studies": studies,
        "pruning": headline_pruning(studies.get("headline") or studies.get("evolution/0")),
        "summary": {**old.get("summary", {}), **summary},
        "retrained": models,  # the list: name, params, architecture, per-seed figures
        "retrain": retrain,  # the table (mean, sd), the goal, warm against cold
        "proxy": proxy_figures(experiment),
    }


def warm_vs_cold(rows: dict[str, dict[str, Any]], chosen: dict[str, str]) -> dict[str, Any] | None:
    """What the warm (inherited weights) and cold studies picked, judged retrained from
    scratch: per study seed, the pick's validation loss and chrF over the training seeds;
    then the mean over study seeds."""
    out: dict[str, Any] = {}
    for variant in ("warm", "cold"):
        mine = [
            rows[name]
            for role, name in sorted(chosen.items())
            if role.startswith(f"{variant}-") and name in rows
        ]
        if not mine:
            return None
        out[variant] = {
            "picks": [
                {
                    "model": r["model"],
                    "parameters": r["parameters"],
                    "validation_loss_mean": r.get("validation_loss_mean"),
                    "validation_loss_sd": r.get("validation_loss_sd"),
                    "validation_chrf_mean": r.get("validation_chrf_mean"),
                }
                for r in mine
            ],
            "validation_loss_mean": statistics.fmean(r["validation_loss_mean"] for r in mine),
            "validation_chrf_mean": statistics.fmean(
                r.get("validation_chrf_mean", math.nan) for r in mine
            ),
        }
    return out


def goal(rows: dict[str, dict[str, Any]], best_name: str) -> dict[str, Any]:
    """Does the study's best beat both seeds on validation loss and chrF, no larger?"""
    best = rows.get(best_name)
    seeds = [rows[n] for n in ("transformer", "evolved_transformer") if n in rows]
    if best is None or len(seeds) < 2:
        return {"met": None, "why": "no retrained best or seed"}
    checks = {
        "lower_validation_loss": all(
            best["validation_loss_mean"] < s["validation_loss_mean"] for s in seeds
        ),
        "higher_chrf": all(
            best.get("validation_chrf_mean", -1) > s.get("validation_chrf_mean", math.inf)
            for s in seeds
        ),
        "no_more_parameters": all(best["parameters"] <= s["parameters"] for s in seeds),
    }
    return {"met": all(checks.values()), **checks}


def proxy_figures(experiment: str) -> dict[str, Any] | None:
    """`proxy_rank.py`'s figures, when they were measured on `experiment`."""
    path = RESULTS / "proxy_rank.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    if data.get("experiment") != experiment:
        return None
    keys = (
        "kendall_tau",
        "kendall_p",
        "kendall_tau_by_eval_step",
        "kendall_tau_by_rung",
        "trial_budget_steps",
        "full_steps",
        "ranked",
        "mutants",
    )
    return {k: data.get(k) for k in keys}


def plot(runs: dict[str, dict[str, Any]], path: Path, fitness: str) -> None:
    """Best measured so far against minutes: the headline study on the left (`headline`),
    the comparisons (one colour per variant, one line per study seed) on the right; each
    panel its own budget."""
    panels = [
        ("headline", {k: r for k, r in runs.items() if k == "headline"}),
        ("equal wall-clock", {k: r for k, r in runs.items() if k != "headline"}),
    ]
    panels = [(title, chosen) for title, chosen in panels if chosen]
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.4), squeeze=False)
    for ax, (title, chosen) in zip(axes[0], panels, strict=True):
        colours: dict[str, Any] = {}
        for run in chosen.values():
            if not run["curve"]:
                continue
            x = [p[0] for p in run["curve"]] + [run["seconds"] / 60]
            y = [p[1] for p in run["curve"]] + [run["curve"][-1][1]]
            variant = run["variant"]
            line = ax.step(
                x,
                y,
                where="post",
                color=colours.get(variant),
                alpha=0.85,
                label=None if variant in colours else f"{variant}: best measured so far",
            )[0]
            colours.setdefault(variant, line.get_color())
        if title == "headline":
            headline(ax, next(iter(chosen.values())))
        ax.set(
            xlabel="wall-clock minutes",
            title=title,
            ylabel=f"{fitness.replace('_', ' ')} (full budget)",
        )
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def headline(ax: Any, run: dict[str, Any]) -> None:
    """On the headline panel: each seed model's measured fitness as a dashed line, each
    promoted child as its estimate (hollow) joined to its measurement (filled), and a y
    axis on the differences that matter: from just below the best measured to just above
    the best seed model (a seed model above it is named at the top edge)."""
    seeds: dict[str, float] = run.get("seed_models") or {}
    promotions: list[list[float]] = run.get("promotions") or []
    for minutes, estimate, measured in promotions:
        ax.plot([minutes, minutes], [estimate, measured], color="0.6", lw=0.8)
        ax.plot(minutes, estimate, "o", mfc="none", mec="tab:orange", ms=4)
        ax.plot(minutes, measured, "o", color="tab:orange", ms=4)
    if promotions:
        ax.plot([], [], "o", color="tab:orange", ms=4, label="promoted: estimate (o), measured")
    lows = [p[1] for p in run["curve"]] + [p[2] for p in promotions] + list(seeds.values())
    if not lows or not seeds:
        return
    low, top = min(lows), min(seeds.values())
    margin = max(0.005, 0.3 * (top - low))
    bottom, ceiling = low - margin, top + 2 * margin
    ax.set_ylim(bottom, ceiling)
    for name, value in sorted(seeds.items(), key=lambda item: item[1]):
        if value <= ceiling:
            ax.axhline(value, ls="--", lw=1, color="0.35")
            ax.annotate(name, (0, value), xytext=(2, 2), textcoords="offset points", fontsize=7)
        else:
            ax.annotate(
                f"{name} {value:.3f} (above)",
                (0, ceiling),
                xytext=(2, -10),
                textcoords="offset points",
                fontsize=7,
            )


def brief(retrain: dict[str, Any]) -> Any:
    if not retrain:
        return None
    keys = ("validation_loss", "validation_chrf", "test_loss")
    return {
        "goal": retrain.get("goal"),
        "warm_vs_cold": retrain.get("warm_vs_cold"),
        "models": [
            {
                "model": r["model"],
                "parameters": r["parameters"],
                **{
                    k: (round(r.get(f"{k}_mean", math.nan), 4), round(r.get(f"{k}_sd", 0.0), 4))
                    for k in keys
                },
            }
            for r in retrain.get("table", [])
        ],
    }
