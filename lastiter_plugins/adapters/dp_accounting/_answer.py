"""The first lines of the accountants' ``statement()``: the answer (:func:`lastiter_plugins.answer_lines`: the
number, what it protects, its relation, the winning row and its provenance), then the one-line description of
everything the ledger composed."""

from __future__ import annotations

import lastiter_plugins as lp


def ledger_answer(
    epsilon: float,
    delta: float,
    relation: lp.Relation,
    final_model_only: bool,
    winner: str | None = None,
    provenance: str = "",
) -> lp.Answer:
    """The answer for a ledger's number (a composition: no single run's result to read it from). ``winner``
    and its ``provenance`` line when one row certifies every run in the ledger."""
    protects = lp.Protects.FINAL_MODEL if final_model_only else lp.Protects.EVERY_ITERATE
    proof = lp.BOUNDS[winner].proof if winner is not None and winner in lp.BOUNDS else None
    return lp.Answer(
        epsilon=epsilon,
        delta=delta,
        relation=relation.value,
        protects=protects.value,
        winner=winner,
        provenance=provenance,
        proven=proof is None or proof.proven,
        proof="proven" if proof is None else str(proof),
    )


def statement(answer: lp.Answer, detail: str) -> str:
    """The answer first, then ``detail`` (what the ledger composed, in one line)."""
    return "\n".join([*lp.answer_lines(answer), detail])
