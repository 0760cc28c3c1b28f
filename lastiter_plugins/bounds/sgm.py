r"""Renyi divergence of the sampled Gaussian mechanism (SGM).

:math:`S_\alpha(q, s)` is the order-:math:`\alpha` Renyi divergence between
:math:`(1-q)\mathcal N(0, s^2) + q\mathcal N(1, s^2)` and :math:`\mathcal N(0, s^2)`
(sensitivity 1, noise standard deviation ``s``): Mironov, Talwar & Zhang (2019),
the quantity Altschuler & Talwar call :math:`S_\alpha(q, \sigma)` (seed 001,
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
    floor = np.floor(orders).astype(np.int64)
    ceil = np.ceil(orders).astype(np.int64)
    is_int = floor == ceil
    # cumulants at floor and ceil (same order for integer orders)
    log_lo = _log_moment_int(q, noise_arr, tuple(floor.tolist()))
    log_hi = np.where(is_int, log_lo, _log_moment_int(q, noise_arr, tuple(ceil.tolist())))
    t = orders - floor
    out = ((1.0 - t) * log_lo + t * log_hi) / (orders - 1.0)
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
