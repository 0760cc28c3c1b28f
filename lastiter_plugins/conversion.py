r"""RDP -> (epsilon, delta), and the order grid shared by the whole library.

Every epsilon is dp-accounting's improved conversion (``compute_epsilon``;
Canonne, Kamath & Steinke 2020, arXiv 2004.00010, Prop. 12) at one order, with
the RDP bound's own value at that order. Three ways of choosing the order:

* :func:`rdp_to_epsilon`: the best order of a fixed grid;
* :func:`epsilon_of_linear_rdp`: the exact continuous optimum for curves linear in
  the order (:math:`r(\alpha) = \rho\alpha`);
* :func:`refine_epsilon`: starting from the grid optimum, a bounded search that
  evaluates the bound at new orders.

Delta at a given epsilon is the counterpart, with dp-accounting's ``compute_delta``:
:func:`delta_of_linear_rdp` (the continuous optimum of a line) and :func:`refine_delta`
(the grid, refined by evaluating the bound at new orders).

:func:`monotone_envelope` raises a curve to its running maximum over the orders
(valid, and free on a non-decreasing curve), which lets
:func:`epsilon_lower_estimate` bound the refined epsilon from below with the
curve at a few orders (docs/derivations/lower-estimates.md#few-orders).

A finer choice of order can only lower epsilon to a value the curve proves; it
never interpolates RDP values between orders. Inputs are trusted: the public edge
validates delta, epsilon and the orders (:mod:`lastiter_plugins.validation`).
"""

from __future__ import annotations

import math
import numbers
import sys
import warnings
from collections.abc import Callable

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _dp_rdp
from scipy import optimize

#: dp-accounting's conversion gives ``inf`` at orders <= 1.01 (a numerical
#: cut-off); the smallest order at which it gives a number is the next float.
MIN_CONVERSION_ORDER: float = float(np.nextafter(1.01, 2.0))

RdpCallable = Callable[[np.ndarray], np.ndarray]


class OrderGridWarning(UserWarning):
    """The optimal order sits at an edge of the order grid: widen the grid."""


def _warn_if_at_edge(orders: np.ndarray, order: float, eps: float) -> None:
    # inf: no order gives a finite epsilon, so no wider grid would help either
    if 0 < eps < math.inf and orders.size > 1 and order in (float(orders.min()), float(orders.max())):
        warnings.warn(
            f"the optimal Renyi order {order:g} is at the edge of the order grid "
            f"[{orders.min():g}, {orders.max():g}]; epsilon may improve with a wider grid.",
            OrderGridWarning,
            stacklevel=4,
        )


