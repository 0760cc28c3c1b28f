r"""The one evaluation path: every bound of the table for one pipeline.

:func:`evaluate_all` returns one immutable :class:`BoundEvaluation` per bound
(applies or why not, relation, proof status, what it protects, kind, reference,
and, where it applies and was asked for, its RDP curve and (epsilon, delta)).
``best``, ``compare``, the CLI, the adapters' reports and ``applicable_bounds``
all read these results; nothing else decides whether a bound applies or what
its number means.

Rules kept here:

* A bound that does not apply has no number.
* An unproven bound (``Proof.proven`` False) is computed only when asked for by
  name; it never enters ``best``; its results carry ``unproven: <reason>``.
* ``best`` is the smallest epsilon over its candidates: the proven bounds that
  apply to the pipeline with the declared relation. :func:`counts_for_best` is
  the one rule, :func:`best_candidates` the one candidate set (the API, calibration,
  advice, compare and every adapter use them), :func:`best_of` the one minimum.
  Each candidate is a valid (epsilon, delta) guarantee for that relation, so the
  minimum is one too.
* Inputs are trusted here: the public edge (the API, the CLI, the adapters' entry
  points) validates them once (:mod:`lastiter_plugins.validation`).
* A bound with a proven lower estimate (a PLD row) is computed for ``best`` only
  when that estimate is not above the best so far: a bound whose epsilon is
  provably larger cannot be the minimum (docs/derivations/baselines.md#skip-pld-rows).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from lastiter_plugins import overflow, registry
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, warn_at_caller
from lastiter_plugins.conversion import (
    delta_of_linear_rdp,
    epsilon_lower_estimate,
    epsilon_of_linear_rdp,
    monotone_envelope,
    refine_delta,
    refine_epsilon,
)
from lastiter_plugins.errors import BoundBelowTruthError, NotApplicableError
from lastiter_plugins.profiles import GaussianMixtureProfile
from lastiter_plugins.registry import BoundSpec, Kind, PrivacyProfile, Proof, Protects
from lastiter_plugins.summary import Answer, answer_lines, cut_words
from lastiter_plugins.validation import validate_delta, validate_orders

BEST = registry.BEST


@dataclasses.dataclass(frozen=True)
class EpsilonResult:
    r"""An (epsilon, delta) guarantee with everything needed to read it honestly.

    Read its fields (``result.epsilon``, ``result.order``); ``float(result)`` is the epsilon. Unpacking
    it as the pair ``(epsilon, order)`` of version 0.1 (``eps, order = lp.epsilon(...)``,
    ``lp.epsilon(...)[0]``) still works but is deprecated (a ``DeprecationWarning``) and will be removed
    in 1.0.

    Attributes:
      bound: the bound asked for (a bound id or ``best``).
      epsilon: epsilon at ``delta`` (``inf`` when the guarantee is vacuous).
      delta: the delta asked for.
      order: the Renyi order of the conversion (None for a privacy profile, converted exactly).
      relation: the neighbouring relation of the guarantee.
      sampling: the sampling scheme of the pipeline.
      winner: the bound that gave the number (== bound unless bound is ``best``).
      reference: the winner's citation.
      steps: optimizer steps of the run.
      proof: how the winner is justified.
      protects: what the number covers (the final model only, or every iterate).
      kind: the kind of guarantee the winner computes.
      lower_bound: when asked for (``lower_bound=True``), the exact epsilon at ``delta`` of an explicit
        instance meeting every declaration for the same pipeline (the lower end of its certified
        interval): the worst case over the models meeting the declarations lies in
        ``[lower_bound, epsilon]``. None when not asked for or when no instance fits.
      lower_bound_note: the instance, or why ``lower_bound`` is None (empty when not asked for).
      published: whether the winner's proof is a published theorem for this pipeline (False: this
        library's derivation, see ``provenance``).
      provenance: one line, ``published: <authors, venue, theorem>`` or ``derived here: <docs section;
        the independent checks it passed>``.
      order_secret: the pipeline's ``order_secret`` (False: the batches were public; printed as
        "(public order)" beside the sampling).
      max_batch_size: the pipeline's ``max_batch_size`` (batches cut at that many examples, the delta carrying
        the overflow probability: docs/derivations/fixed-length-batches.md), None when batches are never cut.
    """

    bound: str
    epsilon: float
    delta: float
    order: float | None
    relation: Relation
    sampling: Sampling
    winner: str
    reference: str
    steps: int
    proof: Proof = registry.PROVEN
    protects: Protects = Protects.FINAL_MODEL
    kind: Kind = Kind.RDP
    lower_bound: float | None = None
    lower_bound_note: str = ""
    published: bool = True
    provenance: str = ""
    order_secret: bool = True  # False: the pipeline's batches were drawn from a public seed
    max_batch_size: int | None = None  # the batches were cut at this many examples (None: never)

    def __float__(self) -> float:
        """The epsilon, so ``float(result)`` works where a number is expected."""
        return float(self.epsilon)

    def _as_pair(self) -> tuple[float, float | None]:
        warnings.warn(
            "using an EpsilonResult as the pair (epsilon, order) is deprecated and will be removed in 1.0; read "
            "result.epsilon and result.order",
            DeprecationWarning,
            stacklevel=3,
        )
        return (self.epsilon, self.order)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._as_pair())

    def __getitem__(self, index: int) -> Any:
        return self._as_pair()[index]

    def __len__(self) -> int:
        return len(self._as_pair())

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite numbers become None)."""
        return {
            "bound": self.bound,
            "winner": self.winner,
            "epsilon": _finite_or_none(self.epsilon),
            "delta": self.delta,
            "order": self.order,
            "relation": self.relation.value,
            "sampling": self.sampling.value,
            "order_secret": self.order_secret,
            "max_batch_size": self.max_batch_size,
            "steps": self.steps,
            "protects": self.protects.value,
            "proof": str(self.proof),
            "kind": self.kind.value,
            "reference": self.reference,
            "published": self.published,
            "provenance": self.provenance,
            "lower_bound": None if self.lower_bound is None else float(self.lower_bound),
            "lower_bound_note": self.lower_bound_note or None,
        }

    def __str__(self) -> str:
        """The answer first, in a few lines (:func:`lastiter_plugins.summary.answer_lines`); :meth:`explain`
        adds the reference, the whole provenance, the order and the lower end's instance."""
        answer = dataclasses.replace(Answer.of(self), lower_bound=None)  # the lower end: tightness_line, explain()
        return "\n".join(answer_lines(answer))

    def explain(self) -> str:
        """Everything behind the answer: :meth:`__str__`, then the bound asked for, the run, the Renyi order of
        the conversion, the winner's reference and whole provenance, and the lower end with its instance."""
        return "\n".join([str(self), *self.details()])

    def details(self) -> list[str]:
        """The lines :meth:`explain` adds under the answer."""
        order = f"; Renyi order of the conversion {self.order:g}" if self.order is not None else ""
        proof = "" if self.proof.proven else f"; {self.proof}"
        lines = [
            f"Asked for: {self.bound}; the run: sampling {self.sampling.value}"
            f"{'' if self.order_secret else ' (public order)'}{cut_words(self.max_batch_size)}, {self.steps} steps; "
            "kind "
            f"{self.kind.value}{order}{proof}.",
            f"Reference ({self.winner}): {self.reference}.",
        ]
        if self.max_batch_size is not None:
            lines.append(
                f"Batches cut at {self.max_batch_size} examples: the delta includes (1 + e^epsilon) times the "
                "probability that some step's batch exceeded them (docs/derivations/fixed-length-batches.md)."
            )
        if self.provenance:
            lines.append(f"Proof: {self.provenance}.")
        if self.tightness_line:
            lines.append(self.tightness_line)
        return lines

    @property
    def tightness_line(self) -> str:
        """ "the worst case over models meeting your declarations lies in [lower, upper]", or why no lower
        end is known; empty when the lower bound was not asked for."""
        if not self.lower_bound_note:
            return ""
        if self.lower_bound is None:
            return f"How tight: no lower end ({self.lower_bound_note})."
        return (
            f"How tight: the worst case over models meeting your declarations lies in "
            f"[{self.lower_bound:.4g}, {self.epsilon:.4g}] (lower end: {self.lower_bound_note})."
        )


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclasses.dataclass(frozen=True)
class BoundEvaluation:
    """One bound of the table evaluated for one pipeline.

    ``result``, ``rdp`` and ``profile`` are None when the bound does not apply,
    when no delta was asked for, when the bound is unproven and was not asked
    for by name, or when ``best`` did not need it (a note says why). An RDP bound
    carries its curve on ``orders``; an f-DP (GDP) bound carries its privacy
    ``profile``, and ``rdp`` is the RDP that profile implies (computed when read:
    the epsilon does not need it); a PLD bound carries its profile and no RDP.
    """

    bound: str
    title: str
    applies: bool
    reasons: tuple[str, ...]
    relation: Relation | None
    proof: Proof
    protects: Protects
    kind: Kind
    reference: str
    assumptions: str
    covers: tuple[Sampling, ...]
    orders: tuple[float, ...] | None = None
    rdp_values: tuple[float, ...] | None = None
    profile: PrivacyProfile | None = None
    result: EpsilonResult | None = None
    notes: tuple[str, ...] = ()
    unmet: tuple[registry.Unmet, ...] = ()  # the failed conditions as data (``reasons`` in words)
    published: bool = True  # the proof is a published theorem for this pipeline (else this library's derivation)
    provenance: str = ""  # ``published: ...`` or ``derived here: ...`` for this pipeline

    @property
    def rdp(self) -> tuple[float, ...] | None:
        """The RDP curve on ``orders`` (nats); for a GDP bound, the RDP its profile implies; None for a PLD bound."""
        if self.kind is Kind.GDP and isinstance(self.profile, GaussianMixtureProfile) and self.orders is not None:
            return tuple(self.profile.rdp(np.asarray(self.orders)).tolist())  # every GDP row's profile is one
        return self.rdp_values

    @property
    def reason(self) -> str:
        """Every violated condition, in one string (empty when the bound applies)."""
        return " ".join(self.reasons)

    @property
    def epsilon(self) -> float | None:
        return None if self.result is None else self.result.epsilon

    @property
    def order(self) -> float | None:
        return None if self.result is None else self.result.order


