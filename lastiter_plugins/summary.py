r"""The answer, first: the few lines every human-readable output starts with (``lastiter compare``,
``lastiter epsilon``, ``str(EpsilonResult)``, and the adapters' reports and statements).

One renderer (:func:`answer_lines`) over one small record (:class:`Answer`): the number and its delta, what it
protects (the final model only, or every iterate), its neighbouring relation in words, the winning row and its
provenance (published / derived here / unproven, :func:`lastiter_plugins.registry.provenance_short`), what
published theorems alone give, the every-iterate baseline beside it, the lower end when known, and the host
library's own number, marked NOT VALID where its assumption fails. Declarations no loss meets come before
everything (:func:`lastiter_plugins.feasibility.impossible_declaration`). The derivations, the rows that do not
apply and the references are for ``--explain`` / ``explain()``.

An adapter builds its answer with :meth:`Answer.of` from the ``EpsilonResult`` it reports and its host's
number (:class:`HostNumber`), and prints :func:`answer_lines` before anything else.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lastiter_plugins.registry import Protects, provenance_short

if TYPE_CHECKING:  # the result type is read, never imported at run time (evaluation imports this module)
    from lastiter_plugins.evaluation import EpsilonResult

__all__ = ["WIDTH", "Answer", "HostNumber", "answer_lines", "relation_words", "warning_lines"]

#: Lines are wrapped to this width.
WIDTH = 120
#: Above this an epsilon protects nothing worth a digit.
MEANINGLESS_EPSILON = 1e4

_RELATION_WORDS = {
    "replace_one": "replace_one neighbours (one record replaced)",
    "add_or_remove_one": "add_or_remove_one neighbours (one record added or removed)",
}


def relation_words(relation: str) -> str:
    """A neighbouring relation in plain words (docs/glossary.md)."""
    return _RELATION_WORDS.get(relation, f"{relation} neighbours")


def _eps(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return "inf"
    return "> 1e4" if x > MEANINGLESS_EPSILON else f"{x:.4g}"


@dataclasses.dataclass(frozen=True)
class HostNumber:
    """A host library's own number for the run, as the user would read it from the host.

    Attributes:
      name: the host accountant (``opacus-rdp``, ``keras-compute_dp_sgd_privacy``, ...).
      epsilon: its epsilon at the same delta (None: not computed).
      relation: its neighbouring relation.
      valid: whether its assumptions hold for the run actually made.
      why_not: the first assumption that fails, in words (empty when valid).
    """

    name: str
    epsilon: float | None
    relation: str
    valid: bool
    why_not: str = ""


@dataclasses.dataclass(frozen=True)
class Answer:
    """What the first lines of an output say.

    Attributes:
      epsilon: the guarantee's epsilon (None: no valid accountant; ``no_answer`` says why).
      delta: its delta.
      relation: its neighbouring relation (``replace_one`` or ``add_or_remove_one``).
      protects: ``the final model only`` or ``every iterate``.
      winner: the row that gives it.
      sampling: the sampling scheme the number covers.
      provenance: the winner's ``published: ...``, ``derived here ...: ...`` or ``unproven: ...`` line.
      proven: the winner's proof status (False: unproven, whatever the provenance says).
      proof: the proof status in words (``unproven: <why>`` when not proven).
      published_epsilon, published_winner: what published theorems alone give, when the winner is derived
        here (``published_winner`` None with ``published_checked``: no published theorem applies).
      published_checked: whether the published-only number was looked for.
      every_iterate_epsilon, every_iterate_winner: the best every-iterate baseline beside a last-iterate answer.
      lower_bound: the exact epsilon of an instance meeting every declaration (None: not known).
      hosts: the host libraries' own numbers.
      impossible: why no loss meets the declarations (empty: some loss may).
      no_answer: why there is no number (empty when there is one).
    """

    epsilon: float | None
    delta: float
    relation: str
    protects: str
    winner: str | None
    sampling: str = ""
    provenance: str = ""
    proven: bool = True
    proof: str = "proven"
    published_epsilon: float | None = None
    published_winner: str | None = None
    published_checked: bool = False
    every_iterate_epsilon: float | None = None
    every_iterate_winner: str | None = None
    lower_bound: float | None = None
    hosts: tuple[HostNumber, ...] = ()
    impossible: str = ""
    no_answer: str = ""

    @classmethod
    def of(
        cls,
        result: EpsilonResult,
        *,
        published: EpsilonResult | None = None,
        published_checked: bool = False,
        every_iterate: tuple[float, str] | None = None,
        hosts: Sequence[HostNumber] = (),
        impossible: str | None = None,
    ) -> Answer:
        """The answer for ``result`` (an ``EpsilonResult``), with what published theorems alone give
        (``published``, from :func:`lastiter_plugins.evaluation.published_best`; ``published_checked`` when it
        was looked for, so that None means none applies), the every-iterate baseline (epsilon, row) and the
        host's own numbers."""
        alt = published if published is not None and published.winner != result.winner else None
        return cls(
            epsilon=result.epsilon,
            delta=result.delta,
            relation=result.relation.value,
            protects=result.protects.value,
            winner=result.winner,
            sampling=result.sampling.value
            + ("" if result.order_secret else " (public order)")
            + cut_words(result.max_batch_size),
            provenance=result.provenance,
            proven=result.proof.proven,
            proof=str(result.proof),
            published_epsilon=None if alt is None else alt.epsilon,
            published_winner=None if alt is None else alt.winner,
            published_checked=published_checked and not result.published,
            every_iterate_epsilon=None if every_iterate is None else every_iterate[0],
            every_iterate_winner=None if every_iterate is None else every_iterate[1],
            lower_bound=result.lower_bound,
            hosts=tuple(hosts),
            impossible=impossible or "",
        )


