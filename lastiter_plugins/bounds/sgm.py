r"""Renyi divergence of the sampled Gaussian mechanism (SGM).

:math:`S_\alpha(q, s)` is the order-:math:`\alpha` Renyi divergence between
:math:`(1-q)\mathcal N(0, s^2) + q\mathcal N(1, s^2)` and :math:`\mathcal N(0, s^2)`
(sensitivity 1, noise standard deviation ``s``): Mironov, Talwar & Zhang (2019),
the quantity Altschuler & Talwar call :math:`S_\alpha(q, \sigma)` (arXiv 2205.13710,
Def. 2.10) and that dominates the divergence in the other direction as well
(Mironov, Talwar & Zhang, Thm. 5).

Two ways of evaluating it, both upper bounds on the exact value and both
equal to it at integer orders:

* :func:`sgm_rdp` with ``exact_fractional=True`` (used by the baselines users
  compare against): integer orders by the closed-form binomial sum, fractional
  orders by dp-accounting's own series (``_compute_rdp_poisson_subsampled_gaussian``,
  re-evaluated here for all orders at once, term for term), so the numbers match
  dp-accounting's ``RdpAccountant`` and Opacus' ``RDPAccountant``.
* ``exact_fractional=False`` (used inside the minimisations of Altschuler &
  Talwar and Liang et al., where the SGM is evaluated at hundreds of noise
  levels): fractional orders are bounded by interpolating the cumulant
  :math:`(\alpha-1)S_\alpha`, which is convex in :math:`\alpha` (it is the log of
  a moment generating function), between the neighbouring integers. This is the
  rule dp-accounting itself applies to sampling without replacement (Wang,
  Balle & Kasiviswanathan 2019, Cor. 10). It can only over-estimate.

Extreme arguments: the sums below are O(alpha)
in memory and time, so orders above :data:`MAX_SUMMED_ORDER` use the Gaussian
bound :math:`\alpha/(2s^2)` instead, an upper bound on both divergences at every
order (joint convexity of :math:`e^{(\alpha-1)D_\alpha}` over the pairs
"example in the batch / not in the batch", each at most
:math:`\alpha/(2s^2)`); noise so small that :math:`1/(2s^2)` exceeds
:data:`_HUGE` (s < 7e-126) gives ``inf`` (vacuous), and noise so large that it
underflows gives the value of zero noise-to-sensitivity ratio, 0.

Why not call dp-accounting for everything: its SGM is a Python loop per order
(about 1 s for the library's default grid) and returns NaN for fractional orders
above about 1000 (a cancellation in ``_compute_log_a_frac``); the binomial sum
below is the same formula as dp-accounting's ``_compute_log_a_int``, evaluated
with numpy, and the tests pin it to dp-accounting to 1e-9 at integer orders.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp
from scipy import special

#: Orders above this are bounded by the Gaussian mechanism's alpha / (2 s^2) (see the module docstring).
MAX_SUMMED_ORDER = 2**17
_HUGE = 1e250  # 1/(2 s^2) above this: the divergence is reported as inf
_CHUNK = 2**22  # terms of the binomial sums evaluated at once


def _half_inverse_square(noise: np.ndarray) -> np.ndarray:
    """1/(2 s^2) per entry: inf where it overflows, 0 where it underflows, never a warning."""
    with np.errstate(over="ignore", under="ignore"):
        return 0.5 / noise / noise


def _log_sum_by_segment(terms: np.ndarray, starts: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """log of the sum of exp(terms) over each segment; +inf where a term is +inf or the sum overflows."""
    peak = np.maximum.reduceat(terms, starts)
    shift = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(over="ignore", divide="ignore"):
        out = np.log(np.add.reduceat(np.exp(terms - shift[seg]), starts)) + shift
    return np.where(peak == np.inf, np.inf, out)


def _log1p_exp(x: np.ndarray) -> np.ndarray:
    """log(1 + e^x), accurate for every x (also where e^x is far below the float spacing of 1)."""
    with np.errstate(over="ignore"):
        return np.where(x < 0.0, np.log1p(np.exp(np.minimum(x, 0.0))), x + np.log1p(np.exp(-np.abs(x))))


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x - 1) for x >= 0 (-inf at 0), without overflow."""
    with np.errstate(divide="ignore", over="ignore"):
        return np.where(x > 1.0, x + np.log1p(-np.exp(-np.maximum(x, 1.0))), np.log(np.expm1(np.minimum(x, 1.0))))