# ---------------------------------------------------------------- one bound


def _epsilon_of(
    spec: BoundSpec,
    cfg: TrainingConfig,
    a: LossAssumptions,
    delta: float,
    orders: np.ndarray,
    curve: np.ndarray,
    default_orders: bool,
) -> tuple[float, float | None]:
    """(epsilon, order) of one applicable bound whose curve on ``orders`` is ``curve``.

    Lossless (docs/derivations/conversion.md#lossless-conversion): an RDP curve linear in the order converts at the
    continuous optimum over all
    orders when the default grid is used; any other curve, raised to its running maximum over the orders
    (docs/derivations/lower-estimates.md#few-orders: valid, and free on a non-decreasing curve), is refined between the
    grid orders by
    evaluating the bound itself at new orders (every candidate is a valid epsilon; the search can only
    return one of them).
    """
    if _converts_in_closed_form(spec, default_orders):
        return epsilon_of_linear_rdp(float(np.max(curve / orders)), delta)  # max: rho*alpha >= curve on the grid
    raised_at, raised = monotone_envelope(lambda new: registry.rdp_curve(spec, cfg, a, new), orders, curve)
    return refine_epsilon(raised_at, orders, raised, delta)


def _delta_of(
    spec: BoundSpec, cfg: TrainingConfig, a: LossAssumptions, eps: float, orders: np.ndarray, default_orders: bool
) -> tuple[float, float | None]:
    """(delta, order) at ``eps`` of one applicable bound, the counterpart of :func:`_epsilon_of`: a privacy
    profile exactly (order None); a curve linear in the order at the continuous optimum over all orders
    (default grid), on the line the epsilon side uses; any other curve refined between the grid orders by
    evaluating the bound at new orders (the curve itself: every RDP value is valid, no envelope needed). Batches cut
    at ``max_batch_size``: the uncut run's delta plus (1 + e^eps) times the overflow probability (Lemma C of
    docs/derivations/fixed-length-batches.md)."""
    if cfg.max_batch_size is not None:
        uncut, _ = _delta_of(spec, cfg.replace(max_batch_size=None), a, eps, orders, default_orders)
        return overflow.cut_delta(uncut, eps, overflow.overflow_probability(cfg)), None
    if spec.profile is not None:
        return min(float(spec.profile(cfg, a).delta(eps)), 1.0), None
    curve = registry.rdp_curve(spec, cfg, a, orders)
    if _converts_in_closed_form(spec, default_orders):
        return delta_of_linear_rdp(float(np.max(curve / orders)), eps)
    return refine_delta(lambda new: registry.rdp_curve(spec, cfg, a, new), orders, curve, eps)