def cut_words(max_batch_size: int | None) -> str:
    """How an output names batches cut at ``max_batch_size``, after the sampling (empty when never cut)."""
    return "" if max_batch_size is None else f" (batches cut at {max_batch_size} examples)"


def _wrap(text: str, first: str = "", rest: str = "    ", width: int = WIDTH) -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False, break_long_words=False
    )


def _hosts_text(hosts: Sequence[HostNumber]) -> str:
    """The host numbers in one sentence, grouped by verdict: ``NOT VALID here: a 1.0, b 0.9 (why); ...``."""
    groups: dict[str, list[HostNumber]] = {}
    for h in hosts:
        groups.setdefault("" if h.valid else h.why_not.split(": ")[0], []).append(h)
    invalid = [
        ", ".join(f"{h.name} {_eps(h.epsilon)}" for h in members) + f" ({why})"
        for why, members in groups.items()
        if why
    ]
    valid = ", ".join(f"{h.name} {_eps(h.epsilon)}" for h in groups.get("", []))
    parts = ([f"NOT VALID here: {'; '.join(invalid)}"] if invalid else []) + (
        [f"valid here, shown only: {valid}"] if valid else []
    )
    return "; ".join(parts)


def warning_lines(impossible: str | None, *, width: int = WIDTH) -> list[str]:
    """The warning every output starts with when no loss meets the declarations (empty when some may)."""
    if not impossible:
        return []
    return _wrap(f"WARNING: {impossible}. The numbers below are for a model that cannot exist.", width=width)


def answer_lines(answer: Answer, *, width: int = WIDTH) -> list[str]:
    """The answer in at most about eight lines, the number first (a declaration no loss meets before it)."""
    out = warning_lines(answer.impossible, width=width)
    if answer.epsilon is None:
        why = answer.no_answer or "no valid accountant for this pipeline"
        out += _wrap(f"No epsilon at delta = {answer.delta:g} ({relation_words(answer.relation)}): {why}.", width=width)
    else:
        sampling = f"; {answer.sampling} sampling" if answer.sampling else ""
        number = _eps(answer.epsilon)
        if number == "> 1e4":  # the number asked for, said to protect nothing
            number = f"{answer.epsilon:.4g} (above 1e4: protects nothing)"
        out += _wrap(
            f"epsilon = {number} at delta = {answer.delta:g} for {answer.protects}; "
            f"{relation_words(answer.relation)}{sampling}.",
            width=width,
        )
        if answer.winner is not None:
            if not answer.proven:
                proof = answer.proof  # unproven: its reason, never only a citation
            else:
                proof = provenance_short(answer.provenance) if answer.provenance else "proven"
            out += _wrap(f"From {answer.winner}: {proof.rstrip('.')}.", "  ", width=width)
        beside = []
        if answer.published_epsilon is not None:
            beside.append(f"Published theorems only: {_eps(answer.published_epsilon)} ({answer.published_winner})")
        elif answer.published_checked:
            beside.append("Published theorems only: none applies")
        if answer.every_iterate_epsilon is not None and answer.protects == Protects.FINAL_MODEL.value:
            beside.append(f"every iterate: {_eps(answer.every_iterate_epsilon)} ({answer.every_iterate_winner})")
        if answer.lower_bound is not None:
            beside.append(f"lower end: {_eps(answer.lower_bound)}")
        if beside:
            out += _wrap("; ".join(beside) + ".", "  ", width=width)
    if answer.hosts:
        out += _wrap(f"Host libraries: {_hosts_text(answer.hosts)}.", "  ", width=width)
    return out
