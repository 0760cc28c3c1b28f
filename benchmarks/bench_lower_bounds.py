r"""How tight (issue 19, requirement 5; issue 40): best and its lower bound on the settings of issue 40
(the built-in scenario, random batches and Poisson on a convex setting, the GLM Poisson settings) and on
the anchor settings of docs/anchor-table.md (n = 60000, b = 1500, z = 3, learning_rate = 1,
smoothness = 1, strong_convexity = 1 - c; Poisson: add-or-remove with z = 1.5), as declared (no loss
meets those declarations: a per-example strongly convex loss on R^d with gradients <= C) and in three
variants that have exact instances: without the gradient-norm declaration (clipping may be active: G4),
the same contraction as an l2 term outside the clip (G2) and the convex case (c = 1, G1).
docs/derivations/lower-end.md#lower-end; the table is docs/how-tight.md.

The column "moved" compares each row with benchmarks/how_tight_baseline.json, the same rows computed
on the code of issue 40's start (``--baseline LABEL`` writes it, LABEL naming that code; run it there only).

Run: ``.venv/bin/python benchmarks/bench_lower_bounds.py > docs/how-tight.md``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import lastiter_plugins as lp
from lastiter_plugins.scenarios import BUILTIN_SCENARIO

DELTA = 1e-5
SAMPLINGS = ("cyclic", "shuffle_once", "reshuffle", "random_batch", "poisson")
VARIANTS = ("as declared (c = 0.9999)", "clipping may be active", "l2 outside the clip", "convex (c = 1)")
BASELINE = Path(__file__).with_name("how_tight_baseline.json")
#: Relative changes below this are "unchanged" (the lower ends are computed to about 1e-6).
UNCHANGED = 5e-4


def _params(sampling: str, epochs: int, variant: str, c: float = 0.9999) -> dict:
    params = dict(
        dataset_size=60000,
        batch_size=1500,
        noise_multiplier=3.0,
        epochs=epochs,
        learning_rate=1.0,
        smoothness=1.0,
        gradient_norms_within_clip=True,
        sampling=sampling,
    )
    if sampling == "poisson":
        params.update(noise_multiplier=1.5, relation="add_or_remove_one")
    if variant != "convex (c = 1)":
        params["strong_convexity"] = 1.0 - c
    if variant == "clipping may be active":
        del params["gradient_norms_within_clip"]
    if variant == "l2 outside the clip":
        params["l2_outside_clip"] = True
    return params


_BUILTIN = {k: v for k, v in BUILTIN_SCENARIO.items() if k not in ("name", "delta")}
_CONVEX = dict(dataset_size=50000, batch_size=500, noise_multiplier=0.8, steps=1000, learning_rate=1.0, smoothness=1.0)
_CONVEX.update(gradient_norms_within_clip=True)
_GLM = dict(
    dataset_size=450, batch_size=45, noise_multiplier=3.2, sampling="poisson", learning_rate=1 / 0.27,
    smoothness=0.26, strong_convexity=0.01, l2_outside_clip=True, clipped_loss_convex_smooth=True,
)  # fmt: skip


def issue_rows() -> list[tuple[str, dict[str, Any], float]]:
    """(label, parameters, delta) of the settings of issue 40."""
    convex_poisson = dict(_CONVEX, sampling="poisson", relation="add_or_remove_one")
    rows: list[tuple[str, dict[str, Any], float]] = [
        ("built-in scenario (shuffle_once, lam 0.01, D 10, z 4, E 100)", _BUILTIN, 1e-5),
        ("the same, cyclic", dict(_BUILTIN, sampling="cyclic"), 1e-5),
        (
            "random_batch, convex, within the clip (n 50000, b 500, z 0.8, T 1000)",
            dict(_CONVEX, sampling="random_batch"),
            1e-6,
        ),
        ("poisson, convex, add-or-remove (q 0.01, z 0.8, T 1000)", convex_poisson, 1e-6),
    ]
    for epochs in (20, 80, 200):
        for relation in ("add_or_remove_one", "replace_one"):
            label = f"GLM poisson (docs/anchor-table.md), E {epochs}, {relation}"
            rows.append((label, dict(_GLM, epochs=epochs, relation=relation), 1e-5))
    return rows


def anchor_rows() -> list[tuple[str, dict[str, Any], float]]:
    """(label, parameters, delta) of the anchor table, 'declarations | sampling | epochs'."""
    return [
        (f"{variant} | {sampling} | {epochs}", _params(sampling, epochs, variant), DELTA)
        for variant in VARIANTS
        for sampling in SAMPLINGS
        for epochs in (50, 100, 200)
    ]


def _evaluate(params: dict[str, Any], delta: float) -> tuple[lp.EpsilonResult, float]:
    start = time.perf_counter()
    result = lp.epsilon("best", delta, lower_bound=True, **params)
    return result, time.perf_counter() - start


def _change(new: float, old: float) -> float:
    return new / old - 1.0


def _moved(result: lp.EpsilonResult, before: dict[str, float | None] | None) -> str:
    """Which side moved since the baseline, and by how much."""
    if before is None:
        return "new row"
    parts = []
    old_best = before["best"]
    if old_best is not None and abs(_change(result.epsilon, old_best)) > UNCHANGED:
        parts.append(f"best {_change(result.epsilon, old_best):+.0%} ({old_best:.3g} -> {result.epsilon:.3g})")
    old_low, new_low = before["lower"], result.lower_bound
    if old_low is None and new_low is not None:
        parts.append(f"lower: none -> {new_low:.3g}")
    elif old_low is not None and new_low is not None and abs(_change(new_low, old_low)) > UNCHANGED:
        parts.append(f"lower {_change(new_low, old_low):+.0%} ({old_low:.3g} -> {new_low:.3g})")
    return "; ".join(parts) or "-"


def _row(label: str, params: dict[str, Any], delta: float, baseline: dict[str, Any]) -> str:
    r, took = _evaluate(params, delta)
    low = "None" if r.lower_bound is None else f"{r.lower_bound:.3f}"
    ratio = "-" if r.lower_bound is None else f"{r.epsilon / r.lower_bound:.3f}"
    note = r.lower_bound_note.split(", the exact")[0].split(" (clipping and")[0].split(" (cyclic")[0][:110]
    cells = [*label.split(" | "), f"{r.epsilon:.3f} ({r.winner})", low, ratio, _moved(r, baseline.get(label))]
    return "| " + " | ".join([*cells, f"{took:.1f}", note]) + " |"


def write_baseline(code: str) -> None:
    """The rows' (best, lower) on the code this runs on (``code`` names it): run on issue 40's starting code only."""
    rows = {}
    for label, params, delta in issue_rows() + anchor_rows():
        r, _ = _evaluate(params, delta)
        rows[label] = {"best": r.epsilon, "lower": r.lower_bound}
    BASELINE.write_text(json.dumps({"code": code, "rows": rows}, indent=1) + "\n")


def page() -> str:
    """The text of docs/how-tight.md, computed afresh (its seconds column is this run's)."""
    baseline = json.loads(BASELINE.read_text())["rows"]
    lines = [
        "# How tight: best against the exact epsilon of an instance meeting the declarations",
        "",
        "Generated by `.venv/bin/python benchmarks/bench_lower_bounds.py > docs/how-tight.md`.",
        "The worst case over models meeting the declarations lies in [lower bound, best]",
        "(docs/derivations/lower-end.md#lower-end). 'moved': the change since the start of issue 40",
        "(benchmarks/how_tight_baseline.json): which side moved, and by how much. seconds: best with its",
        "lower end. Where no better instance was found, and why: docs/derivations/lower-end.md#lower-side-search.",
        "",
        "## The settings of issue 40",
        "",
        "| setting | best | lower bound | best / lower | moved | seconds | instance or why none |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, params, delta in issue_rows():
        lines.append(_row(label, params, delta, baseline))
    lines += [
        "",
        "## The anchor settings",
        "",
        "Anchor setting of docs/anchor-table.md: n = 60000, b = 1500, z = 3, learning_rate = 1, smoothness = 1,",
        "strong_convexity = 1 - c (Poisson: add-or-remove, z = 1.5); delta = 1e-5. 'as declared' declares gradient",
        "norms <= C with a per-example strongly convex loss on R^d, which no loss meets; 'clipping may be active'",
        "drops that declaration.",
        "",
    ]
    columns = (
        "declarations",
        "sampling",
        "epochs",
        "best",
        "lower bound",
        "best / lower",
        "moved",
        "seconds",
        "instance",
    )
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for label, params, delta in anchor_rows():
        lines.append(_row(label, params, delta, baseline))
    return "\n".join(lines) + "\n"


def main() -> None:
    print(page(), end="")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--baseline"]:
        write_baseline(" ".join(sys.argv[2:]) or "unnamed")
    else:
        main()