def _converts_in_closed_form(spec: BoundSpec, default_orders: bool) -> bool:
    return spec.linear_in_order and default_orders


def _has_grid_estimate(spec: BoundSpec, default_orders: bool) -> bool:
    """A Renyi row whose epsilon is refined from its curve: docs/derivations/lower-estimates.md#few-orders's estimate
    bounds it from below."""
    return spec.lower_estimate is None and spec.profile is None and not _converts_in_closed_form(spec, default_orders)


def _result(
    spec: BoundSpec, cfg: TrainingConfig, base: BoundEvaluation, eps: float, delta: float, order: float | None
) -> EpsilonResult:
    """The row's result, with the provenance its evaluation ``base`` already worked out for the pipeline."""
    return EpsilonResult(
        bound=spec.id,
        epsilon=eps,
        delta=delta,
        order=order,
        relation=cfg.relation,
        sampling=cfg.sampling,
        order_secret=cfg.order_secret,
        winner=spec.id,
        reference=spec.reference,
        steps=cfg.steps,
        proof=spec.proof,
        protects=spec.protects,
        kind=spec.kind,
        published=base.published,
        provenance=base.provenance,
    )


def evaluate_bound(
    spec: BoundSpec,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float | None = None,
    orders: np.ndarray | None = None,
    *,
    compute_unproven: bool = False,
    under_own_relation: bool = False,
    beat: float | None = None,
) -> BoundEvaluation:
    """Evaluate one bound for one pipeline (see :class:`BoundEvaluation`).

    Args:
      spec: the table row.
      config, assumptions: the validated pipeline.
      delta: compute (epsilon, delta) and the RDP curve; None: applicability only.
      orders: Renyi orders (default: the library's grid).
      compute_unproven: compute the numbers of an unproven bound (asked for by name).
      under_own_relation: evaluate the bound under the relation it is proven for
        with this sampling (compare shows every bound so), not the declared one.
      beat: the best epsilon so far; a bound with a proven lower estimate above it
        is not computed (it cannot be the minimum), and says so in its notes.
    """
    native = spec.relation_for(config.sampling)
    if under_own_relation and native is not None:
        config = config.replace(relation=native)
    if config.max_batch_size is not None:
        uncut = evaluate_bound(
            spec,
            config.replace(max_batch_size=None),
            assumptions,
            delta,
            orders,
            compute_unproven=compute_unproven,
            beat=beat,
        )
        return _with_cut_batches(spec, config, assumptions, uncut, delta, orders)
    check = registry.applicability(spec, config, assumptions)
    base = BoundEvaluation(
        bound=spec.id,
        title=spec.title,
        applies=check.applies,
        reasons=check.reasons,
        unmet=check.unmet,
        relation=check.relation,
        proof=spec.proof,
        protects=spec.protects,
        kind=spec.kind,
        reference=spec.reference,
        assumptions=spec.assumptions,
        covers=tuple(spec.covers),
        published=_provenance(spec).why_derived(config, assumptions) is None,
        provenance=_provenance(spec).describe(config, assumptions),
    )
    if not check.applies or delta is None or not (spec.proof.proven or compute_unproven):
        return base
    default_orders = orders is None
    orders = validate_orders(None) if orders is None else orders
    lower = None
    if beat is not None and spec.lower_estimate is not None:
        lower = spec.lower_estimate(config, assumptions, delta, beat)
    elif beat is not None and _has_grid_estimate(spec, default_orders):
        lower = epsilon_lower_estimate(
            lambda new: registry.estimate_curve(spec, config, assumptions, new), orders, delta, beat
        )
    if lower is not None and beat is not None and lower > beat:
        return dataclasses.replace(
            base,
            notes=(
                f"not computed: a proven lower bound on its epsilon ({lower:.4g}) is above the best so far "
                f"({beat:.4g}), so it cannot change best.",
            ),
        )
    if spec.profile is not None:
        profile = spec.profile(config, assumptions)
        return dataclasses.replace(
            base,
            orders=tuple(orders.tolist()) if spec.kind is Kind.GDP else None,
            profile=profile,
            result=_result(spec, config, base, profile.epsilon(delta), delta, None),
        )
    curve = registry.rdp_curve(spec, config, assumptions, orders)
    eps, order = _epsilon_of(spec, config, assumptions, delta, orders, curve, default_orders)
    return dataclasses.replace(
        base,
        orders=tuple(orders.tolist()),
        rdp_values=tuple(curve.tolist()),
        result=_result(spec, config, base, eps, delta, order),
    )


