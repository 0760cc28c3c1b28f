r"""Noise calibration: the smallest noise multiplier whose epsilon meets a target (safe), and the
guarantee it reaches (:class:`CalibrationResult`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from typing_extensions import Unpack, overload

from lastiter_plugins import evaluation
from lastiter_plugins.api import Parameters, pipeline
from lastiter_plugins.config import LossAssumptions, Relation, TrainingConfig
from lastiter_plugins.errors import CalibrationError
from lastiter_plugins.evaluation import EpsilonResult
from lastiter_plugins.registry import Protects
from lastiter_plugins.validation import positive_number, validate_delta, validate_orders

#: Below this noise multiplier the search stops and returns the last value that met the target.
MIN_NOISE_MULTIPLIER = 1e-6


@dataclasses.dataclass(frozen=True)
class CalibrationResult:
    r"""The noise multiplier :func:`calibrate_noise` found and the guarantee it reaches: what
    ``lastiter calibrate`` prints.

    ``float(result)`` is the noise multiplier (pass ``float(result)`` or ``result.noise_multiplier``
    where a number is expected, e.g. ``make_private(noise_multiplier=...)``); ``str(result)`` is the
    command line's line; the other fields are the reached guarantee's (:class:`EpsilonResult`).

    Attributes:
      noise_multiplier: z, the smallest noise multiplier found (to ``rtol``) whose epsilon meets the target.
      target_epsilon: the target.
      result: the guarantee at ``noise_multiplier``, computed as :func:`lastiter_plugins.epsilon` computes
        it (its epsilon is <= the target): the winner, the relation, what it protects, delta, the proof.
    """

    noise_multiplier: float
    target_epsilon: float
    result: EpsilonResult

    @property
    def epsilon(self) -> float:
        """The epsilon reached at ``noise_multiplier`` (<= ``target_epsilon``)."""
        return self.result.epsilon

    @property
    def delta(self) -> float:
        return self.result.delta

    @property
    def bound(self) -> str:
        """The bound calibrated for (a bound id or ``best``)."""
        return self.result.bound

    @property
    def winner(self) -> str:
        """The bound that gives the number (== ``bound`` unless ``bound`` is ``best``)."""
        return self.result.winner

    @property
    def relation(self) -> Relation:
        """The neighbouring relation of the guarantee."""
        return self.result.relation

    @property
    def protects(self) -> Protects:
        """What the guarantee covers: the final model only, or every iterate."""
        return self.result.protects

    def __float__(self) -> float:
        """The noise multiplier, so ``float(result)`` works where a number is expected."""
        return float(self.noise_multiplier)

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict: the noise multiplier and the target, then the reached guarantee's fields."""
        return {
            "noise_multiplier": self.noise_multiplier,
            "target_epsilon": self.target_epsilon,
        } | self.result.to_dict()

    def __str__(self) -> str:
        r = self.result
        return (
            f"noise_multiplier = {self.noise_multiplier:.6g} reaches epsilon = {r.epsilon:.6g} <= "
            f"{self.target_epsilon:g} at delta = {r.delta:g} ({r.relation.value} neighbours), for "
            f"{r.protects.value}, via {r.winner}"
        )


