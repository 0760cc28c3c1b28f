r"""The comparison rendered for people and programs: a plain-text table with numbered rows (the
rows that apply, the host accountants, and one line counting the bounds that do not apply; every
row with ``every_row``), GitHub Markdown (the same rows), JSON (never NaN/Infinity) and CSV (every
row). Each reference is cited once per output, at its end (JSON and CSV: in the row's
``reference``, never in its conditions). People see "> 1e4" for an epsilon too large to mean
anything; JSON and CSV keep every number and every failed condition."""

from __future__ import annotations

import csv
import io
import math
import textwrap
from collections.abc import Mapping, Sequence

from lastiter_plugins import api, registry
from lastiter_plugins.compare.hosts import EXTRAS
from lastiter_plugins.compare.rows import FINAL_MODEL, FOOTER, STANDARD, BestLine, Comparison, Row
from lastiter_plugins.defaults import FORMATS
from lastiter_plugins.jsonout import dump_json
from lastiter_plugins.summary import Answer, HostNumber, answer_lines, cut_words, warning_lines


def _num(x: float | None, digits: int = 4) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return f"{x:.{digits}g}"


#: Above this an epsilon protects nothing worth a digit: the table and Markdown print "> 1e4"
#: (JSON and CSV keep the number).
MEANINGLESS_EPSILON = 1e4
TOO_LARGE = "> 1e4"
#: What the proof column says, printed under a table that shows a row of ours.
PROOF_LEGEND = (
    "proof: published = a published theorem applied within its assumptions; derived here = this library's "
    "derivation for this pipeline (docs/derivations/), checked on exact instances and by fuzzing; unproven = no "
    "proof (shown, never counted)"
)
#: Free text (scenario, notes, references) is wrapped to this width; table rows are shorter.
WIDTH = 120


def _eps(x: float | None) -> str:
    """An epsilon for people: ``> 1e4`` above :data:`MEANINGLESS_EPSILON`."""
    if x is not None and math.isfinite(x) and x > MEANINGLESS_EPSILON:
        return TOO_LARGE
    return _num(x)


def _wrap(text: str, first: str = "  ", rest: str = "      ") -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False, break_long_words=False
    )


def _valid_cell(row: Row) -> str:
    if row.valid:
        return "yes, shown only" if row.kind == STANDARD else "yes"
    return "NOT VALID" if row.epsilon is not None else "no"


def _scenario_line(c: Comparison) -> str:
    p = c.params
    parts = [f"{k}={p[k]}" for k in api.PARAMETERS if k in p]
    return ", ".join(parts) + f"; {c.steps} steps ({c.steps / c.steps_per_epoch:g} epochs of {c.steps_per_epoch})"


def _best_heading(c: Comparison) -> str:
    only = " (over published theorems only: --published-only)" if c.published_only else ""
    return f"Best valid for this pipeline, per neighbouring relation{only}"


def _best_text(b: BestLine) -> str:
    declared = " (the pipeline's relation)" if b.declared else ""
    if b.epsilon is None:
        return f"{b.relation}{declared}: no valid accountant for this pipeline"
    order = f", order {b.order:g}" if b.order is not None else ""
    text = f"{b.relation}{declared}: epsilon = {_eps(b.epsilon)} via {b.winner}{order}, protects {b.protects}"
    if b.protects == FINAL_MODEL and b.every_iterate_epsilon is not None:
        ratio = b.every_iterate_epsilon / b.epsilon if b.epsilon > 0 else math.inf
        text += (
            f"; {ratio:.3g}x below the best valid every-iterate accountant "
            f"({b.every_iterate_winner}: {_eps(b.every_iterate_epsilon)})"
        )
    if b.notes:
        text += " [" + "; ".join(b.notes) + "]"
    text = ". ".join(filter(None, (text, _tightness_text(b))))
    return f"{text}. {b.published_note}" if b.published_note else text


def _tightness_text(b: BestLine) -> str:
    """The lower bound next to best (docs/derivations/lower-end.md#lower-end); empty when not computed."""
    if not b.lower_bound_note or b.epsilon is None:
        return ""
    if b.lower_bound is None:
        return f"How tight: no lower end ({b.lower_bound_note})"
    return (
        "How tight: the worst case over models meeting your declarations lies in "
        f"[{_eps(b.lower_bound)}, {_eps(b.epsilon)}] (lower end: {b.lower_bound_note})"
    )


def _hosts_line(c: Comparison) -> str:
    parts = []
    for host, version in c.hosts.items():
        if version is None:
            fix = f"pip install 'lastiter-plugins[{EXTRAS.get(host, host)}]'"
            parts.append(f"{host} not installed (its accountants are not shown: {fix})")
        else:
            parts.append(f"{host} {version}")
    return "Host libraries: " + ", ".join(parts) + "."


