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
  orders by dp-accounting's own series (``_compute_rdp_poisson_subsampled_gaussian``),
  so the numbers match dp-accounting's ``RdpAccountant`` and Opacus'
  ``RDPAccountant``.
* ``exact_fractional=False`` (used inside the minimisations of Altschuler &
  Talwar and Liang et al., where the SGM is evaluated at hundreds of noise
  levels): fractional orders are bounded by interpolating the cumulant
  :math:`(\alpha-1)S_\alpha`, which is convex in :math:`\alpha` (it is the log of
  a moment generating function), between the neighbouring integers. This is the
  rule dp-accounting itself applies to sampling without replacement (Wang,
  Balle & Kasiviswanathan 2019, Cor. 10). It can only over-estimate.

Why not call dp-accounting for everything: its SGM is a Python loop per order
(about 1 s for the library's default grid) and returns NaN for fractional orders
above about 1000 (a cancellation in ``_compute_log_a_frac``); the binomial sum
below is the same formula as dp-accounting's ``_compute_log_a_int``, evaluated
with numpy, and the tests pin it to dp-accounting to 1e-9 at integer orders.
"""

from __future__ import annotations

import functools
import math
import warnings

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp
from scipy import special


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
    r"""log A_a = (a-1) S_a(q, noise) at integer orders a >= 1 (0 at a = 1)."""
    starts, seg, i, a_minus_i, log_comb, i2mi = _binomial_layout(int_orders)
    noise = np.broadcast_to(np.asarray(noise, dtype=float), (len(int_orders),))
    terms = log_comb + i * math.log(q) + a_minus_i * math.log1p(-q) + i2mi / (2.0 * noise[seg] ** 2)
    peak = np.maximum.reduceat(terms, starts)
    out = np.log(np.add.reduceat(np.exp(terms - peak[seg]), starts)) + peak
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
    log_hi = log_lo.copy()
    log_hi[frac] = values[orders.size :]
    t = orders - floor
    return ((1.0 - t) * log_lo + t * log_hi) / (orders - 1.0)


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
    noise_arr = np.broadcast_to(np.asarray(noise, dtype=float), orders.shape)
    if q == 0.0:
        return np.zeros_like(orders)
    if q == 1.0:
        return orders / (2.0 * noise_arr**2)
    out = _interpolate_cumulant(orders, noise_arr, lambda ints, noise_of: _log_moment_int(q, noise_of, ints))
    is_int = orders == np.floor(orders)
    if exact_fractional and not is_int.all():
        frac = ~is_int
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            exact = np.array(
                [
                    _dp_rdp._compute_rdp_poisson_subsampled_gaussian(q, float(s), [a])[0]
                    for a, s in zip(orders[frac], noise_arr[frac], strict=True)
                ],
                dtype=float,
            )
        # dp-accounting's series is unstable for large fractional orders (NaN);
        # keep the interpolated bound wherever the series did not give a number.
        good = np.isfinite(exact) & (exact >= 0.0)
        out[frac] = np.where(good, np.minimum(exact, out[frac]), out[frac])
    return np.maximum(out, 0.0)


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
    log_abs = np.concatenate(([0.0], x * (x + 1.0) / (2.0 * noise**2)))
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
    log(1 + sum_{i=2..a} exp(s_i)) with its terms s_i (0 at order 1)."""
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
    s = math.log(2.0) + (i - 1.0) * i / (2.0 * noise**2)  # log 2 + cgf(i - 1)
    small = (a <= _WOR_EXACT_MAX_ORDER) & (i > 2)
    if small.any():
        deltas = _wor_forward_differences(noise, int(min(o.max(), _WOR_EXACT_MAX_ORDER)))
        lo = (2 * np.floor(i[small] / 2.0) - 1).astype(np.int64)
        hi = (2 * np.ceil(i[small] / 2.0) - 1).astype(np.int64)
        s[small] = np.minimum(math.log(4.0) + 0.5 * (deltas[lo] + deltas[hi]), s[small])
    f2 = 1.0 / noise**2  # func(2) = 2 / (2 noise^2)
    s[i == 2] = min(math.log(4.0) + f2 + math.log(-math.expm1(-f2)), f2 + math.log(2.0))
    terms = s + i * math.log(q) + log_comb
    peak = np.maximum(np.maximum.reduceat(terms, starts), 0.0)
    out[big] = peak + np.log(np.exp(-peak) + np.add.reduceat(np.exp(terms - peak[seg]), starts))
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
    if q == 1.0:
        return orders / (2.0 * noise**2)
    noise_arr = np.full(orders.shape, float(noise))
    out = _interpolate_cumulant(orders, noise_arr, lambda ints, _: _wor_log_moment(q, float(noise), ints))
    return np.maximum(out, 0.0)
