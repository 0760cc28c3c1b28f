"""The accountant's report: every bound side by side for the steps taken, and the threat model."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

import lastiter_plugins as lp

#: What every number of this adapter protects (printed by the report).
THREAT_MODEL = (
    "Threat model: the last-iterate bounds protect the FINAL model only, after the number of steps fixed in "
    "advance; intermediate checkpoints (and any model saved during training) must not be released. Choosing the "
    "released model by looking at intermediate iterates (a best-validation checkpoint, early stopping that restores "
    "the best weights) or stopping at a data-dependent time is not covered by a last-iterate bound. The composition "
    "rows (the standard baselines) certify every iterate."
)


@dataclasses.dataclass(frozen=True)
class ReportRow:
    bound: str
    relation: str | None
    applies: bool
    epsilon: float | None
    order: float | None
    protects: str
    reasons: tuple[str, ...]  # why it does not apply (for ``best``: which bound attains it)
    reference: str
    proof: str = "proven"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Report:
    """Every bound, side by side, for the steps taken so far."""

    name: str
    delta: float
    steps: int
    sampling: str
    relation: str
    rows: tuple[ReportRow, ...]
    threat_model: str = THREAT_MODEL
    best: str = ""  # str() of the best result, as the core renders it
    advice: str = ""  # when best is a standard baseline: why, and the single changes that would lower it
    tightness: str = ""  # best's lower bound: "the worst case ... lies in [lower, upper]", or why none
    lower_bound: float | None = None  # the exact epsilon of an instance meeting the declarations
    provenance: str = ""  # best's proof: published theorem or this library's derivation, and what published gives

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "delta": self.delta,
            "steps": self.steps,
            "sampling": self.sampling,
            "relation": self.relation,
            "rows": [r.to_dict() for r in self.rows],
            "best": self.best,
            "advice": self.advice,
            "lower_bound": self.lower_bound,
            "tightness": self.tightness,
            "provenance": self.provenance,
            "threat_model": self.threat_model,
        }

    def __str__(self) -> str:
        head = (
            f"accountant {self.name!r}: {self.steps} steps, sampling {self.sampling}, delta {self.delta:g}, "
            f"relation {self.relation}"
        )
        table = [("bound", "relation", "epsilon", "order", "protects", "applies / why not")]
        for r in self.rows:
            eps = "-" if r.epsilon is None else f"{r.epsilon:.4g}"
            order = "-" if r.order is None else f"{r.order:g}"
            why = "yes" if r.applies else r.reasons[0]
            if r.applies and r.reasons:
                why = r.reasons[0]
            elif len(r.reasons) > 1:
                why += f" (+{len(r.reasons) - 1} more)"
            if r.proof != "proven":
                why += f" [{r.proof}]"
            table.append((r.bound, r.relation or "-", eps, order, r.protects if r.applies else "-", why))
        widths = [max(len(row[i]) for row in table) for i in range(5)]
        lines = [head]
        for row in table:
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)) + "  " + row[5])
        if self.best:
            lines.append(f"best: {self.best}")
        if self.tightness:
            lines.append(self.tightness)
        if self.provenance:
            lines.append(self.provenance)
        if self.advice:
            lines.append(self.advice)
        lines.append(self.threat_model)
        return "\n".join(lines)


def build_report(
    name: str,
    config: lp.TrainingConfig,
    assumptions: lp.LossAssumptions,
    delta: float,
    orders: tuple[float, ...] | None,
    *,
    published_only: bool = False,
) -> Report:
    """Render the core's evaluation of every bound for ``config`` (one evaluation path: the core's);
    ``published_only``: best over the bounds whose proof is a published theorem."""
    from lastiter_plugins.evaluation import evaluate_all, published_note

    grid = None if orders is None else np.array(orders)
    rows = []
    for bid, ev in evaluate_all(config, assumptions, delta, grid).items():
        rows.append(
            ReportRow(
                bound=bid,
                relation=None if ev.relation is None else ev.relation.value,
                applies=ev.applies,
                epsilon=ev.epsilon,
                order=ev.order,
                protects=ev.protects.value,
                reasons=tuple(ev.reasons),
                reference=ev.reference,
                proof=str(ev.proof),
            )
        )
    best_text = advice = tightness = provenance = ""
    lower = None
    try:
        best = lp.epsilon(
            lp.BEST,
            delta,
            grid,
            lower_bound=True,
            published_only=published_only,
            config=config,
            assumptions=assumptions,
        )
        rows.append(
            ReportRow(
                lp.BEST,
                best.relation.value,
                True,
                best.epsilon,
                best.order,
                best.protects.value,
                (f"via {best.winner}",),
                best.reference,
                str(best.proof),
            )
        )
        best_text, tightness, lower = str(best), best.tightness_line, best.lower_bound
        provenance = " ".join(
            filter(None, (f"Proof: {best.provenance}.", published_note(best, config, assumptions, grid)))
        )
        if lp.is_standard_baseline(best):
            advice = lp.baseline_note(best, lp.advise(delta, top=3, config=config, assumptions=assumptions))
    except ValueError as exc:
        rows.append(ReportRow(lp.BEST, config.relation.value, False, None, None, "-", (str(exc),), ""))
    sampling, relation = config.sampling.value, config.relation.value
    return Report(
        name,
        delta,
        config.steps,
        sampling,
        relation,
        tuple(rows),
        best=best_text,
        advice=advice,
        tightness=tightness,
        lower_bound=lower,
        provenance=provenance,
    )