@overload
def calibrate_noise(
    bound: str,
    target_epsilon: float,
    delta: float,
    *,
    orders: Sequence[float] | np.ndarray | None = None,
    max_noise_multiplier: float = 1e4,
    rtol: float = 1e-4,
    published_only: bool = False,
    **params: Unpack[Parameters],
) -> CalibrationResult: ...
@overload
def calibrate_noise(
    bound: str,
    target_epsilon: float,
    delta: float,
    *,
    orders: Sequence[float] | np.ndarray | None = None,
    max_noise_multiplier: float = 1e4,
    rtol: float = 1e-4,
    published_only: bool = False,
    config: TrainingConfig,
    assumptions: LossAssumptions | None = None,
) -> CalibrationResult: ...
def calibrate_noise(
    bound: str,
    target_epsilon: float,
    delta: float,
    *,
    orders: Sequence[float] | np.ndarray | None = None,
    max_noise_multiplier: float = 1e4,
    rtol: float = 1e-4,
    published_only: bool = False,
    config: TrainingConfig | None = None,
    assumptions: LossAssumptions | None = None,
    **params: Any,
) -> CalibrationResult:
    r"""Smallest noise multiplier (to relative precision ``rtol``) such that
    ``bound`` gives epsilon <= ``target_epsilon`` at ``delta``.

    Epsilon is computed exactly as :func:`lastiter_plugins.epsilon` computes it
    with the same ``orders`` (``None``: the default grid, with its lossless
    conversion), for every bound: Renyi-DP and f-DP bounds alike, and ``best``.

    Safety. The bounds themselves are non-increasing in the noise multiplier, but
    the epsilon reported for one is the best of a finite search (over orders, or
    a root-find on a privacy profile), valid at every noise multiplier yet not
    guaranteed exactly monotone in it. The search therefore never relies on
    monotonicity for validity: a bracket (doubling, then jumps to 5% beyond where the
    last two misses' (log z, log epsilon) line reaches the target), then a shrinking of it, keeping as
    the upper end only noise multipliers that were evaluated and met the target,
    and as the lower end only ones evaluated and missing it. Each try is where the
    line through the ends' (log z, log epsilon) crosses the target (epsilon is close
    to a power of z), at least ``rtol / 2`` inside the bracket; the geometric middle
    when the bracket did not halve in two tries (:func:`_next_point`). The returned value
    is the upper end (the smallest evaluated value that met the target); its
    epsilon is computed once more and checked before returning. A value at most
    a factor ``1 + rtol`` below the result was evaluated and missed the target
    (unless the search reached ``MIN_NOISE_MULTIPLIER``), so the result is
    minimal to ``rtol`` wherever epsilon is monotone. For ``best``, whether a
    noise multiplier meets the target is asked of its rows one by one, a row that
    missed at a larger noise multiplier not again (:class:`_BestSearch`); the
    returned value is still certified by ``best`` itself.

    Args:
      bound: a bound id or ``best``.
      target_epsilon: the target, a finite number > 0.
      delta: in (0, 1).
      orders: Renyi orders (default: the library's grid and conversion).
      max_noise_multiplier: the largest noise multiplier tried (> 0).
      rtol: relative precision of the bisection (> 0).
      published_only: ``best`` over the rows whose proof is a published theorem (a named bound must be one).
      config, assumptions: the pipeline as objects (its noise multiplier is ignored), or give ``params``
        (:func:`~lastiter_plugins.api.pipeline`).
      **params: the pipeline (:class:`~lastiter_plugins.api.Parameters`), without ``noise_multiplier``
        (ignored if given).

    Returns:
      A :class:`CalibrationResult`: the noise multiplier z with epsilon(z) <= target_epsilon
      (``float(result)``) and the guarantee it reaches (winner, relation, what it protects, epsilon,
      delta). The relation is the pipeline's: given, or the sampling scheme's default
      (:data:`lastiter_plugins.config.DEFAULT_RELATION`).

    Raises:
      NotApplicableError: the bound does not apply (independent of the noise).
      CalibrationError: even ``max_noise_multiplier`` does not reach the target.
      ValueError: invalid inputs.
    """
    target_epsilon = positive_number("target_epsilon", target_epsilon)
    delta = validate_delta(delta)
    cap = positive_number("max_noise_multiplier", max_noise_multiplier)
    rtol = positive_number("rtol", rtol)
    use_orders = None if orders is None else validate_orders(orders)  # None: the lossless default conversion
    if config is None:
        params["noise_multiplier"] = 1.0  # ignored if given: the search sets it
    config, assumptions = pipeline(config, assumptions, params)
    config = config.replace(noise_multiplier=1.0)
    evaluation.require_applicable(bound, config, assumptions, published_only)  # refuses before any search

    def result_at(z: float) -> EpsilonResult:
        at_z = config.replace(noise_multiplier=z)
        return evaluation.epsilon_result(bound, at_z, assumptions, delta, use_orders, published_only=published_only)

    def epsilon_at(z: float) -> float:
        return result_at(z).epsilon

    def probe(z: float) -> tuple[bool, float | None]:
        eps = epsilon_at(z)
        return eps <= target_epsilon, eps

    if bound == evaluation.BEST:
        probe = _BestSearch(config, assumptions, delta, use_orders, target_epsilon, published_only).probe

    def certified(z: float) -> CalibrationResult:
        found = result_at(z)
        if not found.epsilon <= target_epsilon:  # never return a value that misses the target
            raise CalibrationError(
                f"calibration failed to certify noise_multiplier = {z:g} for {bound}: epsilon = {found.epsilon:.6g} > "
                f"target_epsilon = {target_epsilon:g}."
            )
        return CalibrationResult(z, target_epsilon, found)

    seen: dict[float, float | None] = {}  # z -> the epsilon that guided the search (None: not known)

    def meets(z: float) -> bool:
        met, eps = probe(z)
        seen[z] = eps
        return met

    # Bracket: hi evaluated and met, lo evaluated and missed.
    hi, missed = min(1.0, cap), None
    while not meets(hi):
        if hi >= cap:
            raise CalibrationError(
                f"no noise_multiplier <= max_noise_multiplier = {cap:g} reaches target_epsilon = "
                f"{target_epsilon:g} at delta = {delta:g} for {bound}. Found epsilon = {epsilon_at(hi):.6g} at "
                f"noise_multiplier = {hi:g}."
            )
        step = 2.0 if missed is None else _growth(missed, hi, seen[missed], seen[hi], target_epsilon)
        hi, missed = min(step * hi, cap), hi
    if missed is not None:
        lo = missed
    else:
        lo = hi / 2.0
        while meets(lo):
            hi, lo = lo, lo / 2.0
            if lo < MIN_NOISE_MULTIPLIER:
                return certified(hi)
    # Shrink the bracket; the invariant holds whatever the shape of epsilon(z).
    widths = [math.log(hi / lo)] * 2
    while hi / lo > 1.0 + rtol:
        bisect = widths[-1] > 0.5 * widths[-3] if len(widths) > 2 else False
        mid = _next_point(lo, hi, seen.get(lo), seen.get(hi), target_epsilon, rtol, bisect)
        if meets(mid):
            hi = mid
        else:
            lo = mid
        widths.append(math.log(hi / lo))
    return certified(hi)