def _why_not(row: Row) -> str:
    """The first failed condition in one short line (every condition is in ``row.why_not``)."""
    return row.first_unmet or (row.why_not[0] if row.why_not else "")


def _shown(c: Comparison, every_row: bool) -> tuple[list[Row], list[Row]]:
    """(rows shown, registry bounds left out): by default a registry bound that does not apply (no
    number, not valid) is only counted; host accountants are always shown (their numbers are what a
    user would otherwise read, valid or not)."""
    if every_row:
        return list(c.rows), []
    hidden = [r for r in c.rows if not r.valid and r.kind != STANDARD]
    return [r for r in c.rows if r not in hidden], hidden


def _hidden_line(hidden: Sequence[Row], sampling: str) -> str:
    large = sum(r.valid for r in hidden)  # valid rows are hidden only for an epsilon above 1e4
    same = sum(r.first_unmet.startswith("sampling must be") for r in hidden)
    why = f" ({same} need another sampling than {sampling})" if same else ""
    text = f"{len(hidden) - large} more bounds do not apply{why}"
    if large:
        text += f", {large} give epsilon > 1e4 (no protection)"
    return text + "; --all lists them."


def _references(rows: Sequence[Row]) -> list[tuple[int, Row, int | None]]:
    """(number, row, number of an earlier row with the same reference or None): each citation once."""
    seen: dict[str, int] = {}
    out = []
    for i, row in enumerate(rows, start=1):
        out.append((i, row, seen.get(row.reference)))
        seen.setdefault(row.reference, i)
    return out


_COLUMNS = ("accountant", "valid here", "relation", "epsilon", "order", "protects", "proof", "sampling covered")
#: The first screen's columns (indices into :data:`_COLUMNS`): no Renyi order, no list of schemes.
_FIRST_SCREEN = (0, 1, 2, 3, 5, 6)


def _cells(row: Row, note: str = "", marks: Mapping[str, str] | None = None) -> tuple[str, ...]:
    proof = _proof_cell(row)
    mark = (marks or {}).get(_left_published(row), "")
    return (
        row.id + note,
        _valid_cell(row),
        row.relation,
        _eps(row.epsilon),
        _num(row.order, 4) if row.order is not None else "-",
        row.protects,
        f"{proof} ({mark})" if mark else proof,
        ", ".join(row.covers),
    )


def _proof_cell(row: Row) -> str:
    """The provenance vocabulary (:func:`lastiter_plugins.registry.provenance_word`): published, derived here
    or unproven, on every row (host rows included)."""
    proven = row.proof == "proven"
    if not row.provenance:
        return registry.PUBLISHED if proven else registry.UNPROVEN
    return registry.provenance_word(row.provenance, proven)


def _left_published(row: Row) -> str:
    """Why a published theorem's row is derived here for this pipeline (empty: it is not)."""
    if _proof_cell(row) != registry.DERIVED_HERE or not row.provenance.startswith(registry.DERIVED_HERE + " ("):
        return ""
    return row.provenance[len(registry.DERIVED_HERE) + 2 :].split(",")[0].split(")")[0]


def _marks(rows: Sequence[Row]) -> dict[str, str]:
    """A letter per reason a published theorem's row is derived here, in the rows' order."""
    reasons = dict.fromkeys(why for r in rows if (why := _left_published(r)))
    return {why: chr(ord("a") + i) for i, why in enumerate(reasons)}


def _mark_lines(rows: Sequence[Row], marks: Mapping[str, str]) -> list[str]:
    out = []
    for why, mark in marks.items():
        out += _wrap(f"({mark}) a published theorem, derived here: this pipeline has {why}.", "", "    ")
    return out


def answer_of(c: Comparison) -> Answer:
    """The answer of the comparison (:mod:`lastiter_plugins.summary`): the pipeline's relation's best line and
    the host libraries' own numbers (a declaration no loss meets leads the whole output instead)."""
    b = next((line for line in c.best if line.declared), None)
    if b is None:  # a comparison built without its best lines: no answer to give
        b = BestLine(str(c.params.get("relation", "")), True, None, None, None, None, "no best line computed")
    hosts = tuple(HostNumber(r.id, r.epsilon, r.relation, r.valid, _why_not(r)) for r in c.rows if r.kind == STANDARD)
    derived = b.epsilon is not None and _proof_word(b.provenance) != registry.PUBLISHED
    return Answer(
        epsilon=b.epsilon,
        delta=c.delta,
        relation=b.relation,
        protects=b.protects or FINAL_MODEL,
        winner=b.winner,
        sampling=str(c.params.get("sampling", "")) + cut_words(c.params.get("max_batch_size")),
        provenance=b.provenance,
        published_epsilon=b.published_epsilon,
        published_winner=b.published_winner,
        published_checked=derived and not c.published_only,
        every_iterate_epsilon=b.every_iterate_epsilon,
        every_iterate_winner=b.every_iterate_winner,
        lower_bound=b.lower_bound,
        hosts=hosts,
        no_answer="" if b.epsilon is not None else b.how,
    )


