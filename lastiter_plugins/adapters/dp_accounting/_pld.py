r"""``LastIteratePldAccountant``: last-iterate runs certified mu-GDP, composed with
standard events in dp-accounting's PLD accountant.

A run whose bound is a Gaussian privacy profile (mu-GDP: the GDP bounds whose
profile has one component, ``shifted-interpolation-full-batch`` and
``shifted-interpolation-cyclic``) has output laws that are a post-processing of
:math:`(\mathcal N(0,1), \mathcal N(\mu,1))` (Dong, Roth & Su 2019, arXiv
1905.02383). It is therefore dominated by the Gaussian mechanism of sensitivity
1 and noise :math:`1/\mu`, and composes as that mechanism with anything else
(adaptively: each bound holds for any starting point of the run, so conditioned
on what was released before the run is still mu-GDP). dp-accounting's
``PLDAccountant`` composes that Gaussian with the standard events (Gaussian,
Laplace, Poisson-sampled, ...) with its own privacy loss distributions, which
is tighter than adding RDP curves.

What a ``GaussianDpEvent`` means to the host's PLD accountant depends on its
version (docs/dp_accounting.md): 0.4.3 reads ``noise_multiplier`` as noise /
shift of the two neighbouring outputs under every relation; 0.6 applies a factor
2 under REPLACE_ONE (the event's docstring convention, sensitivity 1 per value).
Our mu is already the shift for the accountant's relation, so the run is passed
as ``GaussianDpEvent(s / mu)`` with ``s`` the shift the installed host applies to
``GaussianDpEvent(1)``: measured once against the exact mu-GDP profile (1 or 2;
any other answer refuses the host).

Standard events are passed to the host unchanged: they mean exactly what
dp-accounting's ``PLDAccountant`` of the installed version says they mean.

Mixture profiles (``shifted-interpolation-shuffle``: one Gaussian per position
of the differing example) are not one Gaussian and are refused; for a
shuffle-once run, ``best`` uses ``shifted-interpolation-cyclic``, which also
covers it (the worst position). ``LastIterateAccountant`` composes the mixture
in Renyi DP.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant as _dp_pld

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.adapters.dp_accounting import _gdp
from lastiter_plugins.adapters.dp_accounting._answer import ledger_answer, statement
from lastiter_plugins.adapters.dp_accounting._events import (
    _HOST_RELATION,
    LastIterateDpSgdEvent,
    NeighboringRelation,
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
from lastiter_plugins.config import Relation
from lastiter_plugins.errors import UnsupportedHostError
from lastiter_plugins.validation import number_problem, validate_epsilon

__all__ = ["LastIteratePldAccountant"]


# ---------------------------------------------------------------- the host's Gaussian convention


@functools.lru_cache(maxsize=4)
def host_gaussian_shift(relation: Any) -> float:
    r"""The shift (in noise units times noise_multiplier) the installed dp-accounting's
    ``PLDAccountant(relation)`` gives ``GaussianDpEvent(1)``: 1 or 2.

    Measured against the exact mu-GDP profile (Dong, Roth & Su 2019, Cor. 2.13)
    at epsilon 1: the host's delta must match delta_1(1) or delta_2(1) to 1e-6
    relative (the host's connect-the-dots PLD is within 1e-12 of them on 0.4.3
    and 0.6.0).

    Raises:
      UnsupportedHostError: the host's answer is neither.
    """
    pld = _dp_pld.PLDAccountant(relation).compose(dp_event.GaussianDpEvent(1.0))
    found = float(pld.get_delta(1.0))
    for shift in (1.0, 2.0):
        exact = host.gaussian_delta(shift, 1.0)
        if abs(found - exact) <= 1e-6 * exact:
            return shift
    raise UnsupportedHostError(
        f"dp-accounting's PLDAccountant({relation}) gives GaussianDpEvent(1) delta {found:.12g} at epsilon 1, "
        f"neither the 1-GDP value {host.gaussian_delta(1.0, 1.0):.12g} nor the 2-GDP value "
        f"{host.gaussian_delta(2.0, 1.0):.12g}: this dp-accounting version is not supported by "
        "LastIteratePldAccountant (tested: 0.4.3, 0.6.0)."
    )


#: The largest finite epsilon passed to the host's ``get_delta`` (its exp(epsilon) overflows beyond 709).
_LARGEST_EPSILON = 700.0


# ---------------------------------------------------------------- planning


@dataclasses.dataclass
class _Step:
    """One composition to make in the host: ``host_event`` ``count`` times, standing for ``source``."""

    source: Any
    host_event: Any
    count: int


@dataclasses.dataclass
class _Plan:
    steps: list[_Step] = dataclasses.field(default_factory=list)
    last_iterate_runs: int = 0
    standard_events: int = 0
    non_private: bool = False
    winners: frozenset[str] = frozenset()
    #: the winners' provenance lines for the runs certified (:meth:`lastiter_plugins.registry.Provenance.describe`)
    provenances: frozenset[str] = frozenset()

    def __iadd__(self, other: _Plan) -> _Plan:
        self.steps += other.steps
        self.last_iterate_runs += other.last_iterate_runs
        self.standard_events += other.standard_events
        self.non_private = self.non_private or other.non_private
        self.winners = self.winners | other.winners
        self.provenances = self.provenances | other.provenances
        return self


class LastIteratePldAccountant(_EventPlanning, dp_accounting.PrivacyAccountant):
    r"""PLD accountant for pipelines mixing last-iterate DP-SGD runs certified
    mu-GDP (:class:`LastIterateDpSgdEvent`) with dp-accounting's standard events.

    Every epsilon it reports holds for ``neighboring_relation`` and covers the
    outputs of the standard mechanisms and the FINAL model of each run (not its
    intermediate iterates). Numbers are dp-accounting's ``PLDAccountant``'s
    (pessimistic discretisation: never below the exact value by more than the
    rounding of its privacy loss values).

    Args:
      bound: ``best`` (default: the smallest mu over the proven mu-GDP bounds
        valid for each run) or a GDP bound id (``shifted-interpolation-full-batch``,
        ``shifted-interpolation-cyclic``; ``shifted-interpolation-shuffle`` is a
        mixture and refused unless it has one component). A run with no such
        bound is refused (use ``LastIterateAccountant``, Renyi DP).
      neighboring_relation: ``REPLACE_ONE`` (default: the only relation a run is
        certified mu-GDP for, so the default differs from dp-accounting's
        ``PLDAccountant``'s ADD_OR_REMOVE_ONE) or ``ADD_OR_REMOVE_ONE`` (no
        mu-GDP bound is proven for it yet: runs are refused, standard events work).
      value_discretization_interval: the host's PLD discretisation (> 0).

    Raises:
      ValueError: an unknown or Renyi-DP bound, another relation, or an invalid interval.
      UnsupportedHostError: the installed dp-accounting's Gaussian PLD convention is unknown.
    """

    def __init__(
        self,
        bound: Any = lp.BEST,
        neighboring_relation: Any = NeighboringRelation.REPLACE_ONE,
        value_discretization_interval: float = 1e-4,
    ):
        relation = _parse_relation(neighboring_relation)
        self._bound = _to_bound(bound)
        allowed = (lp.BEST, *_gdp.gdp_bound_ids())
        if self._bound.value not in allowed:
            raise ValueError(
                f"bound must be one of {', '.join(allowed)} for LastIteratePldAccountant (a run composes as a "
                f"Gaussian mechanism only when certified mu-GDP). Found {self._bound.value}, a Renyi-DP bound: "
                "use LastIterateAccountant for it."
            )
        interval = value_discretization_interval
        problem = number_problem(
            "value_discretization_interval", interval, "a finite number > 0", lambda x: 0 < x < math.inf
        )
        if problem is not None:
            raise ValueError(problem)
        super().__init__(_HOST_RELATION[relation])
        self._relation = relation
        self._interval = float(interval)
        self._shift = host_gaussian_shift(self.neighboring_relation)
        self._host = _dp_pld.PLDAccountant(self.neighboring_relation, self._interval)
        self._last_iterate_runs = 0
        self._standard_events = 0
        self._non_private = False
        self._winners: frozenset[str] = frozenset()
        self._provenances: frozenset[str] = frozenset()

    # ------------------------------------------------------------ planning

    def _empty_plan(self) -> _Plan:
        return _Plan()

    def _plan_last_iterate(self, event: Any, count: int) -> _Plan:
        try:
            config, assumptions, no_noise = event._build(self._relation)
            mu, winner = _gdp.gaussian_mu(self._bound.value, config, assumptions)
        except (TypeError, ValueError) as exc:  # NotApplicableError is a ValueError
            raise _Refusal(event, f"{exc} (LastIteratePldAccountant, relation {self._relation.value})") from None
        if no_noise:
            host_event: Any = dp_event.NonPrivateDpEvent()
        elif mu == 0.0:
            host_event = dp_event.NoOpDpEvent()
        else:
            host_event = dp_event.GaussianDpEvent(self._shift / mu)
        return _Plan(
            [_Step(event, host_event, count)],
            last_iterate_runs=count,
            non_private=no_noise and count > 0,
            winners=frozenset({winner}) if count else frozenset(),
            provenances=frozenset({_provenance(winner, config, assumptions)}) if count else frozenset(),
        )

    def _plan_standard(self, event: Any, count: int) -> _Plan:
        _check_standard(event)
        error = self._host._maybe_compose(event, 1, False)  # the host's own dry run
        if error is not None:
            raise _Refusal(error.invalid_event if error.invalid_event is not None else event, error.error_message)
        non_private = isinstance(event, dp_event.NonPrivateDpEvent)
        return _Plan([_Step(event, event, count)], standard_events=0 if non_private else count, non_private=non_private)

    def _execute(self, plan: _Plan) -> Any:
        """A copy of the host state with ``plan`` composed (the state itself is untouched)."""
        pld = copy.deepcopy(self._host)
        for step in plan.steps:
            if step.count == 0:
                continue
            try:
                pld.compose(step.host_event, step.count)
            except (ArithmeticError, AssertionError, TypeError, ValueError) as exc:
                raise _Refusal(
                    step.source,
                    f"dp-accounting's PLDAccountant failed on it, its parameters are invalid "
                    f"({type(exc).__name__}: {exc})",
                ) from None
        return pld

    def _commit(self, plan: _Plan, pld: Any) -> None:
        self._host = pld
        self._last_iterate_runs += plan.last_iterate_runs
        self._standard_events += plan.standard_events
        self._non_private = self._non_private or plan.non_private
        self._winners = self._winners | plan.winners
        self._provenances = self._provenances | plan.provenances

    # ------------------------------------------------------------ PrivacyAccountant API

    def _maybe_compose(self, event: Any, count: int, do_compose: bool) -> CompositionErrorDetails | None:
        """Dry run (``do_compose=False``) or composition; a refused event changes nothing."""
        problem = _count_problem("count", count, 0)
        if problem is not None:
            return CompositionErrorDetails(invalid_event=event, error_message=problem)
        try:
            plan = self._plan(event, int(count))
            if not count:  # supports() asks with count 0: would the event be accepted once?
                self._plan(event, 1)
            if do_compose:
                self._commit(plan, self._execute(plan))
        except _Refusal as refusal:
            return CompositionErrorDetails(invalid_event=refusal.event, error_message=refusal.message)
        return None

    def compose(self, event: dp_event.DpEvent, count: int = 1) -> LastIteratePldAccountant:
        """Account for ``count`` applications of ``event``; returns ``self``.

        Raises:
          TypeError: ``event`` is not a DpEvent or ``count`` is not an integer.
          ValueError: ``count`` < 1 or > 2**53.
          dp_accounting.UnsupportedEventError: the event (or a sub-event, named
            in the message) is unsupported or invalid; nothing changes.
        """
        if not isinstance(event, dp_event.DpEvent):
            raise TypeError(f"`event` must be `DpEvent`. Found {type(event)}.")
        count = _check_count(count)
        try:
            plan = self._plan(event, count)
            pld = self._execute(plan)
        except _Refusal as refusal:
            raise dp_accounting.UnsupportedEventError(
                f"Unsupported event: {event}. Error: [{refusal.message}] caused by subevent {refusal.event}."
            ) from None
        self._ledger.compose(event, count)
        self._commit(plan, pld)
        return self

    @property
    def bound(self) -> str:
        """The bound id runs are accounted with."""
        return self._bound.value

    @property
    def relation(self) -> Relation:
        """The neighbouring relation, as ``lastiter_plugins.Relation``."""
        return self._relation

    @property
    def value_discretization_interval(self) -> float:
        return self._interval

    @property
    def host_gaussian_shift(self) -> float:
        """What ``GaussianDpEvent(s)`` means here: two neighbouring outputs ``host_gaussian_shift / s``
        noise standard deviations apart (the installed host's convention for the relation: 1 on
        dp-accounting 0.4.3; under REPLACE_ONE, 2 on 0.6). Noise std ``sigma`` on a sum whose
        neighbouring values differ by ``shift`` is ``GaussianDpEvent(sigma / shift * host_gaussian_shift)``."""
        return self._shift

    def get_epsilon(self, target_delta: float) -> float:
        """Epsilon at ``target_delta`` in [0, 1]: dp-accounting's PLD of everything composed.

        Warns:
          UnprovenBoundWarning: a run is accounted by an unproven bound (the number is not a guarantee).
        """
        problem = number_problem("target_delta", target_delta, "in [0, 1]", lambda d: 0 <= d <= 1)
        if problem is not None:
            raise ValueError(problem)
        self._warn_if_unproven()
        return float(self._host.get_epsilon(float(target_delta)))

    def get_delta(self, target_epsilon: float) -> float:
        """Delta at ``target_epsilon`` >= 0: dp-accounting's PLD of everything composed. Warns as
        :meth:`get_epsilon`."""
        target_epsilon = validate_epsilon(target_epsilon, "target_epsilon")
        self._warn_if_unproven()
        # The host multiplies exp(epsilon) by a mass: NaN beyond epsilon 709. delta is non-increasing in epsilon,
        # so its value at _LARGEST_EPSILON is valid beyond (exact where every finite privacy loss is below 700;
        # inf is the host's own case: the mass at infinity).
        at = target_epsilon if math.isinf(target_epsilon) else min(target_epsilon, _LARGEST_EPSILON)
        return float(np.asarray(self._host.get_delta(at)).reshape(-1)[0])

    def _warn_if_unproven(self) -> None:
        for winner in sorted(self._winners):
            host.warn_if_unproven(winner)

    def statement(self, target_delta: float) -> str:
        """The answer first (:func:`lastiter_plugins.answer_lines`: the number, what it protects, its relation,
        the winning row and its provenance when one row certifies every run), then a one-line, honest
        description of everything composed (a winner whose proof is unproven is marked ``[unproven: <reason>]``)."""
        eps = self.get_epsilon(target_delta)
        parts = []
        if self._last_iterate_runs:
            via = ", ".join(sorted(self._winners))
            how = f"mu-GDP by {self._bound.value}{f' via {via}' if self._bound.value == lp.BEST and via else ''}"
            how += "".join(
                f" [{w}: {lp.BOUNDS[w].proof}]" for w in sorted(self._winners) if not lp.BOUNDS[w].proof.proven
            )
            every = bool(self._winners) and all(
                lp.BOUNDS[w].protects is lp.Protects.EVERY_ITERATE for w in self._winners
            )
            runs = f"{self._last_iterate_runs} DP-SGD run(s)"
            parts.append(
                f"every iterate of {runs}, {how}"
                if every
                else f"the final model only of {runs}, {how} (intermediate iterates must not be released)"
            )
        if self._standard_events:
            parts.append(f"the outputs of {self._standard_events} standard mechanism application(s)")
        if self._non_private:
            parts.append("a non-private operation")
        covered = " and ".join(parts) if parts else "nothing released yet"
        detail = (
            f"({eps:.4g}, {target_delta:g})-DP under {self._relation.value} neighbours "
            f"[dp-accounting PLD, discretisation {self._interval:g}] for {covered}."
        )
        final_only = bool(self._winners) and any(
            lp.BOUNDS[w].protects is lp.Protects.FINAL_MODEL for w in self._winners
        )
        one = len(self._winners) == 1 and len(self._provenances) == 1
        winner, provenance = (next(iter(self._winners)), next(iter(self._provenances))) if one else (None, "")
        return statement(ledger_answer(eps, target_delta, self._relation, final_only, winner, provenance), detail)


def _provenance(winner: str, config: Any, assumptions: Any) -> str:
    """The winner's provenance line for the run (published, or derived here and why)."""
    origin = lp.BOUNDS[winner].provenance
    return "" if origin is None else origin.describe(config, assumptions)


LastIteratePldAccountant._planners = {
    dp_event.NoOpDpEvent: LastIteratePldAccountant._plan_no_op,
    dp_event.SelfComposedDpEvent: LastIteratePldAccountant._plan_self_composed,
    dp_event.ComposedDpEvent: LastIteratePldAccountant._plan_composed,
    LastIterateDpSgdEvent: LastIteratePldAccountant._plan_last_iterate,
}