def _chunks(int_orders: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Consecutive groups of orders whose sums hold at most _CHUNK terms together (one order may exceed it)."""
    groups: list[tuple[int, ...]] = []
    current: list[int] = []
    size = 0
    for a in int_orders:
        if current and size + a + 1 > _CHUNK:
            groups.append(tuple(current))
            current, size = [], 0
        current.append(a)
        size += a + 1
    if current:
        groups.append(tuple(current))
    return groups


@functools.lru_cache(maxsize=32)
def _binomial_layout(int_orders: tuple[int, ...]):
    """Flat index arrays for sum_{i=0..a} over every integer order a."""
    orders = np.asarray(int_orders, dtype=np.int64)
    sizes = orders + 1
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    seg = np.repeat(np.arange(len(orders)), sizes)
    i = np.arange(sizes.sum()) - np.repeat(starts, sizes)
    a = orders[seg]
    log_comb = special.gammaln(a + 1.0) - special.gammaln(i + 1.0) - special.gammaln(a - i + 1.0)
    i = i.astype(float)
    return starts, seg, i, (a - i).astype(float), log_comb, (i * i - i)


def _log_moment_int(q: float, noise: np.ndarray, int_orders: tuple[int, ...]) -> np.ndarray:
    r"""log A_a = (a-1) S_a(q, noise) at integer orders a >= 1 (0 at a = 1); ``inf`` where it overflows.
    ``noise`` holds one value per order, each with 1/(2 s^2) <= _HUGE.

    :math:`A_a = \sum_i \binom{a}{i} q^i (1-q)^{a-i} e^{(i^2-i)/(2s^2)}`
    (Mironov, Talwar & Zhang 2019, arXiv 1908.10530, Thm. 4), evaluated as
    :math:`\log(1 + \sum_{i\ge 2} \binom{a}{i} q^i (1-q)^{a-i}\,\mathrm{expm1}((i^2-i)/(2s^2)))`:
    the binomial weights sum to 1 and the terms i = 0, 1 have exponent 0, so every
    remaining term is positive and nothing cancels. (Summing the terms of A_a
    directly loses everything below the float spacing of 1: at q = 1e-9 the
    excess A_2 - 1 ~ 1e-18 rounds to 0, which times T = 1e12 steps is an
    optimistic 0 instead of ~1e-6.)"""
    noise = np.broadcast_to(np.asarray(noise, dtype=float), (len(int_orders),))
    half_inv = _half_inverse_square(noise)
    parts, start = [], 0
    for group in _chunks(int_orders):
        starts, seg, i, a_minus_i, log_comb, i2mi = _binomial_layout(group)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflowing term makes the moment inf: an upper bound
            excess = _log_expm1(i2mi * half_inv[start + seg])  # -inf for i = 0, 1
            terms = log_comb + i * math.log(q) + a_minus_i * math.log1p(-q) + excess
        parts.append(_log1p_exp(_log_sum_by_segment(terms, starts, seg)))
        start += len(group)
    out = np.concatenate(parts)
    return np.where(np.asarray(int_orders) == 1, 0.0, out)


def _interpolate_cumulant(orders: np.ndarray, noise: np.ndarray, log_moment) -> np.ndarray:
    r"""RDP at every order from the cumulant log A_a = (a-1) eps(a) at integer orders.

    Exact at integer orders; at a fractional order a in (k, k+1) the convex
    cumulant is bounded by its chord: eps(a) <= ((1-t) log A_k + t log A_{k+1}) / (a-1),
    t = a - k (an upper bound; Wang, Balle & Kasiviswanathan 2019, Cor. 10).
    ``log_moment(int_orders, noise)`` evaluates the cumulant at integer orders,
    one noise value each. The integer orders asked for depend on ``orders``
    only (the floor of every order, then the ceiling of the fractional ones), so
    their layout is built once per order grid.
    """
    floor = np.floor(orders)
    frac = orders != floor
    ints = np.concatenate([floor, np.ceil(orders[frac])]).astype(np.int64)
    values = log_moment(tuple(ints.tolist()), np.concatenate([noise, noise[frac]]))
    log_lo = values[: orders.size]
    out = log_lo.copy()
    t = orders[frac] - floor[frac]
    out[frac] = (1.0 - t) * log_lo[frac] + t * values[orders.size :]  # t in (0, 1): inf stays inf, never 0 * inf
    return out / (orders - 1.0)


def sgm_rdp(
    q: float,
    noise: float | np.ndarray,
    orders: np.ndarray,
    *,
    exact_fractional: bool = False,
) -> np.ndarray:
    r"""RDP :math:`S_\alpha(q, s)` of the sampled Gaussian mechanism at each order.

    Args:
      q: sampling probability in [0, 1].
      noise: noise standard deviation relative to sensitivity 1 (``s > 0``);
        a scalar, or one value per order.
      orders: orders > 1.
      exact_fractional: evaluate fractional orders with dp-accounting's series
        instead of the (larger) convex interpolation; see the module docstring.

    Returns:
      Array of RDP values (nats), upper bounds on the exact divergence, equal
      to it at integer orders.
    """
    orders = np.asarray(orders, dtype=float)
    if np.ndim(noise) == 0 and orders.ndim == 1:  # composition and liang-unbounded ask for the same curve
        return np.array(_sgm_rdp_cached(float(q), float(noise), tuple(orders.tolist()), exact_fractional))
    return _sgm_rdp(q, noise, orders, exact_fractional)


@functools.lru_cache(maxsize=256)
def _sgm_rdp_cached(q: float, noise: float, orders: tuple[float, ...], exact_fractional: bool) -> np.ndarray:
    out = _sgm_rdp(q, noise, np.array(orders), exact_fractional)
    out.setflags(write=False)
    return out


def _sgm_rdp(q: float, noise, orders: np.ndarray, exact_fractional: bool) -> np.ndarray:
    noise_arr = np.broadcast_to(np.asarray(noise, dtype=float), orders.shape)
    if q == 0.0:
        return np.zeros_like(orders)
    half_inv = _half_inverse_square(noise_arr)
    with np.errstate(over="ignore"):
        gaussian = orders * half_inv  # alpha / (2 s^2): q = 1, and an upper bound for every q
    if q == 1.0:
        return gaussian
    out, summed = _extremes(orders, half_inv, gaussian)
    if summed.any():
        sub_orders = orders[summed]
        out[summed] = _interpolate_cumulant(
            sub_orders, noise_arr[summed], lambda ints, noise_of: _log_moment_int(q, noise_of, ints)
        )
        frac = summed & (orders != np.floor(orders)) & np.isfinite(out) & (out > 0.0)
        if exact_fractional and frac.any():
            # dp-accounting's fractional series sums terms near 1, so its cumulant (a-1) eps(a) is
            # only resolved above ~1e-15: below _SERIES_FLOOR the chord (an upper bound from the
            # exact integer orders) is kept, since the series can round a tiny divergence to 0.
            series = _dp_accounting_fractional(q, orders[frac], noise_arr[frac])
            reliable = (orders[frac] - 1.0) * series > _SERIES_FLOOR
            out[frac] = np.where(reliable, np.minimum(out[frac], series), out[frac])
    return np.maximum(out, 0.0)


#: Below this cumulant dp-accounting's fractional series is not trusted (rounding near 1).
_SERIES_FLOOR = 1e-9


def _extremes(orders: np.ndarray, half_inv: np.ndarray, gaussian: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values fixed without a sum (inf where 1/(2 s^2) > _HUGE, the Gaussian bound above
    MAX_SUMMED_ORDER), and the mask of the orders left to the sums."""
    out = np.where(half_inv > _HUGE, np.inf, gaussian)
    summed = (half_inv <= _HUGE) & (orders <= MAX_SUMMED_ORDER)
    return out, summed


def _dp_accounting_fractional(q: float, orders: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """dp-accounting's series at fractional orders (``_compute_rdp_poisson_subsampled_gaussian``),
    evaluated by :func:`_fractional_log_moment`; inf wherever dp-accounting gives no number (its
    series is unstable for large fractional orders, NaN, and may raise at extreme noise)."""
    orders = np.asarray(orders, dtype=float)
    noise = np.broadcast_to(np.asarray(noise, dtype=float), orders.shape)
    out = np.full(orders.shape, np.inf)
    plain = (0.0 < q < 1.0) & np.isfinite(orders) & (orders != np.floor(orders)) & np.isfinite(noise) & (noise > 0.0)
    idx = np.flatnonzero(plain)
    handed_back = np.zeros(idx.size, dtype=bool)
    if idx.size:
        with np.errstate(all="ignore"):
            log_moment, handed_back = _fractional_log_moment(q, orders[idx], noise[idx])
            out[idx] = log_moment / (orders[idx] - 1.0)
    for k in np.concatenate([np.flatnonzero(~plain), idx[handed_back]]):
        out[k] = _dp_accounting_one(q, float(orders[k]), float(noise[k]))
    return np.where(np.isfinite(out) & (out >= 0.0), out, np.inf)


def _dp_accounting_one(q: float, order: float, noise: float) -> float:
    """dp-accounting's own per-order call, for the arguments :func:`_fractional_log_moment` hands back."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        try:
            return float(_dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, noise, [order])[0])
        except (ArithmeticError, ValueError):
            return math.inf


#: Newer dp-accounting (0.6 tested) stops its fractional series after this many terms (``inf`` if it
#: has not converged); None for the older series (0.4.x), which has no cap. See _fractional_log_moment.
_DPA_SERIES_CAP: int | None = getattr(_dp_rdp, "_MAX_STEPS_LOG_A_FRAC", None)
_FIRST_TERMS = 128  # terms per order in the first block (enough for q <= 0.01, s >= 1); then doubled
_MAX_TERMS = 2**20  # the uncapped series handed back to dp-accounting beyond this many terms


def _fractional_log_moment(q: float, orders: np.ndarray, noise: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""log A_alpha at fractional orders by the series of dp-accounting's ``_compute_log_a_frac``
    (Mironov, Talwar & Zhang 2019, arXiv 1908.10530, Sec. 3.3), term for term as the installed
    dp-accounting sums it, so the results agree to the last bit.

    A_alpha splits at z0 = s^2 log(1/q - 1) + 1/2 into two series over i = 0, 1, ... with terms
    :math:`|\binom{\alpha}{i}| q^i (1-q)^{\alpha-i} e^{(i^2-i)/(2s^2)} \mathrm{erfc}((i-z_0)/(\sqrt2 s))/2`
    and the same with i and j = alpha - i swapped in the powers, the exponent and the erfc argument.
    The installed version decides how they are added and when they stop:

    * 0.4.x: signed terms (the sign of the binomial coefficient), added and subtracted in log space;
      a partial sum that would turn negative raises (-> inf); stops after the first i whose two terms
      are both below e^-30. The subtractions are a sequential loop over the precomputed terms, with
      the math module's functions as dp-accounting uses them.
    * newer (0.6 tested; has ``_MAX_STEPS_LOG_A_FRAC``): |terms| added (a larger sum, still an upper
      bound), by ``np.logaddexp.accumulate`` (the same operations as its ``_log_add``); stops at the first i
      where both terms decrease and lie 30 nats below the running total; inf after the cap.

    The terms are computed a block of i at a time for all orders at once, with the same scipy
    functions and the same arithmetic in the same order as dp-accounting; logs and exps that
    dp-accounting takes with the math module are taken with it here too (numpy's own may differ in
    the last bit on some CPUs, and near q -> 0 the cumulant is a few ulps of 1).

    Args:
      q: sampling probability in (0, 1).
      orders: fractional orders > 1.
      noise: noise standard deviation per order (> 0, finite).

    Returns:
      (log A_alpha per order, mask of the orders handed back to dp-accounting's own loop: a NaN or
      +inf term, or an uncapped series longer than _MAX_TERMS).
    """
    n = orders.size
    log_moment = np.full(n, np.inf)
    handed_back = np.zeros(n, dtype=bool)
    setup = [_series_constants(q, a, s) for a, s in zip(orders.tolist(), noise.tolist(), strict=True)]
    active = np.array([c is not None for c in setup], dtype=bool)  # others raise in dp-accounting: inf
    z0, scale, den = (np.array([c[k] if c else np.nan for c in setup]) for k in range(3))
    capped = _DPA_SERIES_CAP is not None
    log_q = math.log(q)
    log_1mq = math.log1p(-q) if capped else math.log(1 - q)
    limit = _MAX_TERMS if _DPA_SERIES_CAP is None else _DPA_SERIES_CAP
    carry = np.full((n, 4), -np.inf)  # capped: running sums a0, a1 and the previous terms s0, s1
    pieces: list[list[tuple[np.ndarray, ...]]] = [[] for _ in range(n)]  # signed: terms up to the stop
    lo, width = 0, _FIRST_TERMS
    while active.any() and lo < limit:
        rows = np.flatnonzero(active)
        hi = min(lo + width, limit)
        i = np.arange(lo, hi, dtype=float)[None, :]
        a = orders[rows, None]
        z, sc, d = z0[rows, None], scale[rows, None], den[rows, None]
        j = a - i
        if capped:
            log_coef = special.gammaln(a + 1) - special.gammaln(i + 1) - special.gammaln(j + 1)
            positive = np.zeros((0, 0), dtype=bool)  # the capped series has no signs
        else:
            coef = special.binom(a, i)
            positive = coef > 0
            magnitude = np.abs(coef)
            log_coef = np.array([math.log(c) if c > 0.0 else math.nan for c in magnitude.ravel().tolist()])
            log_coef = log_coef.reshape(magnitude.shape)  # math.log as dp-accounting; log 0 raises there
        log_e0 = _LOG_HALF + (_LOG_TWO + special.log_ndtr(-((i - z) / sc) * _ROOT_TWO))
        log_e1 = _LOG_HALF + (_LOG_TWO + special.log_ndtr(-((z - j) / sc) * _ROOT_TWO))
        s0 = log_coef + i * log_q + j * log_1mq + (i * i - i) / d + log_e0
        s1 = log_coef + j * log_q + i * log_1mq + (j * j - j) / d + log_e1
        if capped:
            acc0 = np.logaddexp.accumulate(np.column_stack([carry[rows, 0], s0]), axis=1)[:, 1:]
            acc1 = np.logaddexp.accumulate(np.column_stack([carry[rows, 1], s1]), axis=1)[:, 1:]
            total = np.logaddexp(acc0, acc1)
            prev0 = np.column_stack([carry[rows, 2], s0[:, :-1]])
            prev1 = np.column_stack([carry[rows, 3], s1[:, :-1]])
            stop = (s0 < prev0) & (s1 < prev1) & (np.maximum(s0, s1) < total - 30)
            carry[rows] = np.column_stack([acc0[:, -1], acc1[:, -1], s0[:, -1], s1[:, -1]])
        else:
            stop = np.maximum(s0, s1) < -30
        odd = np.isnan(s0) | np.isnan(s1) | (s0 == np.inf) | (s1 == np.inf)
        first_stop = np.where(stop.any(axis=1), stop.argmax(axis=1), hi - lo)
        first_odd = np.where(odd.any(axis=1), odd.argmax(axis=1), hi - lo)
        for r, row in enumerate(rows.tolist()):
            end = first_stop[r]
            if first_odd[r] <= end and first_odd[r] < hi - lo:
                handed_back[row], active[row] = True, False
            elif capped:
                if end < hi - lo:
                    log_moment[row], active[row] = total[r, end], False
            else:
                pieces[row].append((s0[r, : end + 1], s1[r, : end + 1], positive[r, : end + 1]))
                if end < hi - lo:
                    active[row] = False
                    log_moment[row] = _signed_log_moment(*map(np.concatenate, zip(*pieces[row], strict=True)))
        lo, width = hi, min(2 * width, 2**16)
    if not capped:
        handed_back |= active  # no stop within _MAX_TERMS: dp-accounting's own loop decides
    return log_moment, handed_back


_LOG_HALF = math.log(0.5)
_LOG_TWO = math.log(2)
_ROOT_TWO = 2**0.5


def _series_constants(q: float, order: float, noise: float) -> tuple[float, float, float] | None:
    """z0, sqrt(2) s and 2 s^2 as dp-accounting computes them (Python floats); None where that raises."""
    try:
        z0 = noise**2 * math.log(1 / q - 1) + 0.5
        den = 2 * (noise**2)
    except (ArithmeticError, ValueError):
        return None
    return (z0, math.sqrt(2) * noise, den) if den != 0.0 else None  # dp-accounting divides by 2 s^2


def _signed_log_moment(s0: np.ndarray, s1: np.ndarray, positive: np.ndarray) -> float:
    """dp-accounting 0.4.x's running sums: log-add the terms with positive binomial coefficient,
    log-subtract the others (inf where a partial sum would turn negative), then add the two parts."""
    signs = positive.tolist()
    try:
        return _log_add(_signed_log_sum(s0.tolist(), signs), _signed_log_sum(s1.tolist(), signs))
    except ValueError:
        return math.inf


def _signed_log_sum(terms: list[float], positive: list[bool]) -> float:
    total = -math.inf
    for term, add in zip(terms, positive, strict=True):
        if add:  # _log_add, inlined: this loop is the series' only per-term Python
            low, high = (total, term) if total < term else (term, total)
            total = high if low == -math.inf else math.log1p(math.exp(low - high)) + high
        elif total < term:
            raise ValueError(f"partial sum would be negative: log {total} - log {term}")
        elif total == term:
            total = -math.inf
        elif term != -math.inf:
            with contextlib.suppress(OverflowError):  # expm1 overflows: the term is negligible, total stays
                total = math.log(math.expm1(total - term)) + term
    return total


def _log_add(x: float, y: float) -> float:
    low, high = min(x, y), max(x, y)
    return high if low == -math.inf else math.log1p(math.exp(low - high)) + high


# Orders up to which dp-accounting evaluates Wang et al.'s Theorem 27 with forward
# differences; above it uses the (larger) closed-form term, as here.
_WOR_EXACT_MAX_ORDER = 256


@functools.lru_cache(maxsize=64)
def _wor_forward_differences(noise: float, max_order: int) -> np.ndarray:
    r"""log |i-th forward difference| at 0, i = 0..max_order+1, of the sequence
    (1, e^{cgf(0)}, e^{cgf(1)}, ...), cgf(x) = x(x+1)/(2 noise^2): the table
    dp-accounting's ``_get_forward_diffs`` builds for Wang et al.'s Theorem 27,
    computed level by level with numpy in signed log space (the tests pin the
    resulting RDP to dp-accounting's to 1e-9). The i-th difference does not
    depend on how many are computed, so one table serves every order <= max_order.
    """
    x = np.arange(max_order + 2, dtype=float)
    log_abs = np.concatenate(([0.0], x * (x + 1.0) * _half_inverse_square(np.array(noise))))
    positive = np.ones(log_abs.size, dtype=bool)
    deltas = np.empty(max_order + 2)
    with np.errstate(divide="ignore"):
        for level in range(max_order + 2):
            a, b = log_abs[:-1], log_abs[1:]  # next = b - a (signed)
            peak = np.maximum(a, b)
            peak = np.where(np.isfinite(peak), peak, 0.0)
            value = np.where(positive[1:], 1.0, -1.0) * np.exp(b - peak) - np.where(positive[:-1], 1.0, -1.0) * np.exp(
                a - peak
            )
            log_abs = peak + np.log(np.abs(value))
            positive = value > 0
            deltas[level] = log_abs[0]
    return deltas


def _wor_log_moment(q: float, noise: float, int_orders: tuple[int, ...]) -> np.ndarray:
    """dp-accounting's ``_compute_rdp_sample_wor_gaussian_int`` at each integer order, vectorised:
    log(1 + sum_{i=2..a} exp(s_i)) with its terms s_i (0 at order 1); ``inf`` where it overflows.
    Needs 1/(2 noise^2) <= _HUGE."""
    return np.concatenate([_wor_log_moment_group(q, noise, group) for group in _chunks(int_orders)])


def _wor_log_moment_group(q: float, noise: float, int_orders: tuple[int, ...]) -> np.ndarray:
    orders = np.asarray(int_orders, dtype=np.int64)
    out = np.zeros(orders.size)
    big = orders >= 2
    if not big.any():
        return out
    o = orders[big]
    sizes = o - 1  # terms i = 2..a
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    seg = np.repeat(np.arange(o.size), sizes)
    i = (np.arange(sizes.sum()) - np.repeat(starts, sizes) + 2).astype(float)
    a = o[seg].astype(float)
    log_comb = special.gammaln(a + 1.0) - special.gammaln(i + 1.0) - special.gammaln(a - i + 1.0)
    half_inv = float(_half_inverse_square(np.array([noise]))[0])
    with np.errstate(over="ignore"):  # an overflowing term makes the moment inf: an upper bound
        s = math.log(2.0) + (i - 1.0) * i * half_inv  # log 2 + cgf(i - 1)
    small = (a <= _WOR_EXACT_MAX_ORDER) & (i > 2)
    if small.any():
        deltas = _wor_forward_differences(noise, int(min(o.max(), _WOR_EXACT_MAX_ORDER)))
        lo = (2 * np.floor(i[small] / 2.0) - 1).astype(np.int64)
        hi = (2 * np.ceil(i[small] / 2.0) - 1).astype(np.int64)
        s[small] = np.minimum(math.log(4.0) + 0.5 * (deltas[lo] + deltas[hi]), s[small])
    f2 = 2.0 * half_inv  # func(2) = 2 / (2 noise^2)
    exact_two = math.log(4.0) + f2 + math.log(-math.expm1(-f2)) if f2 > 0.0 else -math.inf
    s[i == 2] = min(exact_two, f2 + math.log(2.0))
    terms = s + i * math.log(q) + log_comb
    # log(1 + sum exp(terms)) per order, without adding the 1 first (it would absorb a tiny sum)
    out[big] = _log1p_exp(_log_sum_by_segment(terms, starts, seg))
    return out


def sgm_without_replacement_rdp(q: float, noise: float, orders: np.ndarray) -> np.ndarray:
    r"""RDP of the Gaussian mechanism on a uniformly random batch of size b = q n
    drawn without replacement, replace-one neighbours (Wang, Balle &
    Kasiviswanathan 2019, Theorem 27), exactly as dp-accounting's
    ``_compute_rdp_sample_wor_gaussian`` computes it (the tests pin the two to
    1e-9), with numpy instead of a Python loop per order.

    Args:
      q: b / n.
      noise: noise standard deviation relative to the sensitivity.
      orders: orders > 1.
    """
    orders = np.asarray(orders, dtype=float)
    noise_arr = np.full(orders.shape, float(noise))
    half_inv = _half_inverse_square(noise_arr)
    with np.errstate(over="ignore"):
        gaussian = orders * half_inv  # alpha / (2 s^2): q = 1, and an upper bound for every q
    if q == 1.0:
        return gaussian
    out, summed = _extremes(orders, half_inv, gaussian)
    if summed.any():
        out[summed] = _interpolate_cumulant(
            orders[summed], noise_arr[summed], lambda ints, _: _wor_log_moment(q, float(noise), ints)
        )
    return np.maximum(out, 0.0)
