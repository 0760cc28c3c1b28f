r"""The comparison rendered for people and programs: a plain-text table with numbered notes,
GitHub Markdown, JSON (never NaN/Infinity) and CSV."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence

from lastiter_plugins import api
from lastiter_plugins.compare.rows import FINAL_MODEL, FOOTER, STANDARD, BestLine, Comparison, Row
from lastiter_plugins.jsonout import dump_json

FORMATS = ("table", "markdown", "json", "csv")


def _num(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.{digits}g}"


def _valid_cell(row: Row) -> str:
    if row.valid:
        return "yes, shown only" if row.kind == STANDARD else "yes"
    return "NOT VALID" if row.epsilon is not None else "no"


def _scenario_line(c: Comparison) -> str:
    p = c.params
    parts = [f"{k}={p[k]}" for k in api.PARAMETERS if k in p]
    return ", ".join(parts) + f"; {c.steps} steps ({c.steps / c.steps_per_epoch:g} epochs of {c.steps_per_epoch})"


def _best_text(b: BestLine) -> str:
    declared = " (declared relation)" if b.declared else ""
    if b.epsilon is None:
        return f"{b.relation}{declared}: no valid accountant for this pipeline"
    order = f", order {b.order:g}" if b.order is not None else ""
    text = f"{b.relation}{declared}: epsilon = {_num(b.epsilon)} via {b.winner}{order}, protects {b.protects}"
    if b.protects == FINAL_MODEL and b.every_iterate_epsilon is not None:
        ratio = b.every_iterate_epsilon / b.epsilon if b.epsilon > 0 else math.inf
        text += (
            f"; {ratio:.3g}x below the best valid every-iterate accountant "
            f"({b.every_iterate_winner}: {_num(b.every_iterate_epsilon)})"
        )
    if b.notes:
        text += " [" + "; ".join(b.notes) + "]"
    return text


def _hosts_line(c: Comparison) -> str:
    parts = []
    for host, version in c.hosts.items():
        if version is None:
            fix = f"pip install 'lastiter-plugins[{host}]'"
            parts.append(f"{host} not installed (its accountants are not shown: {fix})")
        else:
            parts.append(f"{host} {version}")
    return "Host libraries: " + ", ".join(parts) + "."


def _notes(row: Row) -> list[str]:
    out = [] if row.proof == "proven" else [row.proof]
    if row.why_not:
        out.append(("NOT valid here: " if row.epsilon is not None else "does not apply: ") + " ".join(row.why_not))
    else:
        out.append("assumes: " + row.assumptions)
    out.extend(row.notes)
    return out


_COLUMNS = ("accountant", "valid here", "relation", "epsilon", "order", "protects", "proof", "sampling covered")


def _cells(row: Row, note: str = "") -> tuple[str, ...]:
    return (
        row.id + note,
        _valid_cell(row),
        row.relation,
        _num(row.epsilon),
        _num(row.order, 4) if row.order is not None else "-",
        row.protects,
        "proven" if row.proof == "proven" else "UNPROVEN",
        ", ".join(row.covers),
    )


def format_table(c: Comparison) -> str:
    """Plain-text table with numbered notes (why not / assumptions)."""
    body = [_cells(r, f" [{i}]") for i, r in enumerate(c.rows, start=1)]
    widths = [max(len(h), *(len(cells[i]) for cells in body)) for i, h in enumerate(_COLUMNS)]
    right = {3, 4}

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        parts = [cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in pairs]
        return "  ".join(parts).rstrip()

    out = [f"lastiter compare: {c.name}", _scenario_line(c), f"epsilon at delta = {c.delta:g}", ""]
    out.append(line(_COLUMNS))
    out.append(line(["-" * w for w in widths]))
    notes: list[str] = []
    previous_kind = None
    for row, cells in zip(c.rows, body, strict=True):
        group = row.kind == STANDARD
        if previous_kind is not None and group != previous_kind:
            out.append("")
            out.append("What host libraries report for this pipeline (shown, never counted):")
        previous_kind = group
        notes.append(f"[{len(notes) + 1}] {row.id}: " + " | ".join(_notes(row)))
        out.append(line(cells))
    out += ["", "Best valid for this pipeline, per neighbouring relation:"]
    out += [f"  {_best_text(b)}" for b in c.best]
    out += ["", "Notes:", *notes, "", _hosts_line(c), FOOTER]
    return "\n".join(out)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_markdown(c: Comparison) -> str:
    """GitHub-flavoured Markdown: the table, then the best-valid lines."""
    head = (*_COLUMNS, "why not / assumptions")
    out = [
        f"**{_md_escape(c.name)}**: {_md_escape(_scenario_line(c))}; epsilon at delta = {c.delta:g}.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * 2 + ["---"] * 4) + "|",
    ]
    for row in c.rows:
        cells = list(_cells(row))
        cells[0] = f"`{row.id}`"
        if not row.valid:
            cells[1] = f"**{cells[1]}**"
        cells.append("<br>".join(_md_escape(n) for n in _notes(row)))
        out.append("| " + " | ".join(_md_escape(x) if i < len(head) - 1 else x for i, x in enumerate(cells)) + " |")
    out += ["", "Best valid for this pipeline, per neighbouring relation:", ""]
    out += [f"- {_md_escape(_best_text(b))}" for b in c.best]
    out += ["", _md_escape(_hosts_line(c)), "", f"_{FOOTER}_"]
    return "\n".join(out)


CSV_FIELDS = (
    "id",
    "label",
    "kind",
    "valid",
    "relation",
    "epsilon",
    "delta",
    "order",
    "protects",
    "covers",
    "counted",
    "proof",
    "why_not",
    "assumptions",
    "reference",
    "notes",
)


def format_csv(c: Comparison) -> str:
    """One line per row, then one per best-valid line (kind ``best``)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()

    def num(x: float | None) -> str:
        return "" if x is None else repr(float(x))  # 'inf' when infinite; empty when there is no number

    for r in c.rows:
        writer.writerow(
            {
                "id": r.id,
                "label": r.label,
                "kind": r.kind,
                "valid": str(r.valid).lower(),
                "relation": r.relation,
                "epsilon": num(r.epsilon),
                "delta": repr(c.delta),
                "order": num(r.order),
                "protects": r.protects,
                "covers": " ".join(r.covers),
                "counted": str(r.counted).lower(),
                "proof": r.proof,
                "why_not": " ".join(r.why_not),
                "assumptions": r.assumptions,
                "reference": r.reference,
                "notes": " ".join(r.notes),
            }
        )
    for b in c.best:
        writer.writerow(
            {
                "id": f"best-{b.relation}",
                "label": f"best valid ({b.relation})",
                "kind": "best",
                "valid": str(b.epsilon is not None).lower(),
                "relation": b.relation,
                "epsilon": num(b.epsilon),
                "delta": repr(c.delta),
                "order": num(b.order),
                "protects": b.protects or "",
                "covers": "",
                "counted": "",
                "proof": "proven" if b.epsilon is not None else "",
                "why_not": "" if b.epsilon is not None else b.how,
                "assumptions": "",
                "reference": b.winner or "",
                "notes": b.how,
            }
        )
    return buffer.getvalue().rstrip("\n")


def format_comparison(c: Comparison, fmt: str = "table") -> str:
    """Render as ``table``, ``markdown``, ``json`` (never NaN/Infinity) or ``csv``."""
    if fmt == "table":
        return format_table(c)
    if fmt == "markdown":
        return format_markdown(c)
    if fmt == "json":
        return dump_json(c.to_dict())
    if fmt == "csv":
        return format_csv(c)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}. Found {fmt!r}.")
