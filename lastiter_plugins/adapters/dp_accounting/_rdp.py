r"""``LastIterateAccountant``: a ``dp_accounting.PrivacyAccountant`` that composes last-iterate DP-SGD runs
(:class:`LastIterateDpSgdEvent`) with dp-accounting's standard events in Renyi DP.

A last-iterate event contributes ``count`` times its RDP curve (:func:`lastiter_plugins.rdp` for the
accountant's bound and neighbouring relation); every other event (Gaussian, Laplace, Poisson / without-
replacement sampled, RepeatAndSelect, ZCDp on 0.6, ...) is delegated to dp-accounting's
``rdp.RdpAccountant`` with the same orders and relation. A ledger holding one run and nothing else is
answered exactly as :func:`lastiter_plugins.epsilon` answers for it (lossless, f-DP bounds included; its
delta by :func:`lastiter_plugins.host.delta_of`); any composition is converted from the summed RDP on the
order grid (:func:`lastiter_plugins.host.rdp_to_epsilon`).

Why runs compose additively in RDP: every bound of the library holds for an arbitrary initial iterate, the
same under both neighbouring datasets (inside the projection set for the bounded-domain bounds). A later run
or mechanism may depend on what was released before: conditioned on those outputs, its starting point is
fixed, so RDP's adaptive composition (Mironov 2017, Prop. 1) bounds the order-alpha divergence of the joint
release by the sum of the per-mechanism values. The guarantee covers the outputs of the standard mechanisms
and the final model of each run; intermediate iterates of a last-iterate run must not be released.

Neighbouring relation and dp-accounting's Gaussian events: a ``GaussianDpEvent``'s ``noise_multiplier`` is
noise / sensitivity. Under REPLACE_ONE the sum of C-clipped gradients moves by up to 2C when one example is
replaced, so one DP-SGD step with noise z*C is ``GaussianDpEvent(z / 2)`` (google/differential-privacy issue
378). That is the convention of ``RdpAccountant`` (0.4.3 and 0.6), to which standard events are delegated.
dp-accounting 0.6's ``PLDAccountant(REPLACE_ONE)`` applies the factor 2 itself. So ledgers exchanged with it
must be converted; see docs/dp_accounting.md.
"""

import dataclasses
import functools
import warnings
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.adapters.dp_accounting._answer import ledger_answer, statement
from lastiter_plugins.adapters.dp_accounting._events import (
    _HOST_RELATION,
    LastIterateDpSgdEvent,
    _is_zero,
    _parse_relation,
    _to_bound,
)
from lastiter_plugins.adapters.dp_accounting._planning import (
    CompositionErrorDetails,
    _check_count,
    _check_standard,
    _count_problem,
    _EventPlanning,
    _Refusal,
)
from lastiter_plugins.config import Relation, default_relation, warn_at_caller
from lastiter_plugins.validation import number_problem, validate_epsilon, validate_orders

#: The FutureWarning of ``LastIterateAccountant()`` without ``neighboring_relation`` (until 0.4.0).
_DEFAULT_CHANGED = (
    "LastIterateAccountant() without neighboring_relation accounts under ADD_OR_REMOVE_ONE, the default of "
    "dp-accounting's own accountants, since lastiter-plugins 0.3.0 (0.2.0 used REPLACE_ONE, which gives a larger "
    "epsilon for Poisson runs; cyclic, shuffle_once, reshuffle and random_batch runs have bounds under "
    "REPLACE_ONE only and are refused under ADD_OR_REMOVE_ONE). Pass "
    "neighboring_relation=NeighboringRelation.REPLACE_ONE to keep the 0.2.0 numbers, or "
    "NeighboringRelation.ADD_OR_REMOVE_ONE to silence this warning, which goes in 0.4.0."
)


def _relation_hint(event: Any, relation: Relation) -> str:
    """What to pass when a run is refused under a relation other than its sampling scheme's default."""
    try:
        native = default_relation(event.sampling.value)
    except (AttributeError, ValueError):
        return ""
    if native is relation:
        return ""
    return (
        f". Runs with sampling={event.sampling.value} are accounted under {native.value}: pass "
        f"neighboring_relation=NeighboringRelation.{native.name} to the accountant"
    )