def _with_cut_batches(
    spec: BoundSpec,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    uncut: BoundEvaluation,
    delta: float | None,
    orders: np.ndarray | None,
) -> BoundEvaluation:
    """``uncut`` (the row evaluated for the run whose batches are never cut) turned into the row for ``config``,
    whose batches are cut at ``max_batch_size``: its privacy profile's delta carries the overflow probability
    (docs/derivations/fixed-length-batches.md, Lemma C), and it has no Renyi curve (part 5)."""
    if uncut.result is None or delta is None:
        return uncut
    p = overflow.overflow_probability(config)
    if uncut.profile is not None:
        inner = uncut.profile
        profile = overflow.CutProfile(inner.epsilon, inner.delta, p)
    else:
        plain = config.replace(max_batch_size=None)
        default_orders = orders is None
        grid = validate_orders(None) if orders is None else orders
        curve = np.asarray(uncut.rdp_values, dtype=float)
        profile = overflow.CutProfile(
            lambda d: _epsilon_of(spec, plain, assumptions, d, grid, curve, default_orders)[0],
            lambda e: _delta_of(spec, plain, assumptions, e, grid, default_orders)[0],
            p,
        )
    eps = profile.epsilon(delta)
    added = overflow.added_delta(eps, p)
    note = (
        f"batches cut at max_batch_size = {config.max_batch_size}: delta includes {added:.3g}, the probability "
        f"{p:.3g} that some step's batch exceeded it times 1 + e^epsilon (docs/derivations/fixed-length-batches.md)."
    )
    assert uncut.result is not None
    result = dataclasses.replace(uncut.result, epsilon=eps, order=None, max_batch_size=config.max_batch_size)
    return dataclasses.replace(
        uncut, orders=None, rdp_values=None, profile=profile, result=result, notes=(*uncut.notes, note)
    )