def _growth(z0: float, z1: float, eps0: float | None, eps1: float | None, target: float) -> float:
    """How much to raise the noise multiplier after two misses at z0 < z1: 5% beyond where the line
    through their (log z, log epsilon) reaches the target, within [1.25, 64]; 2 when their epsilons
    are not known or do not fall."""
    if eps0 is None or eps1 is None or not (math.isfinite(eps0) and math.isfinite(eps1)):
        return 2.0
    if not eps0 > eps1 > target > 0.0:
        return 2.0
    slope = math.log(eps1 / eps0) / math.log(z1 / z0)  # < 0
    return min(max(1.05 * (target / eps1) ** (1.0 / slope), 1.25), 64.0)


def _next_point(
    lo: float, hi: float, eps_lo: float | None, eps_hi: float | None, target: float, rtol: float, bisect: bool
) -> float:
    """The next noise multiplier to try in (lo, hi): where the line through (log z, log epsilon) at the two
    ends crosses the target (epsilon is close to a power of z), kept at least rtol/2 (in ratio) inside
    the bracket so that an accurate guess closes it on the next try; the geometric middle when an end's
    epsilon is not known or not usable, or when ``bisect`` (the bracket did not halve in two tries)."""
    middle = math.sqrt(lo * hi)
    if bisect or eps_lo is None or eps_hi is None:
        return middle
    usable = eps_lo > target and 0.0 < eps_hi <= target
    if not usable or not (math.isfinite(eps_lo) and math.isfinite(eps_hi)):
        return middle
    f_lo, f_hi = math.log(eps_lo / target), math.log(eps_hi / target)
    if not f_lo > f_hi:
        return middle
    x = math.log(lo) + f_lo * math.log(hi / lo) / (f_lo - f_hi)
    margin = min(math.log1p(rtol) / 2.0, math.log(hi / lo) / 2.0)
    x = min(max(x, math.log(lo) + margin), math.log(hi) - margin)
    return math.exp(x)


class _BestSearch:
    """Whether ``best`` meets the target at a noise multiplier z: iff one of its rows does. A row that
    missed at a noise multiplier >= z is not evaluated again (a row's epsilon is non-increasing in z
    wherever the search's minimality is claimed), so after the first z where some row meets, the
    bisection below it evaluates only the rows that met there. These answers only steer the
    search: the value returned is certified by ``best`` itself."""

    def __init__(self, config, assumptions, delta: float, orders, target: float, published_only: bool = False) -> None:
        self._config, self._assumptions, self._delta, self._orders = config, assumptions, delta, orders
        self._target = target
        self._missed_at: dict[str, float] = {}
        # best's candidates: no precondition depends on the noise multiplier
        self._candidates = evaluation.best_candidates(config, assumptions, published_only)

    def probe(self, z: float) -> tuple[bool, float | None]:
        """(whether best meets the target at z, the smallest epsilon of the rows computed there or None)."""
        config = self._config.replace(noise_multiplier=z)
        met, smallest = False, None
        for spec in self._candidates:
            bid = spec.id
            if self._missed_at.get(bid, 0.0) >= z:
                continue
            # (a row whose proven lower estimate is above the target is not computed: it misses)
            row = evaluation.evaluate_bound(
                spec, config, self._assumptions, self._delta, self._orders, beat=self._target
            )
            winner = evaluation.best_of([row], config.relation)
            if winner is not None:
                smallest = winner.epsilon if smallest is None else min(smallest, winner.epsilon)
            if winner is not None and winner.epsilon <= self._target:
                met = True
            else:
                self._missed_at[bid] = z
        return met, smallest
