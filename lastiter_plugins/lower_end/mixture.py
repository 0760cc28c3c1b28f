r"""The exact epsilon, rounded downward, of a one-dimensional Gaussian location mixture against its
reflection or against the centred Gaussian (docs/derivations/lower-end.md#exact-linear-instances).

Every linear-loss instance of :mod:`lastiter_plugins.lower_end.instances` has, along the gradient's
direction, the last iterate ``X = a S + N(0, s^2)`` in one dataset, with ``S >= 0`` the (contracted)
number of uses of the differing record, and ``-a S + N(0, s^2)`` (replace-one) or ``N(0, s^2)``
(add-or-remove) in the other. Three facts make the lower end cheap and rigorous:

1. **Half-lines are optimal** (monotone likelihood ratio). With ``M(x) = E exp(a S x / s^2 -
   a^2 S^2 / (2 s^2))``, ``log M`` is convex (a log-Laplace transform) and nondecreasing
   (``S >= 0``); the likelihood ratios are ``M(x) / M(-x)`` and ``M(x)``, both nondecreasing. So
   the hockey-stick divergence is ``sup_t P(X > t) - e^eps Q(X > t)`` (and ``sup_t Q(X < t) -
   e^eps P(X < t)`` the other way), and any single t gives a lower bound on it.
2. **Rounding S down is safe for this statistic.** If ``S' <= S`` (a coupling: each step's
   contribution floored onto a lattice), ``P(X > t) = E Phi_c((t - a S)/s)`` only decreases and
   ``Q(X > t) = E Phi_c((t + a S)/s)`` (replace-one) and ``P(X < t)`` only increase, so the test
   value ``P(X > t) - e^eps Q(X > t)`` computed with ``S'`` is below the true one. (The divergence
   of the rounded mixture itself is NOT claimed to be below the truth; only this test value is.)
3. **Dropped tails are counted.** Tails of the mixing law dropped while convolving (mass
   ``trimmed``) can only add to a P-probability and add at most ``trimmed`` to a Q-probability.

For a fixed t, ``A(t) - e^eps B(t) > delta`` (A a certified lower bound on the numerator
probability, B a certified upper bound on the denominator one) holds for every
``eps < log((A - delta) / B)``, so the exact epsilon at delta is at least that: the function
returns the maximum over the thresholds it tries (every one of them is evaluated rigorously).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import special, stats

_UNIT_ROUNDOFF = float(np.finfo(float).eps) / 2.0
#: Total mass dropped from the tails of a mixing law (counted, never ignored).
TRIM = 1e-40
#: Allowance for the relative error of one binomial pmf value from scipy (typically 1e-15).
PMF_RELATIVE_ERROR = 1e-12
#: Allowance for the relative error of one evaluation of a Gaussian tail sum: log_ndtr, and the
#: rounding of its arguments (relative 1e-15 of an argument |u| <= 40 moves Phi_c by <= 1e-12).
EVAL_RELATIVE_ERROR = 1e-10
#: Values are shrunk by this factor before flooring (float values of contraction products).
VALUE_SHRINK = 1.0 - 1e-12
#: The most (support points x lattice length) one law may cost to build, about a second of numpy.
MAX_WORK = 6e7


class MixtureTooLarge(Exception):
    """The mixing law would cost more than MAX_WORK at this lattice spacing."""


@dataclasses.dataclass(frozen=True)
class MixingLaw:
    r"""A computed law for ``S' <= S`` (coupled pointwise).

    Attributes:
      values: the values of S' (each at most the real value it stands for), nondecreasing, >= 0.
      weights: their computed masses; each is within relative ``relative_error`` of the mass of a
        measure ``p_trim <= law(S')`` (pointwise).
      relative_error: as above.
      trimmed: an upper bound on the total mass of ``law(S') - p_trim``.
      detail: how it was built.
    """

    values: np.ndarray
    weights: np.ndarray
    relative_error: float = 0.0
    trimmed: float = 0.0
    detail: str = ""


def finite_law(values: np.ndarray, weights: np.ndarray, detail: str = "") -> MixingLaw:
    """The law of one variable with finitely many values (shrunk by VALUE_SHRINK; no lattice)."""
    values = np.asarray(values, float) * VALUE_SHRINK
    order = np.argsort(values)
    return MixingLaw(values[order], np.asarray(weights, float)[order], 4.0 * _UNIT_ROUNDOFF, 0.0, detail)


class LatticeSum:
    r"""The law of ``S' = base + h J``, a sum of independent terms, each floored onto the lattice
    ``h Z`` (``h`` a power of two, so ``h J`` is exact in floating point), by direct convolution of
    nonnegative arrays (relative error of products and sums of nonnegative terms: tracked), the
    tails beyond ``trim_per_term`` dropped after each term and counted."""

    def __init__(self, spacing: float, terms: int, *, exact_values: bool = False):
        if spacing <= 0 or math.frexp(spacing)[0] != 0.5:
            raise ValueError(f"spacing must be a power of two. Found {spacing}.")
        self.h = spacing
        self.shrink = 1.0 if exact_values else VALUE_SHRINK  # exact_values: the values given are the real ones
        self.trim_per_term = TRIM / (2.0 * max(terms, 1) + 2.0)
        self.base: list[float] = []
        self.offset = 0
        self.pmf = np.ones(1)
        self.rel = 0.0
        self.trimmed = 0.0
        self.work = 0.0

    def lattice_index(self, values: np.ndarray) -> np.ndarray:
        """floor(value / h) of each value (shrunk first unless exact): h times it is <= the real value."""
        return np.floor(np.asarray(values, float) * self.shrink / self.h).astype(np.int64)

    def add_constant(self, value: float) -> None:
        """A deterministic term (kept exactly: no lattice)."""
        self.base.append(float(value))

    def add_term(self, values: np.ndarray, weights: np.ndarray) -> None:
        """One independent term taking ``values[k]`` with probability ``weights[k]`` (exact weights)."""
        j, inverse = np.unique(self.lattice_index(values), return_inverse=True)
        w = np.bincount(inverse.ravel(), weights=np.asarray(weights, float))
        self._convolve(j, w, (j.size + 1) * _UNIT_ROUNDOFF)

    def add_binomial(self, j: int, count: int, q: float) -> None:
        """``h j`` times a Binomial(count, q) variable (its tails beyond trim_per_term dropped and counted)."""
        if j == 0 or count == 0 or q == 0.0:
            return
        if q >= 1.0:
            self.offset += j * count
            return
        lo = int(stats.binom.ppf(self.trim_per_term / 2.0, count, q))
        hi = int(stats.binom.isf(self.trim_per_term / 2.0, count, q))
        lo, hi = max(lo - 1, 0), min(hi + 1, count)
        tail = (stats.binom.cdf(lo - 1, count, q) if lo > 0 else 0.0) + (
            stats.binom.sf(hi, count, q) if hi < count else 0.0
        )
        self.trimmed += 2.0 * float(tail)  # twice scipy's value: its relative error is far below 1
        k = np.arange(lo, hi + 1)
        self._convolve(j * k, stats.binom.pmf(k, count, q), PMF_RELATIVE_ERROR)

    def _convolve(self, j: np.ndarray, w: np.ndarray, w_rel: float) -> None:
        keep = w > 0
        j, w = j[keep], w[keep]
        length = self.pmf.size
        self.work += j.size * length
        if self.work > MAX_WORK:
            raise MixtureTooLarge(f"more than {MAX_WORK:.0e} operations at lattice spacing {self.h:g}")
        lo = int(j[0])
        d = j - lo
        out = np.zeros(length + int(d[-1]))
        for dk, wk in zip(d, w, strict=True):
            out[dk : dk + length] += wk * self.pmf
        # each entry: a sum of <= j.size products of two nonnegative computed numbers
        self.rel = (1.0 + self.rel) * (1.0 + w_rel) * (1.0 + (j.size + 1) * _UNIT_ROUNDOFF) - 1.0
        self.offset += lo
        self.pmf = out
        self._trim()

    def _trim(self) -> None:
        budget = self.trim_per_term
        cum = np.cumsum(self.pmf)
        left = int(np.searchsorted(cum, budget / 2.0, side="right"))
        rcum = np.cumsum(self.pmf[::-1])
        right = int(np.searchsorted(rcum, budget / 2.0, side="right"))
        if left + right >= self.pmf.size:
            return
        dropped = (cum[left - 1] if left else 0.0) + (rcum[right - 1] if right else 0.0)
        if dropped > 0:
            n = self.pmf.size
            self.trimmed += dropped * (1.0 + 2.0 * n * _UNIT_ROUNDOFF) / (1.0 - self.rel)
        self.pmf = self.pmf[left : self.pmf.size - right]
        self.offset += left

    def law(self, detail: str = "") -> MixingLaw:
        base = math.fsum(self.base) * self.shrink  # fsum: correctly rounded
        # h J is exact (h a power of two); the sum with base may round up by half an ulp: shrink it
        values = (base + self.h * (self.offset + np.arange(self.pmf.size, dtype=float))) * (1.0 - 4.0 * _UNIT_ROUNDOFF)
        keep = self.pmf > 0
        return MixingLaw(values[keep], self.pmf[keep], self.rel, self.trimmed, detail)


def _log_tail_sum(law: MixingLaw, t: float, shift: float, std: float, sign: float, upper_tail: bool) -> float:
    """log of sum_k w_k Phi_c((t - sign*shift*v_k)/std) (upper tail) or sum_k w_k Phi((t - ...)/std)."""
    u = (t - sign * shift * law.values) / std
    terms = special.log_ndtr(-u if upper_tail else u)
    with np.errstate(divide="ignore"):
        return float(special.logsumexp(terms + np.log(law.weights)))


def _log_gauss(t: float, std: float, upper_tail: bool) -> float:
    return float(special.log_ndtr(-t / std if upper_tail else t / std))


def _direction_value(law, shift, std, add_or_remove, direction, t, delta, escape):
    r"""Certified ``log((A - delta) / B)`` at threshold t (-inf when A <= delta).

    direction 0: A = lower bound on P(X > t), B = upper bound on Q(X > t);
    direction 1 (add-or-remove only): A = lower bound on Q(X < t), B = upper bound on P(X < t).
    B stays in log space (it may lie far below the smallest float)."""
    down = (1.0 - EVAL_RELATIVE_ERROR) / (1.0 + law.relative_error)
    up = (1.0 + EVAL_RELATIVE_ERROR) / (1.0 - law.relative_error)
    if direction == 0:
        a = math.exp(_log_tail_sum(law, t, shift, std, 1.0, True)) * down - escape
        if add_or_remove:
            log_b, extra = _log_gauss(t, std, True) + math.log1p(EVAL_RELATIVE_ERROR), escape
        else:
            log_b, extra = _log_tail_sum(law, t, shift, std, -1.0, True) + math.log(up), law.trimmed + escape
    else:
        a = math.exp(_log_gauss(t, std, False)) * (1.0 - EVAL_RELATIVE_ERROR) - escape
        log_b, extra = _log_tail_sum(law, t, shift, std, 1.0, False) + math.log(up), law.trimmed + escape
    if extra > 0:
        log_b = float(np.logaddexp(log_b, math.log(extra)))
    if a <= delta or log_b == -math.inf:
        return -math.inf
    return math.log(a - delta) - (log_b + 1e-15 * abs(log_b) + 1e-12)  # rounding of the logs


def _coarse(law: MixingLaw, points: int = 512) -> MixingLaw:
    """A cheap stand-in for the search only (never for a reported number)."""
    if law.values.size <= points:
        return law
    edges = np.linspace(0, law.values.size, points + 1).astype(int)
    w = np.add.reduceat(law.weights, edges[:-1])
    v = np.add.reduceat(law.weights * law.values, edges[:-1]) / np.where(w > 0, w, 1.0)
    keep = w > 0
    return MixingLaw(v[keep], w[keep])


def epsilon_lower_end(
    law: MixingLaw,
    shift: float,
    std: float,
    *,
    add_or_remove: bool,
    delta: float,
    escape: float = 0.0,
    thresholds: tuple[float, float] | None = None,
) -> float:
    r"""A certified lower bound on the exact epsilon at ``delta`` of ``X = shift S + N(0, std^2)``
    (S with the law of ``law``, any ``S >= S'``) against ``-shift S + N(0, std^2)`` (replace-one)
    or ``N(0, std^2)`` (add-or-remove, both orders); ``escape`` bounds, under each law, the
    probability of an event off which the pipeline's iterate equals X (projection or clipping
    inactive): it is subtracted from A and added to B. ``thresholds`` ``(lo, hi)``: only half-lines
    with ``lo <= t < hi`` are tested (those a monotone map, such as a projection onto a segment,
    leaves unchanged: docs/derivations/lower-end.md#last-use-instances).

    The threshold is searched on a coarse stand-in of the law (600 points) and refined by golden
    section on the full law; every value that enters the result is computed on the full law."""
    m_max = shift * float(law.values[-1])
    z = float(stats.norm.isf(min(delta, 0.25) / 4.0)) + 2.0
    directions = (0, 1) if add_or_remove else (0,)
    best = 0.0
    rough = _coarse(law)
    for direction in directions:
        lo, hi = -m_max - z * std, m_max + z * std
        if thresholds is not None:
            lo, hi = max(lo, thresholds[0]), min(hi, thresholds[1] - 1e-9 * (1.0 + abs(thresholds[1])))
            if not lo < hi:
                continue
        grid = np.linspace(lo, hi, 600)
        approx = [_direction_value(rough, shift, std, add_or_remove, direction, t, delta, escape) for t in grid]
        i = int(np.argmax(approx))
        if not math.isfinite(approx[i]):
            continue
        a, b = grid[max(i - 1, 0)], grid[min(i + 1, grid.size - 1)]

        def value(t: float, direction: int = direction) -> float:
            return _direction_value(law, shift, std, add_or_remove, direction, t, delta, escape)

        best = max(best, value(grid[i]))
        golden = (math.sqrt(5.0) - 1.0) / 2.0
        c, d = b - golden * (b - a), a + golden * (b - a)
        fc, fd = value(c), value(d)
        for _ in range(40):
            if fc >= fd:
                b, d, fd = d, c, fc
                c = b - golden * (b - a)
                fc = value(c)
            else:
                a, c, fc = c, d, fd
                d = a + golden * (b - a)
                fd = value(d)
            if b - a < 1e-7 * std:
                break
        best = max(best, fc, fd)
    return best