def evaluate_all(
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float | None = None,
    orders: np.ndarray | None = None,
    *,
    unproven: Iterable[str] = (),
    under_own_relation: bool = False,
) -> dict[str, BoundEvaluation]:
    """Every bound of the table for one pipeline, in table order (a public function: validates
    ``delta`` and ``orders``).

    Args:
      delta: compute numbers at this delta (None: applicability only).
      orders: Renyi orders (default grid).
      unproven: ids of unproven bounds whose numbers are asked for by name.
      under_own_relation: see :func:`evaluate_bound`.
    """
    if delta is not None:
        delta = validate_delta(delta)
    orders = None if orders is None else validate_orders(orders)
    asked = set(unproven)
    return {
        bid: evaluate_bound(
            spec,
            config,
            assumptions,
            delta,
            orders,
            compute_unproven=bid in asked,
            under_own_relation=under_own_relation,
        )
        for bid, spec in registry.BOUNDS.items()
    }


# ---------------------------------------------------------------- best


def counts_for_best(e: BoundEvaluation, relation: Relation, published_only: bool = False) -> bool:
    """The one rule for a candidate of ``best``: the row applies to the pipeline with ``relation`` (its
    sampling scheme, relation and every precondition) and its proof is proven; with ``published_only``,
    also a published theorem for this pipeline (not this library's derivation). Rows evaluated under
    their own relation (compare) count only for the relation they were evaluated under."""
    return e.applies and e.proof.proven and e.relation is relation and (e.published or not published_only)


def best_candidates(
    config: TrainingConfig, assumptions: LossAssumptions, published_only: bool = False
) -> tuple[BoundSpec, ...]:
    """The rows ``best`` takes its minimum over for this pipeline, in table order (possibly none).

    The one candidate set: evaluation, the API, calibration, advice and every adapter read it.
    """
    return tuple(
        spec
        for spec in registry.BOUNDS.values()
        if counts_for_best(evaluate_bound(spec, config, assumptions), config.relation, published_only)
    )


def best_of(
    evaluations: Iterable[BoundEvaluation], relation: Relation, published_only: bool = False
) -> EpsilonResult | None:
    """The winner's result among evaluated bounds: the smallest epsilon over the candidates of ``best`` for
    ``relation`` (:func:`counts_for_best`) that carry a number (ties: the first bound id in alphabetical
    order); None if none. Its ``winner`` is the row's id.

    The one minimum: :func:`best_result`, compare's best lines and the reports use it.
    """
    numbered = [e.result for e in evaluations if e.result is not None and counts_for_best(e, relation, published_only)]
    return min(numbered, key=lambda r: (r.epsilon, r.winner)) if numbered else None