def _proof_word(provenance: str) -> str:
    return registry.provenance_word(provenance) if provenance else registry.PUBLISHED


def _table_lines(rows: Sequence[Row], columns: Sequence[int], marks: Mapping[str, str]) -> list[list[str]]:
    return [[_cells(r, f" [{i}]", marks)[k] for k in columns] for i, r in enumerate(rows, start=1)]


def _aligned(head: Sequence[str], body: Sequence[Sequence[str]], right: set[int]) -> list[str]:
    widths = [max(len(h), *(len(cells[i]) for cells in body)) for i, h in enumerate(head)]

    def line(cells: Sequence[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in pairs).rstrip()

    return [line(head), line(["-" * w for w in widths]), *(line(cells) for cells in body)]


#: The first screen's last line: what ``--explain`` adds.
EXPLAIN_LINE = (
    "--explain: orders, schemes, host rows, why rows do not apply, assumptions, references. Words: docs/glossary.md"
)


def format_table(c: Comparison, *, verbose: bool = False, every_row: bool = False, explain: bool = False) -> str:
    """Plain text, the answer first (:func:`lastiter_plugins.summary.answer_lines`): the scenario, the answer,
    the rows that apply (accountant, valid, relation, epsilon, what it protects, its provenance) and one line
    counting the bounds that do not apply; about 25 lines.

    ``explain`` replaces that table by every column and the host accountants' rows, then adds the best line
    of each relation, one line per shown row that does not apply (its first failed condition), what the valid
    rows assume, notes, and the references, each once. ``verbose`` adds the host libraries' log records
    captured while the rows were computed; ``every_row`` lists the bounds that do not apply too.
    """
    rows, hidden = _shown(c, every_row)
    if not explain:  # the hosts' numbers are in the answer; a number above 1e4 protects nothing
        rows = [r for r in rows if r.kind != STANDARD]
        if not every_row:
            hidden += [r for r in rows if r.epsilon is not None and r.epsilon > MEANINGLESS_EPSILON]
            rows = [r for r in rows if r not in hidden]
    marks = _marks(rows)
    out = warning_lines(c.impossible)
    out += [f"lastiter compare: {c.name}; epsilon at delta = {c.delta:g}", *_wrap(_scenario_line(c), "", "  ")]
    out += ["", *answer_lines(answer_of(c)), ""]
    columns = range(len(_COLUMNS)) if explain else _FIRST_SCREEN
    head = [_COLUMNS[k] for k in columns]
    right = {i for i, k in enumerate(columns) if k in (3, 4)}
    table = _aligned(head, _table_lines(rows, columns, marks), right)
    out += table[:2]
    previous_kind = None
    for row, text in zip(rows, table[2:], strict=True):
        group = row.kind == STANDARD
        if group and previous_kind is not True:
            if hidden:
                out += _wrap(_hidden_line(hidden, c.params.get("sampling", "")), "", "  ")
            out += ["", "What host libraries report for this pipeline (shown, never counted):"]
        previous_kind = group
        out.append(text)
    if hidden and previous_kind is not True:  # no host row: the count ends the table
        out += _wrap(_hidden_line(hidden, c.params.get("sampling", "")), "", "  ")
    out += _mark_lines(rows, marks)
    if any(r.epsilon is not None and r.epsilon > MEANINGLESS_EPSILON for r in rows):
        out.append(f"({TOO_LARGE}: an epsilon above 1e4 protects nothing; --format json gives the number.)")
    if not explain:
        return "\n".join([*out, EXPLAIN_LINE, *_host_log_lines(c, verbose)])
    out += _wrap(f"({PROOF_LEGEND})", "", " ")
    out += ["", _best_heading(c) + ":"]
    for b in c.best:
        out += _wrap(_best_text(b), "  ", "    ")
    numbered = list(enumerate(rows, start=1))
    invalid = [(i, r) for i, r in numbered if not r.valid]
    if invalid:
        out += ["", "Why the other rows do not apply (the first failed condition; --format json lists all):"]
        out += [f"  [{i}] {r.id}: {_why_not(r)}" for i, r in invalid]
    valid = [(i, r) for i, r in numbered if r.valid]
    if valid:
        out += ["", "What the valid rows assume (your pipeline must do this too):"]
        for i, r in valid:
            out += _wrap(f"[{i}] {r.id}: {r.assumptions}")
    noted = [(i, r) for i, r in valid if r.notes]
    if noted:
        out += ["", "Notes:"]
        for i, r in noted:
            out += _wrap(f"[{i}] {r.id}: " + " ".join(r.notes))
    out += ["", "References:"]
    for i, r, same in _references(rows):
        out += _wrap(f"[{i}] {r.id}: " + (f"as [{same}]" if same is not None else r.reference))
    derived = [(i, r) for i, r in numbered if r.provenance and _proof_cell(r) != registry.PUBLISHED]
    if derived:  # a published row's proof is its reference, cited above
        out += ["", "Proof of the rows not published (derived here: the derivation and its checks; unproven: why):"]
        for i, r in derived:
            out += _wrap(f"{r.id} [{i}]: {r.provenance}")
    out += ["", *_wrap(_hosts_line(c), "", "  "), *_wrap(FOOTER, "", ""), *_host_log_lines(c, verbose)]
    return "\n".join(out)


def _host_log_lines(c: Comparison, verbose: bool) -> list[str]:
    if c.host_log and verbose:
        head = f"Host library log ({len(c.host_log)} records, captured while the accountants ran):"
        return ["", head, *(f"  {record}" for record in c.host_log)]
    if c.host_log:
        return [f"({len(c.host_log)} host library log records hidden; --verbose shows them.)"]
    return []


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def format_markdown(c: Comparison, *, every_row: bool = False) -> str:
    """GitHub-flavoured Markdown: the table (the rows of :func:`format_table`; why not: the first
    failed condition), the best-valid lines and the references, each once."""
    rows, hidden = _shown(c, every_row)
    head = (*_COLUMNS, "why not / assumptions")
    out = [f"**{_md_escape(line)}**" for line in warning_lines(c.impossible, width=10**6)]
    out += [
        f"**{_md_escape(c.name)}**: {_md_escape(_scenario_line(c))}; epsilon at delta = {c.delta:g}.",
        "",
        *(_md_escape(line.strip()) + "  " for line in answer_lines(answer_of(c), width=10**6)),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 3 + ["---:"] * 2 + ["---"] * 4) + "|",
    ]
    for i, row in enumerate(rows, start=1):
        reasons = {why: why for why in _marks(rows)}  # Markdown: the reason in the cell itself
        cells = [_md_escape(x) for x in _cells(row, marks=reasons)]
        cells[0] = f"`{row.id}` [{i}]"
        if not row.valid:
            cells[1] = f"**{cells[1]}**"
            cells.append(_md_escape(_why_not(row)))
        else:
            cells.append("<br>".join(_md_escape(n) for n in ("assumes: " + row.assumptions, *row.notes)))
        out.append("| " + " | ".join(cells) + " |")
    if hidden:
        out += ["", _md_escape(_hidden_line(hidden, c.params.get("sampling", "")))]
    if any(r.epsilon is not None and r.epsilon > MEANINGLESS_EPSILON for r in rows):
        out += ["", f"{_md_escape(TOO_LARGE)}: an epsilon above 1e4 protects nothing (JSON and CSV give the number)."]
    out += ["", _best_heading(c) + ":", ""]
    out += [f"- {_md_escape(_best_text(b))}" for b in c.best]
    out += ["", "References:", ""]
    for i, r, same in _references(rows):
        out.append(f"{i}. `{r.id}`: " + (f"as {same}" if same is not None else _md_escape(r.reference)))
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
    "provenance",
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
                "provenance": r.provenance,
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
                "notes": " ".join(filter(None, (b.how, _tightness_text(b)))),
            }
        )
    return buffer.getvalue().rstrip("\n")


def format_comparison(
    c: Comparison, fmt: str = "table", *, verbose: bool = False, every_row: bool = False, explain: bool = False
) -> str:
    """Render as ``table``, ``markdown``, ``json`` (never NaN/Infinity) or ``csv``; ``verbose``
    adds the captured host-library log to the table; ``every_row`` lists the bounds that do not
    apply in the table and Markdown too (JSON and CSV always list every row); ``explain`` adds to the table
    what is behind its answer (:func:`format_table`)."""
    if fmt == "table":
        return format_table(c, verbose=verbose, every_row=every_row, explain=explain)
    if fmt == "markdown":
        return format_markdown(c, every_row=every_row)
    if fmt == "json":
        return dump_json(c.to_dict())
    if fmt == "csv":
        return format_csv(c)
    raise ValueError(f"format must be one of {', '.join(FORMATS)}. Found {fmt!r}.")