def _host_rdp_uncached(event: Any, orders: tuple[float, ...], relation: Any) -> np.ndarray:
    accountant = _dp_rdp.RdpAccountant(list(orders), relation)
    error = accountant._maybe_compose(event, 1, False)  # the host's own dry run
    if error is not None:
        raise _Refusal(error.invalid_event if error.invalid_event is not None else event, error.error_message)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            accountant.compose(event)
    except (ArithmeticError, AssertionError, TypeError, ValueError) as exc:
        raise _Refusal(
            event,
            f"dp-accounting's RdpAccountant failed on it, its parameters are invalid ({type(exc).__name__}: {exc})",
        ) from None
    curve = np.array(accountant.rdp, dtype=float)
    # Never optimistic: a NaN or a negative value (numerical trouble in the host
    # at extreme parameters) becomes +inf, which the conversion simply ignores.
    curve[np.isnan(curve) | (curve < 0)] = np.inf
    curve.setflags(write=False)
    return curve


@functools.lru_cache(maxsize=256)
def _host_rdp_cached(event: Any, orders: tuple[float, ...], relation: Any) -> np.ndarray:
    return _host_rdp_uncached(event, orders, relation)


def _host_rdp(event: Any, orders: tuple[float, ...], relation: Any) -> np.ndarray:
    """RDP of a standard event by dp-accounting's RdpAccountant (cached for hashable events)."""
    try:
        hash(event)
    except TypeError:  # e.g. a ComposedDpEvent (its list field is unhashable)
        return _host_rdp_uncached(event, orders, relation)
    return _host_rdp_cached(event, orders, relation)


# ---------------------------------------------------------------- one run alone (lossless)


def _run_inputs(run: Any, relation: Relation, orders_key: tuple[float, ...] | None) -> tuple[Any, Any, Any]:
    config, assumptions, _ = run._build(relation)
    return config, assumptions, None if orders_key is None else np.array(orders_key)


# Cached: snapshots and host calibration ask the same state the same question many times.
@functools.lru_cache(maxsize=256)
def _single_run_epsilon(
    run: Any, bound: str, relation: Relation, orders_key: tuple[float, ...] | None, published_only: bool, delta: float
) -> tuple[float, float | None]:
    config, assumptions, orders = _run_inputs(run, relation, orders_key)
    result = lp.epsilon(bound, delta, orders, published_only=published_only, config=config, assumptions=assumptions)
    return float(result.epsilon), result.order


@functools.lru_cache(maxsize=256)
def _single_run_delta(
    run: Any, bound: str, relation: Relation, orders_key: tuple[float, ...] | None, published_only: bool, eps: float
) -> tuple[float, float | None]:
    config, assumptions, orders = _run_inputs(run, relation, orders_key)
    return host.delta_of(bound, config, assumptions, eps, orders, published_only)


# ---------------------------------------------------------------- the accountant


@dataclasses.dataclass
class _Plan:
    """What composing an event would add to the accountant's state."""

    rdp: np.ndarray
    last_iterate_runs: int = 0
    standard_events: int = 0
    non_private: bool = False
    run: Any = None  # the first last-iterate run (the answer when it is the only event)
    alone_only: str = ""  # why a run can be accounted only on its own (its rows have no Renyi curve)
    alone_event: Any = None  # that run
    final_model_only: bool = False  # some run's guarantee may come from a last-iterate bound

    def __iadd__(self, other: "_Plan") -> "_Plan":
        self.rdp = self.rdp + other.rdp
        self.last_iterate_runs += other.last_iterate_runs
        self.run = self.run if self.run is not None else other.run
        self.standard_events += other.standard_events
        self.non_private = self.non_private or other.non_private
        if not self.alone_only:
            self.alone_only, self.alone_event = other.alone_only, other.alone_event
        self.final_model_only = self.final_model_only or other.final_model_only
        return self

    @property
    def events(self) -> int:
        return self.last_iterate_runs + self.standard_events + int(self.non_private)


