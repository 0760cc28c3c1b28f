r"""The comparison's data: rows, best lines and the whole table (what every format renders)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from lastiter_plugins.registry import Protects

_T = TypeVar("_T")

FINAL_MODEL = Protects.FINAL_MODEL.value
EVERY_ITERATE = Protects.EVERY_ITERATE.value
STANDARD = "standard accountant"

FOOTER = (
    "Last-iterate epsilons protect the final model only: intermediate checkpoints must not be released. "
    "Composition rows and the host accountants protect every iterate. Host accountants are shown, never counted. "
    "Relations are never mixed in one minimum."
)


@dataclasses.dataclass(frozen=True)
class Row:
    """One accountant in the comparison.

    Attributes:
      id: stable identifier (a registry bound id, or a host accountant such as ``opacus-rdp``).
      label: human-readable name.
      kind: ``last-iterate bound``, ``composition`` (registry rows that protect every
        iterate) or ``standard accountant`` (a host library's, display only).
      valid: True when every assumption of the accountant holds for the pipeline.
      why_not: the violated conditions, each in full but without the reference (cited once, in
        ``reference``); empty when valid.
      covers: sampling schemes the accountant is proven for.
      relation: its neighbouring relation (for this pipeline's sampling).
      assumptions: what it assumes, in words.
      epsilon: epsilon at ``delta`` (None when there is no number: a registry
        bound that does not apply, one best did not need, or a host error; ``inf`` is possible).
      order: optimal Renyi order (RDP accountants only).
      protects: ``the final model only`` or ``every iterate``.
      reference: theorem or host-library API.
      counted: whether it takes part in a best line (a registry row that applies, proven, with a number).
      proof: ``proven`` or ``unproven: <reason>`` (host accountants: their own theorems).
      provenance: a registry row's ``published: <theorem>`` or ``derived here: <docs section; checks>``
        for this pipeline (empty for host accountants).
      notes: extra remarks (order at the grid's edge, host warnings, errors).
      first_unmet: the first failed condition in one short line, without the reference
        (empty when valid); what the table prints. Display only: not in JSON or CSV,
        where ``why_not`` has every condition in full.
    """

    id: str
    label: str
    kind: str
    valid: bool
    why_not: tuple[str, ...]
    covers: tuple[str, ...]
    relation: str
    assumptions: str
    epsilon: float | None
    order: float | None
    protects: str
    reference: str
    counted: bool
    proof: str = "proven"
    notes: tuple[str, ...] = ()
    first_unmet: str = ""
    provenance: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["first_unmet"]  # display only: why_not says it in full
        out["why_not"] = list(self.why_not)
        out["covers"] = list(self.covers)
        out["notes"] = list(self.notes)
        return out


@dataclasses.dataclass(frozen=True)
class BestLine:
    """The smallest valid epsilon for one neighbouring relation: the registry's ``best`` for it."""

    relation: str
    declared: bool  # the pipeline's relation: the one asked for, or the sampling scheme's default
    epsilon: float | None  # None: no valid accountant for this relation
    winner: str | None
    order: float | None
    protects: str | None
    how: str  # how the minimum was taken
    every_iterate_epsilon: float | None = None  # smallest valid every-iterate number, same relation
    every_iterate_winner: str | None = None
    notes: tuple[str, ...] = ()
    # the exact epsilon of an instance meeting every declaration (docs/derivations/lower-end.md#lower-end), or
    # None, and why (empty when not computed)
    lower_bound: float | None = None
    lower_bound_note: str = ""
    provenance: str = ""  # the winner's: "published: ..." or "derived here: ..."
    published_note: str = ""  # what best gives over published theorems only (empty: the winner is published)
    published_epsilon: float | None = None  # that number (None: the winner is published, or none applies)
    published_winner: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["notes"] = list(self.notes)
        return out


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The whole table: scenario, rows and the best lines."""

    name: str
    params: Mapping[str, Any]
    delta: float
    steps: int
    steps_per_epoch: int
    rows: tuple[Row, ...]
    best: tuple[BestLine, ...]
    hosts: Mapping[str, str | None]
    host_log: tuple[str, ...] = ()  # host libraries' log records while the rows were computed (not in JSON)
    published_only: bool = False  # the best lines are over published theorems only
    impossible: str = ""  # why no loss meets the declarations (lastiter_plugins.feasibility); empty: some may

    def row(self, row_id: str) -> Row:
        for r in self.rows:
            if r.id == row_id:
                return r
        raise KeyError(row_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.name,
            "params": dict(self.params),
            "delta": self.delta,
            "steps": self.steps,
            "steps_per_epoch": self.steps_per_epoch,
            "epochs": self.steps / self.steps_per_epoch,
            "rows": [r.to_dict() for r in self.rows],
            "best": [b.to_dict() for b in self.best],
            "published_only": self.published_only,
            "impossible_declaration": self.impossible or None,
            "hosts": dict(self.hosts),
            "note": FOOTER,
        }


def catching(fn: Callable[[], _T]) -> tuple[_T, tuple[str, ...]]:
    """Run ``fn``; turn its warnings into notes instead of printing them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        value = fn()
    return value, tuple(dict.fromkeys(str(w.message).strip() for w in caught))


_capturing: list[list[str]] = []  # the active capture (outermost first)


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.NOTSET)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(f"{record.levelname} {record.name}: {record.getMessage()}")
        except Exception:  # a malformed record must not break the comparison
            self.handleError(record)


@contextlib.contextmanager
def host_log() -> Iterator[list[str]]:
    """Collect the log records host libraries emit (dp-accounting's absl warnings, Opacus'
    loggers) instead of letting them reach the terminal; yields the list of lines.

    While active, the root logger's handlers are replaced by one that collects (records
    still pass each logger's level); they are restored on exit. Nested uses share the
    outermost list. Not thread-safe: the root logger is process-wide.
    """
    if _capturing:
        yield _capturing[0]
        return
    lines: list[str] = []
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [_Collect(lines)]
    _capturing.append(lines)
    try:
        yield lines
    finally:
        _capturing.pop()
        root.handlers = saved