def _usable(orders: np.ndarray, rdp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (order, RDP) pairs the conversion can use: finite RDP (inf and NaN are skipped)."""
    orders = np.asarray(orders, dtype=float).reshape(-1)
    rdp = np.asarray(rdp, dtype=float).reshape(-1)
    if orders.shape != rdp.shape:
        raise ValueError(f"orders and rdp must have the same length. Found {orders.size} and {rdp.size}.")
    finite = np.isfinite(rdp)
    if (rdp[finite] < 0).any():
        raise ValueError(f"RDP values must be >= 0. Found {rdp[finite].min():g}.")
    return orders[finite], rdp[finite]


def _grid_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> tuple[float, float]:
    """dp-accounting's ``compute_epsilon`` over the finite values; (inf, first order) when none."""
    usable_orders, usable_rdp = _usable(orders, rdp)
    if usable_orders.size == 0:
        return math.inf, float(np.asarray(orders, dtype=float).reshape(-1)[0])
    with np.errstate(over="ignore"):
        eps, order = _dp_rdp.compute_epsilon(usable_orders, usable_rdp, delta)
    return float(eps), float(order)


def _epsilon_each(orders: np.ndarray, rdp: np.ndarray, delta: float) -> np.ndarray:
    """dp-accounting's per-order conversion, vectorised (same formula and special cases).

    Used only to rank candidate orders; every returned number is recomputed by
    dp-accounting itself. Non-finite RDP gives ``inf``.
    """
    orders = np.asarray(orders, dtype=float)
    rdp = np.asarray(rdp, dtype=float)
    out = np.full(orders.shape, math.inf)
    finite = np.isfinite(rdp)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        zero = finite & (delta**2 + np.expm1(-np.where(finite, rdp, 0.0)) > 0)
        ok = finite & ~zero & (orders > 1.01)
        a, r = orders[ok], rdp[ok]
        out[ok] = np.maximum(r + np.log1p(-1.0 / a) - np.log(delta * a) / (a - 1.0), 0.0)
    out[zero] = 0.0
    return np.where(np.isnan(out), math.inf, out)


def rdp_to_epsilon(orders: np.ndarray, rdp: np.ndarray, delta: float) -> tuple[float, float]:
    r"""Smallest epsilon over the orders, by dp-accounting's improved conversion
    (Canonne, Kamath & Steinke 2020, arXiv 2004.00010, Prop. 12; ``compute_epsilon``).

    Orders whose RDP is not finite are skipped. Warns with :class:`OrderGridWarning`
    when the optimum is at an edge of the grid.

    Args:
      orders: Renyi orders (> 1).
      rdp: RDP (nats) at each order, >= 0 where finite.
      delta: target delta in (0, 1).

    Returns:
      (epsilon, optimal order); epsilon is ``inf`` (at the first order) when no
      RDP value is finite.

    Raises:
      ValueError: an invalid delta, mismatched lengths, or a negative RDP value.
    """
    orders = np.asarray(orders, dtype=float).reshape(-1)
    eps, order = _grid_epsilon(orders, rdp, delta)
    _warn_if_at_edge(orders, order, eps)
    return eps, order


def _stationary_order(slope: float, log_inv_delta: float) -> float:
    r"""The unique minimiser over :math:`\alpha > 1` of the conversion formula for the
    line :math:`r(\alpha) = \mathrm{slope}\cdot\alpha`: the root of
    :math:`g(x) = \mathrm{slope}\,x^2 + \log(1+x) - L`, :math:`x = \alpha - 1`,
    :math:`L = \log(1/\delta)`, bracketed by
    :math:`x_{lo} = 2L/(1+\sqrt{1+4\,\mathrm{slope}\,L})` and
    :math:`x_{hi} = \min(\sqrt{L/\mathrm{slope}}, e^L - 1)` (docs/derivations/conversion.md#linear-curves).
    Finite for every slope >= 0 (at most 1/delta).
    """
    big = log_inv_delta
    with np.errstate(over="ignore"):
        x_lo = 2.0 * big / (1.0 + math.sqrt(1.0 + 4.0 * slope * big)) if slope < 1e300 else 0.0
    x_hi = math.expm1(min(big, 709.0))  # g(x_hi) >= 0 unless delta < e^-709 (then a valid, finite order)
    if slope > 0.0:
        x_hi = min(x_hi, math.sqrt(big / slope))

    def g(x: float) -> float:
        return slope * x * x + math.log1p(x) - big

    lo_val, hi_val = g(x_lo), g(x_hi)
    if lo_val >= 0.0:
        x = x_lo
    elif hi_val <= 0.0:
        x = x_hi
    else:
        x = optimize.brentq(g, x_lo, x_hi, xtol=1e-300, rtol=4.0 * np.finfo(float).eps, maxiter=500, disp=False)
    return 1.0 + x


def epsilon_of_linear_rdp(rho: float, delta: float) -> tuple[float, float]:
    r"""Exact continuous optimum of the conversion for an RDP curve linear in the order.

    For :math:`r(\alpha) = \rho\alpha` (every bound that is a multiple of the order,
    e.g. :math:`c\,\alpha/z^2`), the improved conversion (Canonne, Kamath & Steinke
    2020, arXiv 2004.00010, Prop. 12) has derivative
    :math:`\rho - (\log(1/\delta) - \log\alpha)/(\alpha-1)^2`, with exactly one zero
    :math:`\alpha^*` in :math:`(1, 1/\delta]`, its global minimiser (derivation in
    docs/derivations/conversion.md#lossless-conversion). The order is clipped to dp-accounting's domain
    (:math:`\alpha > 1.01`), and epsilon is dp-accounting's ``compute_epsilon`` at
    that one order with RDP :math:`\rho\alpha`: valid by construction, whatever the
    precision of the root.

    Args:
      rho: slope of the curve, >= 0 (``inf`` gives ``inf``).
      delta: target delta in (0, 1).

    Returns:
      (epsilon, order): epsilon equals ``compute_epsilon([order], [rho * order], delta)``.

    Raises:
      ValueError: ``rho`` is negative or NaN, or ``delta`` is not in (0, 1).
    """
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or math.isnan(rho) or rho < 0:
        raise ValueError(f"rho (the RDP per unit order) must be >= 0. Found {rho!r}.")
    rho = float(rho)
    if math.isinf(rho):
        return math.inf, MIN_CONVERSION_ORDER
    # The KL case of the conversion (epsilon = 0) holds first at the smallest order.
    at_min, _ = _grid_epsilon(np.array([MIN_CONVERSION_ORDER]), np.array([rho * MIN_CONVERSION_ORDER]), delta)
    if at_min == 0.0:
        return 0.0, MIN_CONVERSION_ORDER
    order = max(_stationary_order(rho, -math.log(delta)), MIN_CONVERSION_ORDER)
    with np.errstate(over="ignore"):
        value = rho * order
    eps, _ = _grid_epsilon(np.array([order]), np.array([value]), delta)
    return eps, order


def _evaluate(rdp_at: RdpCallable, new_orders: np.ndarray) -> np.ndarray:
    values = np.asarray(rdp_at(new_orders.copy()), dtype=float).reshape(-1)
    if values.shape != new_orders.shape:
        raise ValueError(f"rdp_at must return one value per order: {new_orders.size} asked, {values.size} returned.")
    if (values < 0).any():
        raise ValueError(f"rdp_at returned a negative RDP value: {values[values < 0][0]:g}.")
    return values


# A local minimum of the grid's epsilons is searched in the first round when it is
# within this factor of the best one: on the default grid the continuous optimum of
# a basin is at most ~4% below its best grid value (benchmarks/bench_conversion.py),
# so a basin farther off cannot hold the optimum. At most _MAX_BASINS are searched.
_BASIN_SLACK = 0.1
_MAX_BASINS = 3


def _basins(eps: np.ndarray, best: float) -> list[int]:
    """Indices of the local minima of ``eps`` (plateaus counted once) within the slack of ``best``, best first."""
    left = np.concatenate(([math.inf], eps[:-1]))
    right = np.concatenate((eps[1:], [math.inf]))
    found = np.flatnonzero((eps < left) & (eps <= right) & (eps <= best * (1.0 + _BASIN_SLACK)))
    return [int(i) for i in found[np.argsort(eps[found], kind="stable")][:_MAX_BASINS]]


def _candidates(
    centre: int, orders: np.ndarray, rdp: np.ndarray, low: float, high: float, points: int, log_inv_delta: float
) -> np.ndarray:
    """New orders strictly between the evaluated neighbours of ``orders[centre]``: ``points`` evenly
    spaced ones, split between the two sides of the centre; the integers nearest the centre (the
    sampled-Gaussian bounds are exact at integers, chords between them); and the stationary order
    of the conversion for the chord of the curve over the bracket."""
    mid = float(orders[centre])
    lo = max(float(orders[max(centre - 1, 0)]), low)
    hi = min(float(orders[min(centre + 1, orders.size - 1)]), high)
    if not lo < hi:
        return np.empty(0)
    sides = [(a, b) for a, b in ((lo, mid), (mid, hi)) if a < b]
    counts = [points] if len(sides) == 1 else [points // 2, points - points // 2]
    new = [x for (a, b), k in zip(sides, counts, strict=True) for x in np.linspace(a, b, k + 2)[1:-1]]
    new += [math.floor(mid), math.ceil(mid)] if mid != math.floor(mid) else [mid - 1.0, mid + 1.0]
    with np.errstate(invalid="ignore", over="ignore"):
        r_lo, r_hi = np.interp([lo, hi], orders, rdp)  # a slope for a guess only, never an RDP value
        slope = (r_hi - r_lo) / (hi - lo)
    if math.isfinite(slope) and slope >= 0.0:
        new.append(_stationary_order(slope, log_inv_delta))
    new_arr = np.array(new, dtype=float)
    return new_arr[(new_arr > lo) & (new_arr < hi)]


def refine_epsilon(
    rdp_at: RdpCallable,
    orders: np.ndarray,
    rdp: np.ndarray,
    delta: float,
    *,
    points: int = 12,
    rounds: int = 3,
) -> tuple[float, float]:
    r"""The grid conversion, refined by evaluating the bound at new orders.

    Starts from :func:`rdp_to_epsilon` on ``(orders, rdp)``. Each round makes one
    vectorised call ``rdp_at(new_orders)``: ``points`` orders evenly spaced strictly
    between the evaluated orders either side of the best one so far (half on each
    side), the integers nearest it, and the stationary order of the conversion for
    the chord of the curve over that bracket (exact for a linear curve). The first
    round does this around each local minimum of the grid's epsilons within 10% of
    the best (at most 3: a minimum of several bounds can have several basins). Epsilon is the minimum of dp-accounting's
    ``compute_epsilon`` (Canonne, Kamath & Steinke 2020, arXiv 2004.00010, Prop. 12)
    over every evaluated order, so it is valid at the returned order and never above
    the grid value. No smoothness is assumed (the sampled Gaussian's chord bound has
    kinks at integer orders). The search stays within ``[min(orders), max(orders)]``;
    :class:`OrderGridWarning` is issued, as by :func:`rdp_to_epsilon`, when the grid
    optimum sits at an edge. Derivation: docs/derivations/conversion.md#lossless-conversion.

    Args:
      rdp_at: the RDP bound (nats) at an array of orders > 1; may return ``inf``.
      orders: the grid of orders (> 1) at which ``rdp`` was computed.
      rdp: the bound's values at ``orders``.
      delta: target delta in (0, 1).
      points: evenly spaced new orders per bracket and round (>= 1).
      rounds: maximal number of calls of ``rdp_at`` (>= 0; 0 gives the grid result).
        A call asks for at most ``points + 3`` orders, ``3 * (points + 3)`` in the first.

    Returns:
      (epsilon, order): epsilon equals ``compute_epsilon([order], [rdp_at([order])[0]], delta)``
      (or the grid value at a grid order).

    Raises:
      ValueError: an invalid delta, points or rounds, mismatched lengths, a negative
        RDP value, or ``rdp_at`` returning the wrong number of values.
    """
    if isinstance(points, bool) or not isinstance(points, numbers.Integral) or points < 1:
        raise ValueError(f"points must be an integer >= 1. Found {points!r}.")
    if isinstance(rounds, bool) or not isinstance(rounds, numbers.Integral) or rounds < 0:
        raise ValueError(f"rounds must be an integer >= 0. Found {rounds!r}.")
    orders = np.asarray(orders, dtype=float).reshape(-1)
    rdp = np.asarray(rdp, dtype=float).reshape(-1)
    eps, order = _grid_epsilon(orders, rdp, delta)
    _warn_if_at_edge(orders, order, eps)
    if not (0.0 < eps < math.inf) or rounds == 0:
        return eps, order
    log_inv_delta = -math.log(delta)
    low, high = max(float(orders.min()), MIN_CONVERSION_ORDER), float(orders.max())
    sort = np.argsort(orders, kind="stable")
    seen_orders, seen_rdp = orders[sort], rdp[sort]
    seen_eps = _epsilon_each(seen_orders, seen_rdp, delta)
    for step in range(int(rounds)):
        centres = _basins(seen_eps, float(seen_eps.min())) if step == 0 else [int(np.argmin(seen_eps))]
        pieces = [_candidates(c, seen_orders, seen_rdp, low, high, int(points), log_inv_delta) for c in centres]
        new = np.setdiff1d(np.concatenate(pieces), seen_orders)
        if new.size == 0:
            break
        values = _evaluate(rdp_at, new)
        seen_orders = np.concatenate([seen_orders, new])
        seen_rdp = np.concatenate([seen_rdp, values])
        seen_eps = np.concatenate([seen_eps, _epsilon_each(new, values, delta)])
        sort = np.argsort(seen_orders, kind="stable")
        seen_orders, seen_rdp, seen_eps = seen_orders[sort], seen_rdp[sort], seen_eps[sort]
        if float(seen_eps.min()) == 0.0:
            break
    # The final numbers are dp-accounting's own, over the new orders (the grid's are known).
    fresh = ~np.isin(seen_orders, orders)
    refined, refined_order = _grid_epsilon(seen_orders[fresh], seen_rdp[fresh], delta) if fresh.any() else (eps, order)
    if refined < eps:
        return refined, refined_order
    return eps, order


# ---------------------------------------------------------------- delta at a given epsilon


def _host_delta(orders: np.ndarray, rdp: np.ndarray, eps: float) -> tuple[float, float]:
    """dp-accounting's ``compute_delta`` over the finite values ((1, first order) when none)."""
    finite = np.isfinite(rdp)
    if not finite.any():
        return 1.0, float(orders[0])
    # Below 2**-53, exp(-rdp) rounds to 1 and the host's KL term log1p(-exp(-rdp)) fails (a domain error): such
    # values are raised to 2**-53 (a larger RDP value is still a valid bound).
    values = np.where((rdp[finite] > 0.0) & (rdp[finite] < _SMALLEST_RDP), _SMALLEST_RDP, rdp[finite])
    with np.errstate(over="ignore"):  # (alpha - 1) * (rdp - eps) beyond a double at a huge eps: log delta -inf
        found, order = _dp_rdp.compute_delta(orders[finite], values, eps)
    return float(found), float(order)


#: The smallest positive RDP value dp-accounting's ``compute_delta`` converts (see :func:`_host_delta`).
_SMALLEST_RDP = 2.0**-53


def _log_delta_each(orders: np.ndarray, rdp: np.ndarray, eps: float) -> np.ndarray:
    """dp-accounting's per-order log delta, vectorised (to rank candidate orders only)."""
    out = np.zeros(orders.shape)  # non-finite RDP: delta 1
    finite = np.isfinite(rdp)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r = np.where(finite, rdp, 0.0)
        kl = np.where(r > 0, 0.5 * np.log1p(-np.exp(-r)), -np.inf)
        improved = (orders - 1.0) * (r - eps + np.log1p(-1.0 / orders)) - np.log(orders)
        value = np.where(orders > 1.01, np.minimum(kl, improved), kl)
    out[finite] = value[finite]
    return np.where(np.isnan(out), 0.0, out)


def delta_of_linear_rdp(rho: float, eps: float) -> tuple[float, float]:
    r"""(delta, order) at ``eps`` for the RDP curve :math:`\rho\alpha`, at the continuous optimum.

    dp-accounting's improved conversion (Canonne, Kamath & Steinke 2020, arXiv
    2004.00010, Prop. 12) at order :math:`\alpha` gives
    :math:`\log\delta = (\alpha-1)(\rho\alpha - \varepsilon + \log(1 - 1/\alpha)) - \log\alpha`,
    whose derivative :math:`\rho(2\alpha-1) - \varepsilon + \log((\alpha-1)/\alpha)` is
    increasing (second derivative :math:`2\rho + 1/(\alpha(\alpha-1)) > 0`): one
    minimiser, found by Brent's method. The number is dp-accounting's
    ``compute_delta`` at that order (clipped to its domain, > 1.01) and at the
    smallest order (its KL bound), with the line's values: valid whatever the
    precision of the root.
    """
    if rho == 0.0 or math.isinf(eps):
        return 0.0, MIN_CONVERSION_ORDER
    if not math.isfinite(rho):
        return 1.0, MIN_CONVERSION_ORDER

    def slope(a: float) -> float:
        return rho * (2.0 * a - 1.0) - eps + math.log1p(-1.0 / a)

    lo = MIN_CONVERSION_ORDER
    order = lo
    if slope(lo) < 0.0:
        hi = max(2.0, (eps + math.log(2.0)) / (2.0 * rho) + 1.0)  # slope(hi) > 0 in exact arithmetic
        while math.isfinite(hi) and slope(hi) <= 0.0:  # rounded to <= 0 at a huge eps: further out
            hi *= 2.0
        if math.isfinite(hi):  # a bracket up to 1e308 wide: up to about 1100 halvings to machine precision
            order = max(optimize.brentq(slope, lo, hi, xtol=1e-12, rtol=4.0 * np.finfo(float).eps, maxiter=2200), lo)
        else:  # the minimiser is beyond every double: any order is valid, the largest gives the least
            order = sys.float_info.max
    orders = np.array([order, lo])
    return _host_delta(orders, rho * orders, eps)


def refine_delta(
    rdp_at, orders: np.ndarray, rdp: np.ndarray, eps: float, *, points: int = 12, rounds: int = 4
) -> tuple[float, float]:
    """(delta, order) at ``eps``: the grid conversion, refined by evaluating the bound at new orders.

    The counterpart of :func:`refine_epsilon` for delta:
    each round evaluates ``rdp_at`` at ``points`` orders evenly spaced between
    the evaluated neighbours of the best order so far and at the integers next
    to it (the first round around each of the three best local minima). The
    search stays within the grid's range. The number is dp-accounting's
    ``compute_delta`` over every evaluated order (never above the grid's).
    """
    order_arr = np.asarray(orders, dtype=float)
    sort = np.argsort(order_arr, kind="stable")
    seen_orders, seen_rdp = order_arr[sort], np.asarray(rdp, dtype=float)[sort]
    low, high = float(seen_orders[0]), float(seen_orders[-1])
    seen_log = _log_delta_each(seen_orders, seen_rdp, eps)
    for step in range(rounds):
        if not np.isfinite(seen_log.min()) or seen_log.min() >= 0.0:
            break  # delta 0 already, or no order gives anything below 1
        centres = _local_minima(seen_log) if step == 0 else [int(np.argmin(seen_log))]
        new = np.setdiff1d(np.concatenate([_around(c, seen_orders, low, high, points) for c in centres]), seen_orders)
        if new.size == 0:
            break
        values = np.asarray(rdp_at(new.copy()), dtype=float).reshape(-1)
        if values.shape != new.shape or (values < 0).any():
            raise RuntimeError(f"internal error: invalid RDP values at new orders: {values}")
        seen_orders = np.concatenate([seen_orders, new])
        seen_rdp = np.concatenate([seen_rdp, values])
        seen_log = np.concatenate([seen_log, _log_delta_each(new, values, eps)])
        sort = np.argsort(seen_orders, kind="stable")
        seen_orders, seen_rdp, seen_log = seen_orders[sort], seen_rdp[sort], seen_log[sort]
    polished = _polish(rdp_at, seen_orders, seen_log, eps, low, high)
    if polished is not None:
        seen_orders = np.append(seen_orders, polished[0])
        seen_rdp = np.append(seen_rdp, polished[1])
    return _host_delta(seen_orders, seen_rdp, eps)


def _polish(rdp_at, orders: np.ndarray, log_delta: np.ndarray, eps: float, low: float, high: float):
    """(order, RDP) at the minimiser of log delta between the evaluated neighbours of the best order,
    by bounded Brent to near machine precision, or None.

    Why: the set of orders at which (eps, delta) holds is the set at which epsilon at delta is
    <= eps, an interval around the continuous optimum. The core's epsilon search stops inside
    it at some precision; finding the minimiser of delta more precisely lands inside it too,
    so delta at the epsilon reported for delta is <= delta (up to rounding)."""
    best = int(np.argmin(log_delta))
    if not (np.isfinite(log_delta[best]) and log_delta[best] < 0.0):
        return None
    lo = max(float(orders[max(best - 1, 0)]), low, MIN_CONVERSION_ORDER)
    hi = min(float(orders[min(best + 1, orders.size - 1)]), high)
    if not lo < hi:
        return None

    def objective(a: float) -> float:
        value = float(np.asarray(rdp_at(np.array([a])), dtype=float).reshape(-1)[0])
        return float(_log_delta_each(np.array([a]), np.array([value]), eps)[0])

    found = optimize.minimize_scalar(
        objective, bounds=(lo, hi), method="bounded", options={"xatol": 1e-13 * hi, "maxiter": 200}
    )
    order = float(found.x)
    value = float(np.asarray(rdp_at(np.array([order])), dtype=float).reshape(-1)[0])
    if not value >= 0.0:
        raise RuntimeError(f"internal error: invalid RDP value {value} at order {order}")
    return order, value


def _local_minima(values: np.ndarray, at_most: int = 3) -> list[int]:
    left = np.concatenate(([math.inf], values[:-1]))
    right = np.concatenate((values[1:], [math.inf]))
    found = np.flatnonzero((values < left) & (values <= right))
    if found.size == 0:
        found = np.array([int(np.argmin(values))])
    return [int(i) for i in found[np.argsort(values[found], kind="stable")][:at_most]]


def _around(centre: int, orders: np.ndarray, low: float, high: float, points: int) -> np.ndarray:
    mid = float(orders[centre])
    lo = max(float(orders[max(centre - 1, 0)]), low, MIN_CONVERSION_ORDER)
    hi = min(float(orders[min(centre + 1, orders.size - 1)]), high)
    if not lo < hi:
        return np.empty(0)
    new = [*np.linspace(lo, mid, points // 2 + 2)[1:-1], *np.linspace(mid, hi, points - points // 2 + 2)[1:-1]]
    new += [math.floor(mid), math.ceil(mid)] if mid != math.floor(mid) else [mid - 1.0, mid + 1.0]
    arr = np.array(new, dtype=float)
    return arr[(arr > lo) & (arr < hi)]


# ---------------------------------------------------------------- lower estimates
# (docs/derivations/lower-estimates.md#few-orders)


def monotone_envelope(rdp_at: RdpCallable, orders: np.ndarray, rdp: np.ndarray) -> tuple[RdpCallable, np.ndarray]:
    """A curve raised to its running maximum over the orders (docs/derivations/lower-estimates.md#envelope).

    Returns ``(raised_at, raised)``: ``raised`` is ``rdp`` where each finite value is raised to the
    largest finite value at a smaller order of ``orders``; ``raised_at(new)`` is ``rdp_at(new)``
    raised to the largest finite grid value at an order <= each new order (new orders below the
    grid are not raised). Raising an RDP bound keeps it valid; on a non-decreasing curve nothing
    changes. Non-finite values stay as they are (the conversion skips them).
    """
    orders = np.asarray(orders, dtype=float).reshape(-1)
    rdp = np.asarray(rdp, dtype=float).reshape(-1)
    sort = np.argsort(orders, kind="stable")
    sorted_orders = orders[sort]
    finite = np.isfinite(rdp[sort])
    floor = np.maximum.accumulate(np.where(finite, np.maximum(rdp[sort], 0.0), 0.0))
    raised = np.empty_like(rdp)
    raised[sort] = np.where(finite, floor, rdp[sort])

    def raised_at(new: np.ndarray) -> np.ndarray:
        new = np.asarray(new, dtype=float)
        values = np.asarray(rdp_at(new), dtype=float)
        below = np.searchsorted(sorted_orders, new, side="right") - 1
        return np.where(below >= 0, np.maximum(values, floor[np.maximum(below, 0)]), values)

    return raised_at, raised


def _h_infimum(lo: np.ndarray, hi: np.ndarray, delta: float) -> np.ndarray:
    """inf of h(a) = log(1 - 1/a) + (L - log a)/(a - 1) over [lo, hi] (lo > 1.01): h decreases up to
    a = 1/delta and increases after (docs/derivations/lower-estimates.md#few-orders-estimate), so the infimum is at the
    clipped 1/delta."""
    at = np.minimum(np.maximum(1.0 / delta, lo), hi)
    return np.log1p(-1.0 / at) + (-math.log(delta) - np.log(at)) / (at - 1.0)


#: First orders asked by :func:`epsilon_lower_estimate`: the grid orders nearest 1 + 2^k / 4, up to 33 (larger
#: orders are asked only if the piece above 33 can beat the bar: some bounds cost more there).
_ESTIMATE_ORDERS = 1.0 + 2.0 ** np.arange(8) / 4.0


def epsilon_lower_estimate(
    rdp_at: RdpCallable, orders: np.ndarray, delta: float, beat: float, *, rounds: int = 3
) -> float:
    """A proven lower bound on the epsilon :func:`refine_epsilon` reports for the envelope of
    :func:`monotone_envelope` on ``orders``, from the curve at a few of the orders
    (docs/derivations/lower-estimates.md#few-orders).

    The first call of ``rdp_at`` asks for the first grid order and the ones nearest 1 + 2^k / 4 up to 33;
    while a piece between asked orders has a bound <= ``beat``, the pieces at or below the bar are
    split at their middle grid order, one vectorised call per round, at most ``rounds`` more
    calls. Stops as soon as every piece is above ``beat`` (the row cannot beat it), or one at or
    below the bar cannot be split. ``beat = inf`` refines every piece down to one grid step
    (within ``rounds``): the tightest estimate.

    Returns:
      The estimate (0 when nothing can be claimed): above ``beat`` only if the reported epsilon is.
    """
    grid = np.unique(np.asarray(orders, dtype=float).reshape(-1))
    n = grid.size
    asked = np.unique(np.concatenate(([0], np.searchsorted(grid, _ESTIMATE_ORDERS).clip(0, n - 1))))
    values: dict[int, float] = {}
    zero_case = -2.0 * math.log1p(-delta * delta)  # r below half of it converts to epsilon 0 (2: rounding)
    estimate = 0.0
    for _ in range(int(rounds) + 1):
        new = np.array([i for i in asked if i not in values], dtype=int)
        if new.size:
            got = np.asarray(rdp_at(grid[new]), dtype=float).reshape(-1)
            values.update(zip(new.tolist(), got.tolist(), strict=True))
        starts = np.array(sorted(values), dtype=int)
        r = np.array([values[i] for i in starts])
        floor = np.maximum.accumulate(np.where(np.isfinite(r), np.maximum(r, 0.0), 0.0))
        if floor[0] <= zero_case:
            return 0.0
        ends = np.append(starts[1:], n - 1)
        lo = np.maximum(grid[starts], MIN_CONVERSION_ORDER)
        hi = grid[ends]
        with np.errstate(divide="ignore", invalid="ignore"):
            bounds = np.where(hi > MIN_CONVERSION_ORDER, floor + _h_infimum(lo, np.maximum(hi, lo), delta), math.inf)
        bounds = bounds * (1.0 - 1e-9) - 1e-12
        estimate = max(float(bounds.min()), 0.0)
        low = bounds <= beat
        if not low.any():
            return estimate
        splittable = ends - starts >= 2
        if (math.isfinite(beat) and (low & ~splittable).any()) or not (low & splittable).any():
            return estimate  # the bar cannot be cleared (or nothing is left to split)
        split = low & splittable
        asked = np.concatenate((starts, (starts[split] + ends[split]) // 2))
    return estimate
