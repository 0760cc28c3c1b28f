"""The accountant's report: the answer first (the number, what it protects, its relation, the winning row and its
provenance, Opacus' own numbers NOT VALID where their assumption fails: :func:`lastiter_plugins.answer_lines`),
then, behind ``report(delta, explain=True)`` or :meth:`Report.explain`, every bound side by side for the steps
taken, the rows that left ``best`` and why, the advice and the threat model."""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._record import Observed

#: What every number of this adapter protects (printed by the report).
THREAT_MODEL = (
    "Threat model: the last-iterate bounds protect the FINAL model only, after the number of steps fixed in "
    "advance; intermediate checkpoints (and any model saved during training) must not be released. Choosing the "
    "released model by looking at intermediate iterates (a best-validation checkpoint, early stopping that restores "
    "the best weights) or stopping at a data-dependent time is not covered by a last-iterate bound. The composition "
    "rows (the standard baselines) certify every iterate."
)
#: Lines of the report are cut or wrapped to this width.
WIDTH = 120  # (lastiter_plugins.summary.WIDTH, the answer's)


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
    #: the first failed condition in one short line, without the theorem (the table's column; ``reasons`` in full)
    first_unmet: str = ""

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
    #: the facts observed that weakened the declared pipeline, each with its step and the fields it weakened
    departures: tuple[str, ...] = ()
    #: the rows that left best, each with the step and the fact that removed it
    rows_left: tuple[str, ...] = ()
    #: the registered learning rate left out: the rows that giving it would bring back
    needs_learning_rate: tuple[str, ...] = ()
    #: the mechanism the steps used (clipping, sensitivity, noise)
    mechanism: str = ""
    #: what Opacus' own accountants print for the run (default first), marked NOT VALID where their
    #: assumptions fail, with the ratio of the valid number to each
    host: tuple[str, ...] = ()
    #: seeds the script chose (the global generator's, the loader's): they must be kept secret
    seeds: tuple[str, ...] = ()
    #: the first screen (:func:`lastiter_plugins.answer_lines`): the number and where it comes from
    answer: tuple[str, ...] = ()
    #: ``str()`` prints everything (:meth:`explain`), not only the first screen
    explained: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": list(self.answer),
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
            "departures": list(self.departures),
            "rows_left": list(self.rows_left),
            "needs_learning_rate": list(self.needs_learning_rate),
            "mechanism": self.mechanism,
            "host": list(self.host),
            "seeds": list(self.seeds),
            "threat_model": self.threat_model,
        }

    def __str__(self) -> str:
        """The first screen: the answer (:attr:`answer`), a line when the script seeded generators (the seeds must
        stay secret), and where the rest is; everything when the report was asked for with ``explain=True``."""
        if self.explained:
            return self.explain()
        more = (
            f"  More in report.explain(): the {len(self.rows)} rows and why each applies or not, the rows that left "
            f"best ({len(self.rows_left)}), the departures ({len(self.departures)}), the advice, the threat model."
        )
        seeds = (
            f"  The script seeded {len(self.seeds)} generator(s): every number here holds only while the seeds stay "
            "secret (explain() says which)."
        )
        first = [*self.answer, *(_wrap(seeds, "") if self.seeds else ())]
        return "\n".join([*first, *textwrap.wrap(more, WIDTH, subsequent_indent="    ")])

    def explain(self) -> str:
        """The answer, then every row side by side (why a row does not apply, cut to one line; every reason
        below the table), the best line, how tight it is, its proof, the departures, the rows that left best,
        Opacus' own numbers, the advice and the threat model."""
        head = (
            f"accountant {self.name!r}: {self.steps} steps, sampling {self.sampling}, delta {self.delta:g}, "
            f"relation {self.relation}"
        )
        table = [("bound", "relation", "epsilon", "order", "protects", "applies / why not")]
        for r in self.rows:
            eps = "-" if r.epsilon is None else f"{r.epsilon:.4g}"
            order = "-" if r.order is None else f"{r.order:g}"
            why = "yes" if r.applies else (r.first_unmet or r.reasons[0])
            if r.applies and r.reasons:
                why = r.reasons[0]
            elif len(r.reasons) > 1:
                why += f" (+{len(r.reasons) - 1} more)"
            if r.proof != "proven":
                why += f" [{r.proof}]"
            table.append((r.bound, r.relation or "-", eps, order, r.protects if r.applies else "-", why))
        widths = [max(len(row[i]) for row in table) for i in range(5)]
        seeds = [wrapped for line in self.seeds for wrapped in _wrap(f"seed: {line}", "  ", "      ")]
        lines = [*self.answer, *seeds, "", *_wrap(head)]
        if self.mechanism:
            lines += _wrap(f"mechanism: {self.mechanism}")
        for row in table:
            line = "  ".join(cell.ljust(w) for cell, w in zip(row[:5], widths, strict=True)) + "  " + row[5]
            lines.append(line if len(line) <= WIDTH else line[: WIDTH - 3] + "...")
        reasons = [r for r in self.rows if not r.applies and r.reasons]
        if reasons:
            lines.append("Why the rows above do not apply:")
            for r in reasons:
                lines += _wrap(f"{r.bound}: {'; '.join(r.reasons)}", "  ", "      ")
        for text in (self.tightness, self.provenance):  # (best: the answer, first)
            lines += _wrap(text)
        lines += [wrapped for line in self.departures for wrapped in _wrap(f"departure: {line}")]
        lines += [wrapped for line in self.rows_left for wrapped in _wrap(f"left best: {line}")]
        if self.needs_learning_rate:
            lines += _wrap(f"give learning_rate= for {', '.join(self.needs_learning_rate)}")
        lines += [wrapped for line in self.host for wrapped in _wrap(line)]
        for block in (self.advice, self.threat_model):
            lines += [wrapped for line in block.splitlines() for wrapped in _wrap(line)]
        return "\n".join(lines)