class LastIterateAccountant(_EventPlanning, dp_accounting.PrivacyAccountant):
    r"""RDP accountant for pipelines mixing last-iterate DP-SGD runs
    (:class:`LastIterateDpSgdEvent`) with dp-accounting's standard events.

    Every epsilon it reports holds for ``neighboring_relation`` and covers the
    outputs of the standard mechanisms and the FINAL model of each last-iterate
    run (not its intermediate iterates).

    A ledger holding exactly one last-iterate run and nothing else is answered
    exactly as ``lastiter_plugins.epsilon`` answers for that run
    (lossless; an f-DP bound's privacy profile converted exactly), also when the
    rows that apply have no Renyi-DP curve (a privacy loss distribution, or a
    profile with truncated tails): such a run is accepted alone and refused in
    a ledger with anything else. Anything
    else composed (a second run, the same run twice, a standard event) is the
    sum of the RDP curves (an f-DP bound enters with the RDP its profile
    implies: alpha mu^2 / 2, or the mixture's) converted on the order grid.
    For runs certified mu-GDP, ``LastIteratePldAccountant`` composes with
    standard events in dp-accounting's PLD accountant instead.

    Args:
      bound: the bound last-iterate runs are accounted with: an id of
        ``lastiter_plugins.BOUND_IDS`` (``best``, the default, is the per-order
        minimum over the proven bounds valid for each run; ``composition`` is the
        standard baseline, which covers every iterate).
      orders: Renyi orders (> 1), copied; default ``lastiter_plugins.DEFAULT_ORDERS``.
      neighboring_relation: ``NeighboringRelation.ADD_OR_REMOVE_ONE`` (default, the
        default of dp-accounting's own accountants and the relation Poisson runs
        default to everywhere in lastiter-plugins) or ``REPLACE_ONE``, the only
        relation with bounds for runs of the other sampling schemes (cyclic,
        shuffle_once, reshuffle, random_batch), which are refused under
        ADD_OR_REMOVE_ONE (also accepted: ``lastiter_plugins.Relation`` or its
        string value). lastiter-plugins 0.2.0 defaulted to REPLACE_ONE; until
        0.4.0, leaving it out warns with a ``FutureWarning``.
      published_only: ``best`` over the bounds whose proof is a published theorem for each run (not
        this library's derivations; a named bound must be one).

    Raises:
      ValueError: an unknown bound, invalid orders, or another relation (REPLACE_SPECIAL).
    """

    def __init__(
        self,
        bound: Any = "best",
        orders=None,
        neighboring_relation: Any = None,
        published_only: bool = False,
    ):
        if not isinstance(published_only, bool):
            raise ValueError(f"published_only must be True or False. Found {published_only!r}.")
        self._published_only = published_only
        relation = Relation.ADD_OR_REMOVE_ONE if neighboring_relation is None else _parse_relation(neighboring_relation)
        self._bound = _to_bound(bound)
        super().__init__(_HOST_RELATION[relation])
        self._relation = relation
        self._default_orders = orders is None
        self._orders = validate_orders(orders)
        self._orders.setflags(write=False)
        self._orders_key = tuple(float(a) for a in self._orders)
        self._rdp = np.zeros_like(self._orders)
        self._last_iterate_runs = 0
        self._standard_events = 0
        self._non_private = False
        self._run: LastIterateDpSgdEvent | None = None
        self._alone_only = ""
        self._final_model_only = False
        if neighboring_relation is None:  # after every check: a refused constructor says only why
            warn_at_caller(_DEFAULT_CHANGED, FutureWarning)

    # ------------------------------------------------------------ planning

    def _scale(self, curve: np.ndarray, count: int) -> np.ndarray:
        return curve * count if count else np.zeros_like(self._orders)  # never 0 * inf

    def _empty_plan(self) -> _Plan:
        return _Plan(np.zeros_like(self._orders))

    def _plan_non_private(self, event: Any, count: int) -> _Plan:
        return _Plan(self._scale(np.full_like(self._orders, np.inf), count), non_private=count > 0)

    def _plan_last_iterate(self, event: Any, count: int) -> _Plan:
        alone_only = ""
        try:
            with warnings.catch_warnings():  # composing states no number: get_epsilon warns for an unproven bound
                warnings.simplefilter("ignore", lp.UnprovenBoundWarning)
                curve = event.rdp(self._bound.value, self._orders, self._relation, self._published_only)
        except (TypeError, ValueError) as exc:  # NotApplicableError is a ValueError
            if not self._applies_without_curve(event):
                hint = _relation_hint(event, self._relation)
                raise _Refusal(event, f"{exc} (LastIterateAccountant, relation {self._relation.value}){hint}") from None
            # Its rows have an (epsilon, delta) profile but no Renyi curve: the run alone is answered by the
            # core from that profile; composed with anything else it has no RDP to add (refused then).
            curve, alone_only = np.full_like(self._orders, np.inf), str(exc)
        plan = _Plan(self._scale(curve, count), last_iterate_runs=count, run=event if count else None)
        plan.final_model_only = count > 0 and self._may_be_final_model_only(event)
        if count and alone_only:
            plan.alone_only, plan.alone_event = alone_only, event
        return plan

    def _may_be_final_model_only(self, event: Any) -> bool:
        """Whether a bound that protects the final model only may enter the run's number (``best``: some
        candidate does; a named bound: that bound does)."""
        config, assumptions, _ = event._build(self._relation)
        specs = host.rows(self._bound.value, config, assumptions, self._published_only)
        return any(spec.protects is lp.Protects.FINAL_MODEL for spec in specs)

    def _applies_without_curve(self, event: Any) -> bool:
        """The accountant's bound applies to the run (``best``: some candidate does), none with a Renyi curve."""
        try:
            config, assumptions, _ = event._build(self._relation)
            return bool(host.rows(self._bound.value, config, assumptions, self._published_only))
        except (TypeError, ValueError):
            return False

    def _refusal_if_not_alone(self, plan: _Plan) -> _Refusal | None:
        """A run whose rows have no Renyi curve is accounted only as the one event of the ledger."""
        alone_only = self._alone_only or plan.alone_only
        if not alone_only or self._events + plan.events <= 1:
            return None
        return _Refusal(
            plan.alone_event if plan.alone_only else self._run,
            f"{alone_only} A run accounted by a privacy profile is answered on its own (compose it alone into a "
            "LastIterateAccountant: get_epsilon and get_delta use its profile exactly); composed with other events "
            "it has no Renyi-DP curve to add. Use LastIteratePldAccountant for runs certified mu-GDP, or account "
            "the run with bound='composition'.",
        )

    def _plan_standard(self, event: Any, count: int) -> _Plan:
        _check_standard(event)
        curve = _host_rdp(event, self._orders_key, self.neighboring_relation)
        return _Plan(self._scale(curve, count), standard_events=count)

    def _commit(self, plan: _Plan) -> None:
        self._rdp = self._rdp + plan.rdp
        self._last_iterate_runs += plan.last_iterate_runs
        self._standard_events += plan.standard_events
        self._non_private = self._non_private or plan.non_private
        self._run = self._run if self._run is not None else plan.run
        self._alone_only = self._alone_only or plan.alone_only
        self._final_model_only = self._final_model_only or plan.final_model_only

    @property
    def _events(self) -> int:
        return self._last_iterate_runs + self._standard_events + int(self._non_private)

    # ------------------------------------------------------------ PrivacyAccountant API

    def _maybe_compose(self, event: Any, count: int, do_compose: bool) -> CompositionErrorDetails | None:
        """Dry run (``do_compose=False``) or composition; the whole event is
        planned before anything changes, so a refused event changes nothing."""
        problem = _count_problem("count", count, 0)
        if problem is not None:
            return CompositionErrorDetails(invalid_event=event, error_message=problem)
        try:
            plan = self._plan(event, int(count))
        except _Refusal as planned:
            return CompositionErrorDetails(invalid_event=planned.event, error_message=planned.message)
        try:  # supports() asks with count 0: would the event be accepted once?
            refusal = self._refusal_if_not_alone(plan if count else self._plan(event, 1))
        except _Refusal as refused:
            refusal = refused
        if refusal is not None:
            return CompositionErrorDetails(invalid_event=refusal.event, error_message=refusal.message)
        if do_compose:
            self._commit(plan)
        return None

    def compose(self, event: dp_event.DpEvent, count: int = 1) -> "LastIterateAccountant":
        """Account for ``count`` applications of ``event``; returns ``self``.

        Raises:
          TypeError: ``event`` is not a DpEvent or ``count`` is not an integer.
          ValueError: ``count`` < 1 or > 2**53.
          dp_accounting.UnsupportedEventError: the event (or a sub-event, named
            in the message) is unsupported or invalid; the ledger and the RDP
            are then left untouched.
        """
        if not isinstance(event, dp_event.DpEvent):
            raise TypeError(f"`event` must be `DpEvent`. Found {type(event)}.")
        count = _check_count(count)
        try:
            plan = self._plan(event, count)
            refusal = self._refusal_if_not_alone(plan)
            if refusal is not None:
                raise refusal
        except _Refusal as refusal:
            raise dp_accounting.UnsupportedEventError(
                f"Unsupported event: {event}. Error: [{refusal.message}] caused by subevent {refusal.event}."
            ) from None
        self._ledger.compose(event, count)  # cannot fail: event and counts are validated as the builder wants
        self._commit(plan)
        return self

    @property
    def orders(self) -> np.ndarray:
        """The Renyi orders (a copy)."""
        return self._orders.copy()

    @property
    def rdp(self) -> np.ndarray:
        """The accumulated RDP at each order (a copy)."""
        return self._rdp.copy()

    @property
    def bound(self) -> str:
        """The bound id last-iterate runs are accounted with."""
        return self._bound.value

    @property
    def relation(self) -> Relation:
        """The neighbouring relation, as ``lastiter_plugins.Relation``."""
        return self._relation

    def _single_run(self) -> tuple[Any, ...] | None:
        """The cache key (run, bound, relation, orders or None) of the one last-iterate run
        when it is the only event composed (NoOps aside) and has noise, else None."""
        if self._last_iterate_runs != 1 or self._standard_events or self._non_private or self._run is None:
            return None
        if _is_zero(self._run.noise_multiplier):
            return None
        orders_key = None if self._default_orders else self._orders_key
        return (self._run, self._bound.value, self._relation, orders_key, self._published_only)

    def get_epsilon_and_optimal_order(self, target_delta: float) -> tuple[float, float | None]:
        """(epsilon, optimal order) at ``target_delta`` in [0, 1].

        One last-iterate run and nothing else: exactly
        ``lastiter_plugins.epsilon`` for that run and the accountant's
        bound, orders and relation (lossless: a privacy profile is converted
        exactly, with order None; a curve linear in the order at its continuous
        optimum; any other curve refined between the orders). Anything else
        composed: the sum of the RDP curves on the order grid, converted by
        ``lastiter_plugins``' conversion (dp-accounting's ``compute_epsilon``,
        improved conversion; warns with ``OrderGridWarning`` when the optimum is
        at an edge of the grid). Valid either way.

        Warns:
          UnprovenBoundWarning: a run is accounted with an unproven bound (the number is not a guarantee).
        """
        problem = number_problem("target_delta", target_delta, "in [0, 1]", lambda d: 0 <= d <= 1)
        if problem is not None:
            raise ValueError(problem)
        self._warn_if_unproven()
        if 0 < target_delta < 1:
            single = self._single_run()
            if single is not None:
                return _single_run_epsilon(*single, float(target_delta))
            return host.rdp_to_epsilon(self._orders, self._rdp, float(target_delta))
        eps, order = _dp_rdp.compute_epsilon(self._orders, self._rdp, float(target_delta))
        return float(eps), float(order)

    def get_epsilon(self, target_delta: float) -> float:
        """Epsilon at ``target_delta`` for everything composed so far (see ``get_epsilon_and_optimal_order``)."""
        return self.get_epsilon_and_optimal_order(target_delta)[0]

    def get_delta_and_optimal_order(self, target_epsilon: float) -> tuple[float, float | None]:
        """(delta, optimal order) at ``target_epsilon`` >= 0.

        dp-accounting's ``compute_delta`` on the grid; for one last-iterate run
        and nothing else, the smaller of that and the counterpart of its
        lossless epsilon: the smallest delta over the bound's candidates, each
        converted as for epsilon (a privacy profile exactly, order None; a linear
        curve at the continuous optimum; any other curve refined between the
        orders). Every number is ``compute_delta`` at an order where the bound
        was evaluated, or a profile's exact delta. So
        ``get_delta(get_epsilon(d)) <= d`` (to rounding). Warns as ``get_epsilon_and_optimal_order``."""
        target_epsilon = validate_epsilon(target_epsilon, "target_epsilon")
        self._warn_if_unproven()
        # inf - inf at a non-private order (delta 1); (alpha - 1) * (rdp - eps) beyond a double at a huge
        # epsilon (delta 0): the host handles both
        with np.errstate(invalid="ignore", over="ignore"):
            delta, order = _dp_rdp.compute_delta(self._orders, self._rdp, target_epsilon)
        single = self._single_run()
        if single is not None:  # both are valid; the grid's can only help (a mixture's RDP, say)
            found = _single_run_delta(*single, target_epsilon)
            if found[0] <= delta:
                return found
        return float(delta), float(order)

    def get_delta(self, target_epsilon: float) -> float:
        """Delta at ``target_epsilon`` for everything composed so far."""
        return self.get_delta_and_optimal_order(target_epsilon)[0]

    def _warn_if_unproven(self) -> None:
        """An unproven bound's number stated bare (a float): warned about, once per line of the user's code."""
        if self._last_iterate_runs:
            host.warn_if_unproven(self._bound.value)

    def statement(self, target_delta: float) -> str:
        """The answer first (:func:`lastiter_plugins.answer_lines`: the number, what it protects, its relation,
        the winning row and its provenance; for a single run also what published theorems alone give and
        dp-accounting's own numbers), then a one-line, honest description of everything composed (an unproven
        bound is marked ``[unproven: <reason>]``, as :class:`lastiter_plugins.EpsilonResult` marks it)."""
        eps, order = self.get_epsilon_and_optimal_order(target_delta)
        parts = []
        proof: lp.Proof | None
        single = self._single_run()
        if single is not None:  # the run alone: what its winner protects
            config, assumptions, _ = single[0]._build(self._relation)
            orders = None if single[3] is None else self._orders
            winner = lp.epsilon(
                self._bound.value,
                target_delta,
                orders,
                published_only=self._published_only,
                config=config,
                assumptions=assumptions,
            )
            final_only, proof = winner.protects is lp.Protects.FINAL_MODEL, winner.proof
            bound = f"{self._bound.value}{f' via {winner.winner}' if self._bound.value == lp.BEST else ''}"
            answer = dataclasses.replace(
                host.answer(winner, config, assumptions, "dp-accounting", orders), epsilon=eps
            )  # (the same number: a ledger of one run is answered as lp.epsilon answers it)
        else:
            final_only, bound = self._final_model_only, self._bound.value
            proof = lp.BOUNDS[bound].proof if bound != lp.BEST else None
            named = None if bound == lp.BEST or not self._last_iterate_runs else bound
            answer = ledger_answer(eps, target_delta, self._relation, final_only, named)
        if proof is not None and not proof.proven:
            bound += f" [{proof}]"
        if self._last_iterate_runs:
            runs = f"{self._last_iterate_runs} DP-SGD run(s), bound {bound}"
            parts.append(
                f"the final model only of {runs} (intermediate iterates must not be released)"
                if final_only
                else f"every iterate of {runs}"
            )
        if self._standard_events:
            parts.append(f"the outputs of {self._standard_events} standard mechanism application(s)")
        if self._non_private:
            parts.append("a non-private operation")
        covered = " and ".join(parts) if parts else "nothing released yet"
        how = "privacy profile converted exactly" if order is None else f"RDP order {order:g}"
        detail = f"({eps:.4g}, {target_delta:g})-DP under {self._relation.value} neighbours [{how}] for {covered}."
        return statement(answer, detail)


# Dispatch table: how each event type is composed; any other type is a standard
# event, delegated to dp-accounting's RdpAccountant.
LastIterateAccountant._planners = {
    dp_event.NoOpDpEvent: LastIterateAccountant._plan_no_op,
    dp_event.NonPrivateDpEvent: LastIterateAccountant._plan_non_private,
    dp_event.SelfComposedDpEvent: LastIterateAccountant._plan_self_composed,
    dp_event.ComposedDpEvent: LastIterateAccountant._plan_composed,
    LastIterateDpSgdEvent: LastIterateAccountant._plan_last_iterate,
}