def _no_bound_applies(
    config: TrainingConfig, evaluations: dict[str, BoundEvaluation], published_only: bool = False
) -> NotApplicableError:
    # the reason of a bound that covers this sampling says more than "sampling must be ..."
    covering = [e.reason for e in evaluations.values() if not e.applies and config.sampling in e.covers]
    reasons = covering or [e.reason for e in evaluations.values() if not e.applies]
    if published_only:
        reasons += [
            f"{e.bound} applies, but it is {e.provenance}."
            for e in evaluations.values()
            if e.applies and not e.published
        ]
    last = reasons[-1] if reasons else ""
    which = "proven bound with a published proof" if published_only else "proven bound"
    return NotApplicableError(
        f"no {which} applies to sampling={config.sampling.value} with relation={config.relation.value} "
        f"(best: the smallest epsilon over the proven bounds valid for the pipeline; see {registry.DOCS}): {last}"
    )


def _require_published(spec: BoundSpec, config: TrainingConfig, assumptions: LossAssumptions) -> None:
    why = _provenance(spec).why_derived(config, assumptions)
    if why is not None:
        raise NotApplicableError(
            f"{spec.id} is this library's derivation for this pipeline ({why}), not a published theorem "
            f"(published_only=True): {_provenance(spec).describe(config, assumptions)}."
        )


def _provenance(spec: BoundSpec) -> registry.Provenance:
    """The row's provenance: every row of the table has one (the table checks it when it is built)."""
    if spec.provenance is None:
        raise AssertionError(f"{spec.id} has no provenance")
    return spec.provenance


def best_result(
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float,
    orders: np.ndarray | None = None,
    published_only: bool = False,
) -> EpsilonResult:
    """The smallest epsilon at ``delta`` over the proven bounds valid for the pipeline and its relation
    (``published_only``: over those whose proof is a published theorem)."""
    evaluations = evaluate_for_best(config, assumptions, delta, orders, published_only)
    winner = best_of(evaluations.values(), config.relation, published_only)
    if winner is None:
        raise _no_bound_applies(config, evaluations, published_only)
    return dataclasses.replace(winner, bound=BEST)


def evaluate_for_best(
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float,
    orders: np.ndarray | None = None,
    published_only: bool = False,
) -> dict[str, BoundEvaluation]:
    """Every bound of the table, in table order, as :func:`evaluate_all` with ``delta``, except that a
    bound with a proven lower estimate is computed only when that estimate is not above the best so
    far (it says so in its notes otherwise). The minimum and the winner are the same.

    Order: the rows without an estimate (privacy profiles, curves linear in the order) first, then
    the Renyi rows refined from their curve (docs/derivations/lower-estimates.md#few-orders's estimate from a few
    orders), then the rows
    with their own estimate (the PLD rows, liang-bounded), each against the best so far.
    """
    default_orders = orders is None
    barred = [bid for bid, spec in registry.BOUNDS.items() if _has_grid_estimate(spec, default_orders)]
    barred += [bid for bid, spec in registry.BOUNDS.items() if spec.lower_estimate is not None]
    out = {
        bid: evaluate_bound(spec, config, assumptions, delta, orders)
        for bid, spec in registry.BOUNDS.items()
        if bid not in barred
    }
    for bid in barred:
        so_far = best_of(out.values(), config.relation, published_only)
        beat = math.inf if so_far is None else so_far.epsilon
        out[bid] = evaluate_bound(registry.BOUNDS[bid], config, assumptions, delta, orders, beat=beat)
    return {bid: out[bid] for bid in registry.BOUNDS}


def best_rdp(
    config: TrainingConfig, assumptions: LossAssumptions, orders: np.ndarray, published_only: bool = False
) -> np.ndarray:
    """Per-order minimum of the RDP curves of the proven bounds valid for the pipeline and its relation.

    Valid at every order separately (each curve is an RDP bound for the same
    relation), for composing the run with other mechanisms in RDP.
    """
    refuse_curve_of_cut_batches(config)
    candidates = best_candidates(config, assumptions, published_only)
    curves = [registry.rdp_curve(spec, config, assumptions, orders) for spec in candidates if spec.has_renyi_curve]
    if not curves:
        evaluations = evaluate_all(config, assumptions)
        pld = [spec.id for spec in candidates]
        if pld:
            raise NotApplicableError(
                f"no proven bound with a Renyi-DP curve applies to sampling={config.sampling.value} with "
                f"relation={config.relation.value}: {', '.join(pld)} applies, but it has no Renyi curve (a privacy "
                f"loss distribution, or a profile with truncated tails; ask for its epsilon; see {registry.DOCS})."
            )
        raise _no_bound_applies(config, evaluations, published_only)
    return np.min(np.vstack(curves), axis=0)