def _wrap(text: str, first: str = "", rest: str = "    ") -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False, break_long_words=False
    )


def host_lines(config: lp.TrainingConfig, delta: float, valid: float) -> tuple[str, ...]:
    """What Opacus' default accountant (``prv``) and its RDP accountant would print for the run, each marked NOT
    VALID where its assumptions fail, with the ratio of the valid number ``valid`` to it."""
    numbers = {h.id: h for h in host.host_numbers(config, delta, "opacus")}
    lines = []
    for key, role in (("opacus-prv", "Opacus' default accountant (prv)"), ("opacus-rdp", "Opacus' RDP accountant")):
        number = numbers.get(key)
        if number is None or number.epsilon is None:
            continue
        verdict = "" if number.valid else f" NOT VALID: {number.why_not}"
        ratio = f"; the valid number is {valid / number.epsilon:.3g}x it" if number.epsilon > 0 else ""
        lines.append(
            f"{role} would print epsilon = {number.epsilon:.4g} ({number.relation.value}, every iterate){verdict}"
            f"{ratio}"
        )
    return tuple(lines)


def _departure(d: host.Departure) -> str:
    weakened = ", ".join(f"{k}={getattr(v, 'value', v)!r}" for k, v in d.changes.items())
    return f"step {d.step}: {d.fact} (weakens {weakened})"


def build_report(
    reg: Registration,
    account: host.Account,
    delta: float,
    observed: Observed | None,
    departures: tuple[host.Departure, ...] = (),
    seeds: tuple[str, ...] = (),
    *,
    explain: bool = False,
) -> Report:
    """Render the core's evaluation of every bound for the pipeline that ran (one evaluation path: the
    core's), with the departures that removed rows and the host's own number."""
    config, assumptions = account.config, account.assumptions
    orders = None if reg.orders is None else list(reg.orders)
    rows = []
    for bid, ev in lp.applicable_bounds(delta=delta, orders=orders, config=config, assumptions=assumptions).items():
        if bid == lp.BEST:
            continue
        result = ev.result
        rows.append(
            ReportRow(
                bound=bid,
                relation=None if ev.relation is None else ev.relation.value,
                applies=ev.applies,
                epsilon=None if result is None else result.epsilon,
                order=None if result is None else result.order,
                protects=ev.protects.value,
                reasons=tuple(ev.reasons),
                reference=ev.reference,
                proof=str(ev.proof),
                first_unmet=ev.unmet[0].short if ev.unmet else "",
            )
        )
    best_text = advice = tightness = provenance = ""
    lower = None
    hosts: tuple[str, ...] = ()
    answer: tuple[str, ...] = ()
    try:
        best = lp.epsilon(
            lp.BEST, delta, orders, lower_bound=True, published_only=reg.published_only, config=config,
            assumptions=assumptions,
        )  # fmt: skip
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
            filter(None, (f"Proof: {best.provenance}.", host.published_note(best, config, assumptions, reg.orders)))
        )
        if lp.is_standard_baseline(best):
            advice = lp.baseline_note(
                best, lp.advise(delta, top=3, host="opacus", config=config, assumptions=assumptions)
            )
        hosts = host_lines(config, delta, account.result.epsilon)
        answer = tuple(lp.answer_lines(host.answer(account.result, config, assumptions, "opacus", reg.orders)))
    except ValueError as exc:
        rows.append(ReportRow(lp.BEST, config.relation.value, False, None, None, "-", (str(exc),), ""))
    needs = host.rows_needing("learning_rate", config, assumptions) if reg.learning_rate is None else ()
    return Report(
        reg.name,
        delta,
        config.steps,
        config.sampling.value,
        config.relation.value,
        tuple(rows),
        best=best_text,
        advice=advice,
        tightness=tightness,
        lower_bound=lower,
        provenance=provenance,
        departures=tuple(_departure(d) for d in departures),
        rows_left=tuple(str(r) for r in account.rows_left),
        needs_learning_rate=needs,
        mechanism="" if observed is None else observed.mechanism,
        host=hosts,
        seeds=seeds,
        answer=answer or (f"No epsilon at delta = {delta:g}: {rows[-1].reasons[0]}",),
        explained=explain,
    )
