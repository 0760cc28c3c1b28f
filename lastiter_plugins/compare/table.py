r"""The comparison itself: one row per bound of the registry (the one evaluation path), the
host accountants a user would otherwise run (display only), and one best line per relation.

Rules the table keeps:

* A registry bound that does not apply has no number (it never returns one). Each
  bound is shown under the relation it is proven for with this sampling.
* The standard baselines are registry rows (``composition``,
  ``composition-gdp-epochs``, ``composition-pld-poisson``,
  ``composition-pld-poisson-replace-one``, ``composition-pld-random-batch``): the numbers
  ``best`` uses, computed once.
* Host accountants (:mod:`.hosts`) are shown as a user would call them and never
  counted: best must not change with the optional hosts installed.
* An unproven bound is listed with its proof status and computed only when asked
  for by name (``unproven=``); it never enters a best line.
* The best line of each relation is :func:`lastiter_plugins.evaluation.best_of` over
  the rows of that relation: for the declared relation it is ``lp.epsilon("best")``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lastiter_plugins import api, evaluation, registry
from lastiter_plugins.compare import hosts
from lastiter_plugins.compare.rows import BestLine, Comparison, Row, catching, host_log
from lastiter_plugins.config import LossAssumptions, Relation, TrainingConfig
from lastiter_plugins.evaluation import BoundEvaluation
from lastiter_plugins.feasibility import warn_if_impossible
from lastiter_plugins.registry import Protects
from lastiter_plugins.scenarios import DEFAULT_DELTA
from lastiter_plugins.validation import validate_delta, validate_orders

# ---------------------------------------------------------------- registry rows


def evaluate_rows(
    cfg: TrainingConfig, a: LossAssumptions, delta: float, orders: np.ndarray | None, unproven: Iterable[str] = ()
) -> dict[str, tuple[BoundEvaluation, tuple[str, ...]]]:
    """Every bound of the table, each under the relation it is proven for with this sampling, with the
    warnings it raised (an optimal order at the grid's edge). One bound at a time, so each warning
    reaches the row of the bound it concerns."""
    asked = set(unproven)
    out = {}
    for spec in registry.BOUNDS.values():
        out[spec.id] = catching(
            functools.partial(
                evaluation.evaluate_bound,
                spec,
                cfg,
                a,
                delta,
                orders,
                compute_unproven=spec.id in asked,
                under_own_relation=True,
            )
        )
    return out


def _registry_row(e: BoundEvaluation, notes: tuple[str, ...], declared: Relation, published_only: bool) -> Row:
    if e.applies and not e.proof.proven and e.result is None:
        notes += (f"unproven: computed only when asked for by name (--unproven {e.bound}).",)
    return Row(
        id=e.bound,
        label=e.bound,
        kind="last-iterate bound" if e.protects is Protects.FINAL_MODEL else "composition",
        valid=e.applies,
        why_not=tuple(u.condition for u in e.unmet) or e.reasons,  # the reference is cited once, in its field
        covers=tuple(s.value for s in e.covers),
        relation=(e.relation or declared).value,
        assumptions=e.assumptions,
        epsilon=e.epsilon,
        order=e.order,
        protects=e.protects.value,
        reference=e.reference,
        # in its relation's best line (a row with no relation covers no sampling here: it does not apply)
        counted=e.relation is not None
        and evaluation.counts_for_best(e, e.relation, published_only)
        and e.result is not None,
        proof=str(e.proof),
        provenance=e.provenance,
        notes=e.notes + notes,
        first_unmet=e.unmet[0].short if e.unmet else "",
    )


def _sorted(rows: list[Row]) -> list[Row]:
    """Valid rows with a number first, by epsilon; the others keep the table's order."""

    def key(item: tuple[int, Row]):
        index, row = item
        if row.valid and row.epsilon is not None:
            return (0, row.epsilon, index)
        return (1, 0.0, index)

    return [row for _, row in sorted(enumerate(rows), key=key)]


def _rows(
    config: TrainingConfig,
    evaluated: Mapping[str, tuple[BoundEvaluation, tuple[str, ...]]],
    delta: float,
    orders: np.ndarray | None,
    published_only: bool = False,
) -> tuple[Row, ...]:
    bounds = [_registry_row(e, notes, config.relation, published_only) for e, notes in evaluated.values()]
    return (*_sorted(bounds), *_sorted(hosts.host_rows(config, delta, orders)))


def compare_rows(
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    unproven: Iterable[str] = (),
) -> tuple[Row, ...]:
    """Every registry bound and every installed host accountant, in a fixed order.

    Registry bounds come first, then host accountants; within each group valid rows
    are sorted by epsilon, the others keep the table's order. ``unproven`` names
    unproven bounds whose numbers are asked for (shown, never counted).
    """
    delta = validate_delta(delta)
    grid = None if orders is None else validate_orders(orders)
    with host_log():  # host libraries' log records are dropped here (compare() keeps them)
        return _rows(config, evaluate_rows(config, assumptions, delta, grid, unproven), delta, grid)


# ---------------------------------------------------------------- best lines


def best_lines(
    config: TrainingConfig,
    evaluations: Iterable[BoundEvaluation],
    assumptions: LossAssumptions | None = None,
    *,
    lower_bound: bool = True,
    published_only: bool = False,
) -> tuple[BestLine, ...]:
    """The best line of each neighbouring relation (the pipeline's relation first: declared, or the
    sampling scheme's default).

    Each is :func:`lastiter_plugins.evaluation.best_of` over the registry's evaluations
    of that relation (for the declared one: what ``lp.epsilon("best")`` returns), with the
    smallest every-iterate number of the same relation beside it. A relation with no valid
    bound is listed only when it is the declared one. With ``assumptions``, each line also
    carries its lower bound (:func:`lastiter_plugins.evaluation.with_lower_bound`, under that
    line's relation; unless ``lower_bound`` is False) and, when its winner is this library's
    derivation, what ``best`` gives over published theorems only
    (:func:`lastiter_plugins.evaluation.published_note`). ``published_only``: each line is ``best`` over the
    rows whose proof is a published theorem for this pipeline (``published_only=True`` of the API).
    """
    evaluations = list(evaluations)
    out = []
    for relation in (config.relation, *(r for r in Relation if r is not config.relation)):
        winner = evaluation.best_of(evaluations, relation, published_only)
        if winner is None:
            if relation is config.relation:
                out.append(BestLine(relation.value, True, None, None, None, None, "no valid accountant"))
            continue
        every = evaluation.best_of((e for e in evaluations if e.protects is Protects.EVERY_ITERATE), relation)
        counted = [
            e.bound
            for e in evaluations
            if evaluation.counts_for_best(e, relation, published_only) and e.result is not None
        ]
        at_relation = config.replace(relation=relation)
        lower = (
            None
            if assumptions is None or not lower_bound
            else evaluation.with_lower_bound(winner, at_relation, assumptions)
        )
        alt = None if assumptions is None else evaluation.published_best(winner, at_relation, assumptions)
        published = "" if assumptions is None else evaluation.published_note_of(winner, alt)
        alt = None if alt is None or alt.winner == winner.winner else alt
        out.append(
            BestLine(
                lower_bound=None if lower is None else lower.lower_bound,
                lower_bound_note="" if lower is None else lower.lower_bound_note,
                relation=relation.value,
                declared=relation is config.relation,
                epsilon=winner.epsilon,
                winner=winner.winner,
                order=winner.order,
                protects=winner.protects.value,
                how=f"smallest epsilon of {'the published theorems ' if published_only else ''}" + ", ".join(counted),
                every_iterate_epsilon=None if every is None else every.epsilon,
                every_iterate_winner=None if every is None else every.winner,
                provenance=winner.provenance,
                published_note=published,
                published_epsilon=None if alt is None else alt.epsilon,
                published_winner=None if alt is None else alt.winner,
            )
        )
    return tuple(out)


def compare(
    delta: float = DEFAULT_DELTA,
    orders: Sequence[float] | np.ndarray | None = None,
    *,
    name: str = "custom scenario",
    unproven: Iterable[str] = (),
    lower_bound: bool = True,
    published_only: bool = False,
    **params: Any,
) -> Comparison:
    """The side-by-side comparison for the keyword-API ``params`` (see :func:`lastiter_plugins.api.build`).

    Pure: the same scenario gives the same :class:`Comparison`. ``unproven`` names
    unproven bounds whose numbers are shown (marked, never counted). ``lower_bound``: each
    best line carries the exact epsilon of an instance meeting the declarations (up to about
    a second per relation; docs/derivations/lower-end.md#lower-end). ``published_only``: the best
    lines are over published theorems only; every row is still shown. The relation left out is the
    sampling scheme's default (:data:`lastiter_plugins.config.DEFAULT_RELATION`); the comparison's
    ``params`` name it.
    """
    config, assumptions = api.build(**params)
    impossible = warn_if_impossible(config, assumptions)  # warned first, and the answer's first line
    params = {**params, "relation": config.relation.value}
    delta = validate_delta(delta)
    grid = None if orders is None else validate_orders(orders)  # None: the library's lossless default conversion
    with host_log() as log:  # kept in the Comparison: ``lastiter compare --verbose`` prints it
        evaluated = evaluate_rows(config, assumptions, delta, grid, unproven)
        rows = _rows(config, evaluated, delta, grid, published_only)
    return Comparison(
        name=name,
        params=dict(params),
        delta=delta,
        steps=config.steps,
        steps_per_epoch=config.steps_per_epoch,
        rows=rows,
        best=best_lines(
            config,
            (e for e, _ in evaluated.values()),
            assumptions,
            lower_bound=lower_bound,
            published_only=published_only,
        ),
        published_only=published_only,
        impossible=impossible or "",
        hosts=hosts.host_versions(),
        host_log=tuple(log),
    )