def refuse_curve_of_cut_batches(config: TrainingConfig) -> None:
    """Raise NotApplicableError for a run whose batches are cut at ``max_batch_size``: it has (epsilon, delta)
    guarantees only (docs/derivations/fixed-length-batches.md, part 5)."""
    if config.max_batch_size is not None:
        raise NotApplicableError(
            f"a run whose batches are cut at max_batch_size = {config.max_batch_size} has no Renyi-DP curve: its "
            "guarantees are (epsilon, delta) pairs, the delta carrying the probability that a batch exceeded it "
            "(docs/derivations/fixed-length-batches.md). Ask for its epsilon or delta instead."
        )


def require_applicable(
    bound: str, config: TrainingConfig, assumptions: LossAssumptions, published_only: bool = False
) -> None:
    """Raise NotApplicableError unless ``bound`` (an id, or ``best``: some proven bound) applies (with a
    published proof, if ``published_only``)."""
    if bound != BEST:
        spec = registry.get_spec(bound)
        registry.require(spec, config, assumptions)
        if published_only:
            _require_published(spec, config, assumptions)
        return
    if not best_candidates(config, assumptions, published_only):
        raise _no_bound_applies(config, evaluate_all(config, assumptions), published_only)


# ---------------------------------------------------------------- unproven rows


class UnprovenBoundWarning(UserWarning):
    """A number of an unproven bound (asked for by name) was stated where no mark can go: it is not a
    privacy guarantee."""


def warn_if_unproven(bound: str) -> None:
    """Warn (:class:`UnprovenBoundWarning`, at the user's line) when ``bound`` is a row whose proof is unproven.

    The rule: a route that states an unproven row's number marks it (``unproven: <reason>``: an
    :class:`EpsilonResult`, a report, a statement), and a route that states it bare (a float, an array: the
    API's ``rdp``, a host accountant's ``get_epsilon``) warns with this. ``best`` never uses such a row.
    """
    spec = registry.BOUNDS.get(bound)
    if spec is not None and not spec.proof.proven:
        warn_at_caller(
            f"{bound} is {str(spec.proof).rstrip('.')}. Its number is not a privacy guarantee; best never uses it.",
            UnprovenBoundWarning,
        )


# ---------------------------------------------------------------- by name


def with_lower_bound(result: EpsilonResult, config: TrainingConfig, assumptions: LossAssumptions) -> EpsilonResult:
    """``result`` with its ``lower_bound`` (docs/derivations/lower-end.md#lower-end).

    A lower end that cannot be computed (no instance fits, too large, an overflow) is None, and
    ``lower_bound_note`` says why: it never becomes ``inf`` and never turns the result into an error.

    Raises:
      BoundBelowTruthError: the lower bound is above a proven bound's epsilon (a bug in that bound).
    """
    from lastiter_plugins.lower_end import LowerBound, lower_bound  # loaded only when a lower end is asked for

    at = result.delta
    if config.max_batch_size is not None:  # the uncut run's instance at delta + (1 + e^U) p (fixed-length, part 5)
        at = overflow.cut_delta(result.delta, result.epsilon, overflow.overflow_probability(config))
        config = config.replace(max_batch_size=None)
    try:
        cut_out = LowerBound(None, "batches cut: delta + (1 + e^epsilon) p, where the uncut instance is read, is 1")
        lower = lower_bound(config, assumptions, at) if at < 1.0 else cut_out
    except (OverflowError, MemoryError, FloatingPointError) as err:
        lower = LowerBound(None, f"the instance's exact epsilon could not be computed ({type(err).__name__}: {err})")
    if lower.epsilon is not None and not math.isfinite(lower.epsilon):
        lower = LowerBound(None, f"the instance's exact epsilon is beyond what can be computed ({lower.note})")
    if lower.epsilon is not None and result.proof.proven and lower.epsilon > result.epsilon * (1 + 1e-9) + 1e-12:
        raise BoundBelowTruthError(
            f"{result.winner} gives epsilon {result.epsilon!r} at delta {result.delta:g}, below the exact epsilon "
            f"{lower.epsilon!r} of an instance meeting every declaration ({lower.note}): a bug in that bound; "
            f"please report it with the pipeline {config} and {assumptions}."
        )
    return dataclasses.replace(result, lower_bound=lower.epsilon, lower_bound_note=lower.note)


def published_note(
    result: EpsilonResult, config: TrainingConfig, assumptions: LossAssumptions, orders: np.ndarray | None = None
) -> str:
    """What the outputs print under a ``best`` (``result``: its winner's result) whose proof is this
    library's derivation: the number ``best`` gives over published theorems only
    (``published_only=True``), or that none applies. Empty when the result rests on a published
    theorem."""
    return published_note_of(result, None if result.published else published_best(result, config, assumptions, orders))


def published_note_of(result: EpsilonResult, published: EpsilonResult | None) -> str:
    """:func:`published_note` from its :func:`published_best` (computed once by a caller that needs both)."""
    if result.published:
        return ""
    if published is None:
        return (
            f"{result.winner} is this library's derivation ({_derived_where(result.provenance)}); no published "
            "theorem applies to this pipeline (published_only=True refuses it)."
        )
    return (
        f"{result.winner} is this library's derivation ({_derived_where(result.provenance)}); over published "
        f"theorems only (published_only=True): {published.epsilon:.4g} via {published.winner} "
        f"({published.provenance.removeprefix('published: ')})."
    )


def published_best(
    result: EpsilonResult, config: TrainingConfig, assumptions: LossAssumptions, orders: np.ndarray | None = None
) -> EpsilonResult | None:
    """``best`` over published theorems only (``published_only=True``) beside ``result``: ``result`` itself when
    its proof is a published theorem, None when no published theorem applies to the pipeline."""
    if result.published:
        return result
    try:
        return best_result(config, assumptions, result.delta, orders, published_only=True)
    except NotApplicableError:
        return None


def _derived_where(provenance: str) -> str:
    """``docs/derivations/<page>#<anchor> ...`` of a ``derived here: ...`` line, without its checks."""
    where = provenance.split(": ", 1)[-1]
    return where.split("; checks:")[0]


def epsilon_result(
    bound: str,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    delta: float,
    orders: np.ndarray | None = None,
    *,
    lower_bound: bool = False,
    published_only: bool = False,
) -> EpsilonResult:
    """(epsilon, delta) of ``bound`` (an id, or ``best``); raises NotApplicableError when it does not apply.

    ``lower_bound``: also compute the result's ``lower_bound`` (:func:`with_lower_bound`).
    ``published_only``: ``best`` over the rows whose proof is a published theorem for this pipeline; a
    named row must be one.
    """
    if bound == BEST:
        result = best_result(config, assumptions, delta, orders, published_only)
    else:
        require_applicable(bound, config, assumptions, published_only)
        spec = registry.get_spec(bound)
        evaluation = evaluate_bound(spec, config, assumptions, delta, orders, compute_unproven=True)
        assert evaluation.result is not None  # it applies and was asked for by name
        result = evaluation.result
    return with_lower_bound(result, config, assumptions) if lower_bound else result


def delta_of(
    bound: str,
    config: TrainingConfig,
    assumptions: LossAssumptions,
    eps: float,
    orders: np.ndarray | None = None,
    published_only: bool = False,
) -> tuple[float, float | None]:
    """(delta, order) at ``eps`` >= 0 of ``bound`` (an id, or ``best``): the counterpart of
    :func:`epsilon_result`. ``best``: the smallest delta over :func:`best_candidates`, each row converted
    as it is for epsilon (:func:`_delta_of`; order None for a privacy profile). Every delta is valid for
    (eps, delta), so their minimum is too.

    Raises:
      NotApplicableError: the named bound does not apply, or (``best``) none does.
    """
    if bound == BEST:
        specs = best_candidates(config, assumptions, published_only)
        if not specs:
            raise _no_bound_applies(config, evaluate_all(config, assumptions), published_only)
    else:
        specs = (registry.get_spec(bound),)
        require_applicable(bound, config, assumptions, published_only)
    default_orders = orders is None
    grid = validate_orders(None) if orders is None else orders
    best: tuple[float, float | None] = (1.0, None)
    for spec in specs:
        found = _delta_of(spec, config, assumptions, float(eps), grid, default_orders)
        if found[0] < best[0]:
            best = found
    return best


def rdp_of(
    bound: str, config: TrainingConfig, assumptions: LossAssumptions, orders: np.ndarray, published_only: bool = False
) -> np.ndarray:
    """RDP curve of ``bound`` (an id, or ``best``) at ``orders``; raises NotApplicableError when it does not apply."""
    if bound == BEST:
        return best_rdp(config, assumptions, orders, published_only)
    refuse_curve_of_cut_batches(config)
    spec = registry.get_spec(bound)
    require_applicable(bound, config, assumptions, published_only)
    return registry.rdp_curve(spec, config, assumptions, orders)
