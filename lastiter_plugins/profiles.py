r"""Gaussian privacy profiles: mu-GDP and finite mixtures of mu-GDP profiles.

A mechanism is :math:`\mu`-GDP when its tradeoff function is at least
:math:`G_\mu(\alpha) = \Phi(\Phi^{-1}(1-\alpha) - \mu)` (Dong, Roth & Su 2019,
"Gaussian Differential Privacy", arXiv 1905.02383). It then satisfies
:math:`(\varepsilon, \delta_\mu(\varepsilon))`-DP for every
:math:`\varepsilon \ge 0` and no better (their Cor. 2.13),

.. math:: \delta_\mu(\varepsilon) = \Phi\Big(-\frac{\varepsilon}{\mu} + \frac{\mu}{2}\Big)
   - e^{\varepsilon}\,\Phi\Big(-\frac{\varepsilon}{\mu} - \frac{\mu}{2}\Big),

and Renyi DP :math:`\alpha\mu^2/2` at every order (the pair of output laws is
a post-processing of :math:`\mathcal N(0,1), \mathcal N(\mu,1)`).

Mixtures. When the released laws are :math:`P = \sum_j w_j P_j`,
:math:`Q = \sum_j w_j Q_j` with the same weights and each pair
:math:`(P_j, Q_j)` is :math:`\mu_j`-GDP (a secret random permutation: the
position of the differing example), joint convexity of the hockey-stick
divergence :math:`\int (p - e^\varepsilon q)_+` gives
:math:`\delta(\varepsilon) \le \sum_j w_j \delta_{\mu_j}(\varepsilon)`, and joint
convexity of :math:`\int p^\alpha q^{1-\alpha}` (:math:`\alpha > 1`) gives
:math:`D_\alpha \le \frac{1}{\alpha-1}\log\sum_j w_j e^{(\alpha-1)\alpha\mu_j^2/2}`.

Numerics: everything is computed in log space. With :math:`a = -\varepsilon/\mu + \mu/2`
and :math:`b = a - \mu`, :math:`b^2 - a^2 = 2\varepsilon`, so
:math:`e^\varepsilon\varphi(b) = \varphi(a)` and, with the Mills ratio
:math:`m(v) = \Phi(-v)/\varphi(v)` (:math:`m' = vm - 1`),

.. math:: \delta_\mu(\varepsilon) = \varphi(a)\,[m(-a) - m(-a+\mu)]
   = \varphi(a) \int_{-a}^{-a+\mu} (1 - v\,m(v))\,dv,

which never subtracts two nearly equal probabilities (Gauss-Legendre on the
integral for :math:`\mu \le 1`, the difference otherwise; the direct formula
where :math:`a > 5`, where :math:`\delta` is close to 1).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import numpy as np
from scipy import optimize, special

__all__ = [
    "GaussianMixtureProfile",
    "gdp_delta",
    "gdp_epsilon",
    "gdp_log_delta",
    "gdp_rdp",
    "mixture_delta",
    "mixture_epsilon",
    "mixture_rdp",
]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT_PI_2 = math.sqrt(math.pi / 2.0)
_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(24)
_MAX_COMPONENTS = 4096  # mixtures with more distinct mus are merged (rounding mu up)


def _mills(v: np.ndarray) -> np.ndarray:
    r"""Mills ratio :math:`m(v) = \Phi(-v)/\varphi(v)`, finite for v >= -30."""
    return _SQRT_PI_2 * special.erfcx(v / math.sqrt(2.0))


def _one_minus_v_mills(v: np.ndarray) -> np.ndarray:
    r""":math:`1 - v\,m(v) > 0` (:math:`= -m'(v)`)."""
    return 1.0 - v * _mills(v)


def gdp_log_delta(mu: float | np.ndarray, eps: float | np.ndarray) -> np.ndarray:
    r"""Natural log of :math:`\delta_\mu(\varepsilon)` (see the module docstring), broadcast.

    Args:
      mu: GDP parameter(s), >= 0 (``inf`` allowed: delta = 1).
      eps: epsilon(s), >= 0 (``inf`` allowed: delta = 0).

    Returns:
      log delta; ``-inf`` where delta = 0 (mu = 0 or eps = inf).

    Raises:
      ValueError: a negative or NaN argument.
    """
    mu_b, eps_b = np.broadcast_arrays(np.asarray(mu, dtype=float), np.asarray(eps, dtype=float))
    if np.any(np.isnan(mu_b)) or np.any(np.isnan(eps_b)) or np.any(mu_b < 0) or np.any(eps_b < 0):
        raise ValueError("mu and eps must be >= 0 (not NaN).")
    out = _log_delta(mu_b.ravel(), eps_b.ravel()).reshape(mu_b.shape)
    return out if out.ndim else out[()]


def _log_delta(mu: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """Vectorised log delta_mu(eps) for validated 1-D arrays of equal length."""
    out = np.full(mu.shape, -np.inf)
    out[np.isinf(mu) & np.isfinite(eps)] = 0.0
    ok = (mu > 0) & np.isfinite(mu) & np.isfinite(eps)
    if not ok.any():
        return out
    m, e = mu[ok], eps[ok]
    res = np.empty(m.shape)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a = -e / m + m / 2.0  # -inf where eps/mu overflows (mu tiny): then delta is 0
        # delta close to 1 (a > 5): Phi(a) - e^eps Phi(b), no cancellation to fear
        big = a > 5.0
        if big.any():
            second = np.exp(np.minimum(e[big] + special.log_ndtr(a[big] - m[big]), 0.0))
            res[big] = np.log(np.maximum(special.ndtr(a[big]) - second, np.finfo(float).tiny))
        small = ~big & (m <= 1.0)
        if small.any():
            u, ms = -a[small], m[small]
            v = u[:, None] + 0.5 * ms[:, None] * (_GL_NODES[None, :] + 1.0)
            integral = 0.5 * ms * (_one_minus_v_mills(v) @ _GL_WEIGHTS)
            res[small] = -0.5 * a[small] ** 2 - _LOG_SQRT_2PI + np.log(integral)
        rest = ~big & (m > 1.0)
        if rest.any():
            u, ms = -a[rest], m[rest]
            integral = _mills(u) - _mills(u + ms)
            res[rest] = -0.5 * a[rest] ** 2 - _LOG_SQRT_2PI + np.log(integral)
    res[~(res > -np.inf)] = -np.inf  # an integral that underflowed to 0 (or below): delta is 0 to double precision
    out[ok] = res
    return out


def _log_delta_scalar(mu: float, eps: float) -> float:
    return float(_log_delta(np.array([mu]), np.array([eps]))[0])


def gdp_delta(mu: float | np.ndarray, eps: float | np.ndarray) -> np.ndarray:
    r""":math:`\delta_\mu(\varepsilon) = \Phi(-\varepsilon/\mu + \mu/2) - e^\varepsilon\Phi(-\varepsilon/\mu - \mu/2)`.

    The exact privacy profile of :math:`\mu`-GDP (Dong, Roth & Su 2019,
    arXiv 1905.02383, Cor. 2.13). Stable for mu from 1e-8 to 1e3 and beyond.

    Args:
      mu: GDP parameter(s), >= 0.
      eps: epsilon(s), >= 0.

    Returns:
      delta, broadcast over the arguments (0 where mu = 0 or eps = inf).
    """
    return np.exp(gdp_log_delta(mu, eps))


def _upper_bracket(log_delta, log_target: float, start: float) -> float:
    """An eps with delta(eps) <= target, doubling from ``start``; inf when no double reaches the target
    (the epsilon exceeds the largest double: inf is its correct, vacuous, rounding)."""
    hi = min(max(start, 1e-300), 1e300) if math.isfinite(start) else 1.0
    while math.isfinite(hi):
        if log_delta(hi) <= log_target:
            return hi
        hi *= 2.0
    return math.inf


def _remembered(log_delta: Callable[[float], float]) -> Callable[[float], float]:
    """``log_delta`` computed once per argument (a mixture's costs about a millisecond)."""
    seen: dict[float, float] = {}

    def at(eps: float) -> float:
        if eps not in seen:
            seen[eps] = log_delta(eps)
        return seen[eps]

    return at


def _solve_epsilon(log_delta, delta: float, scale: float) -> float:
    r"""Smallest eps >= 0 with delta(eps) <= target, delta(.) decreasing; re-checked."""
    if not 0.0 <= delta <= 1.0 or math.isnan(delta):
        raise ValueError(f"delta must be in [0, 1]. Found {delta}.")
    if delta == 0.0:
        return math.inf
    log_delta = _remembered(log_delta)  # the bracket ends and the result are asked for twice
    log_target = math.log(delta)
    if log_delta(0.0) <= log_target:
        return 0.0
    hi = _upper_bracket(log_delta, log_target, scale)
    if math.isinf(hi):
        return math.inf
    eps = optimize.brentq(lambda e: log_delta(e) - log_target, 0.0, hi, xtol=1e-15, rtol=1e-13, maxiter=500)
    # never report an epsilon whose delta exceeds the target: step up until it holds
    step = max(abs(eps) * 1e-13, 1e-300)
    while log_delta(eps) > log_target or math.exp(log_delta(eps)) > delta:
        eps += step
        step *= 2.0
    return float(eps)


def gdp_epsilon(mu: float, delta: float) -> float:
    r"""Smallest :math:`\varepsilon \ge 0` with :math:`\delta_\mu(\varepsilon) \le \delta`.

    Exact inversion of the decreasing privacy profile by a bracketed root-find
    (Brent) on :math:`\log\delta_\mu`; the returned value is re-checked and
    nudged up until its delta is <= the target.

    Args:
      mu: GDP parameter, >= 0 (``inf``: returns inf for delta < 1).
      delta: target delta in [0, 1].

    Returns:
      epsilon; 0 when :math:`\delta_\mu(0) = 2\Phi(\mu/2) - 1 \le \delta`, ``inf``
      when delta = 0 and mu > 0.

    Raises:
      ValueError: mu < 0 or delta outside [0, 1].
    """
    mu = float(mu)
    if mu < 0 or math.isnan(mu):
        raise ValueError(f"mu must be >= 0. Found {mu}.")
    if mu == 0.0:
        if not 0.0 <= delta <= 1.0:
            raise ValueError(f"delta must be in [0, 1]. Found {delta}.")
        return 0.0
    if math.isinf(mu):
        return 0.0 if delta >= 1.0 else math.inf
    # a starting point for the bracket (inf for mu > 1e154: the bracket then starts at 1)
    scale = mu * mu / 2.0 + mu * (math.sqrt(2.0 * max(-math.log(max(delta, 1e-300)), 1.0)) + 1.0)
    return _solve_epsilon(lambda e: _log_delta_scalar(mu, e), float(delta), scale)


def gdp_rdp(mu: float, orders: np.ndarray | float) -> np.ndarray:
    r"""Renyi DP of :math:`\mu`-GDP: :math:`\alpha\mu^2/2` at each order (nats)."""
    return np.asarray(orders, dtype=float) * float(mu) ** 2 / 2.0


def _validate_mixture(weights, mus) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(weights, dtype=float).ravel()
    m = np.asarray(mus, dtype=float).ravel()
    if w.size != m.size or w.size == 0:
        raise ValueError(f"weights and mus must be non-empty and of equal length. Found {w.size} and {m.size}.")
    if np.any(w < 0) or not np.all(np.isfinite(w)):
        raise ValueError("weights must be finite and >= 0.")
    total = float(w.sum())
    if not abs(total - 1.0) <= 1e-9:
        raise ValueError(f"weights must sum to 1. Found {total!r}.")
    if np.any(m < 0) or np.any(np.isnan(m)):
        raise ValueError("mus must be >= 0.")
    keep = w > 0
    return w[keep], m[keep]


def _unique_sum(w: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ``m`` (sorted) and the sum of ``w`` over each: ``np.unique`` and
    ``np.bincount``, without the sort when ``m`` is already sorted (the lattices' mixtures are)."""
    if m.size > 1 and not bool((m[1:] >= m[:-1]).all()):
        values, inverse = np.unique(m, return_inverse=True)
    else:
        new = np.ones(m.size, dtype=bool)
        new[1:] = m[1:] != m[:-1]
        values, inverse = m[new], np.cumsum(new) - 1
    return values, np.bincount(inverse, weights=w, minlength=values.size)


def _merge_components(
    w: np.ndarray, m: np.ndarray, max_components: int = _MAX_COMPONENTS
) -> tuple[np.ndarray, np.ndarray]:
    r"""Merge equal mus; if more than ``max_components`` remain, round each mu UP
    to a geometric grid (delta_mu increases with mu, so the profile only grows)."""
    values, w = _unique_sum(w, m)
    if values.size > max_components:
        positive = values[(values > 0) & np.isfinite(values)]  # inf (delta = 1) stays a component of its own
        lo, hi = float(positive.min()), float(positive.max())
        grid = np.geomspace(lo, hi, max_components - 1)
        grid[-1] = hi
        grid = np.concatenate(([0.0], grid))
        idx = np.searchsorted(grid, values, side="left")  # grid[idx] >= value
        idx = np.minimum(idx, grid.size - 1)
        rounded = grid[idx]
        rounded = np.maximum(rounded, values)  # guard against rounding in geomspace
        values, w = _unique_sum(w, rounded)
    return w, values


def _mixture_log_delta_fn(w: np.ndarray, m: np.ndarray):
    log_w = np.log(w)
    positive = m > 0

    def log_delta(eps: float) -> float:
        if not positive.any():
            return -math.inf
        terms = log_w[positive] + _log_delta(m[positive], np.full(int(positive.sum()), eps))
        top = float(terms.max())
        if top == -math.inf:
            return -math.inf
        return top + math.log(float(np.exp(terms - top).sum()))

    return log_delta


def mixture_delta(weights, mus, eps: float) -> float:
    r""":math:`\sum_j w_j\,\delta_{\mu_j}(\varepsilon)`: the privacy profile bound of a
    mixture of :math:`\mu_j`-GDP pairs with common weights (joint convexity of
    the hockey-stick divergence).

    Args:
      weights: w_j >= 0, summing to 1.
      mus: mu_j >= 0.
      eps: epsilon >= 0.

    Returns:
      delta (an upper bound; exact for the mixture of the profiles).
    """
    w, m = _validate_mixture(weights, mus)
    return _merged_delta(*_merge_components(w, m), eps)


def _merged_delta(w: np.ndarray, m: np.ndarray, eps: float) -> float:
    return float(math.exp(_mixture_log_delta_fn(w, m)(float(eps))))


def mixture_epsilon(weights, mus, delta: float) -> float:
    r"""Smallest :math:`\varepsilon \ge 0` with :math:`\sum_j w_j\delta_{\mu_j}(\varepsilon) \le \delta`.

    Root-find on the decreasing log mixture profile; the result is re-checked
    (its delta is <= the target). Mixtures with more than 4096 distinct mus
    are first merged onto a geometric grid, rounding each mu up (only larger).

    Args:
      weights: w_j >= 0, summing to 1.
      mus: mu_j >= 0.
      delta: target in [0, 1].

    Returns:
      epsilon (``inf`` when delta = 0 and some mu_j > 0 has positive weight).
    """
    w, m = _validate_mixture(weights, mus)
    return _merged_epsilon(*_merge_components(w, m), delta)


def _merged_epsilon(w: np.ndarray, m: np.ndarray, delta: float) -> float:
    if not np.any(m > 0):
        return 0.0
    if np.isinf(m).any():
        mass_inf = float(w[np.isinf(m)].sum())
        if delta < mass_inf:
            return math.inf
    mu_max = float(m[np.isfinite(m)].max()) if np.isfinite(m).any() else 1.0
    scale = mu_max * mu_max / 2.0 + mu_max * (math.sqrt(2.0 * max(-math.log(max(delta, 1e-300)), 1.0)) + 1.0)
    return _solve_epsilon(_mixture_log_delta_fn(w, m), float(delta), scale)


def mixture_rdp(weights, mus, orders: np.ndarray | float) -> np.ndarray:
    r""":math:`\frac{1}{\alpha-1}\log\sum_j w_j e^{(\alpha-1)\alpha\mu_j^2/2}` at each order.

    Valid because :math:`e^{(\alpha-1)D_\alpha(P\|Q)} = \int p^\alpha q^{1-\alpha}` is
    jointly convex for :math:`\alpha > 1` and each component pair, being
    :math:`\mu_j`-GDP, has :math:`D_\alpha \le \alpha\mu_j^2/2`.
    """
    w, m = _validate_mixture(weights, mus)
    orders = np.asarray(orders, dtype=float)
    a = np.atleast_1d(orders)
    if np.any(a <= 1.0):
        raise ValueError(f"orders must be > 1. Found {a[a <= 1.0][:3].tolist()}.")
    m2 = m**2
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow: that component, and the bound, are inf
        products = ((a - 1.0) * a / 2.0)[:, None] * m2[None, :]
    exps = np.where(m2[None, :] == 0.0, 0.0, products) + np.log(w)[None, :]  # mu = 0 adds e^0 at any order
    # the divergence is >= 0: a rounding below 0 (weights summing to 1 - 1e-16) is raised to 0
    out = np.maximum(special.logsumexp(exps, axis=1) / (a - 1.0), 0.0)
    return out.reshape(orders.shape) if orders.ndim else out[0]


@dataclasses.dataclass(frozen=True)
class GaussianMixtureProfile:
    r"""A privacy profile :math:`\delta(\varepsilon) = \sum_j w_j\,\delta_{\mu_j}(\varepsilon)`.

    One component (weight 1) is plain :math:`\mu`-GDP. This is what an f-DP
    ("gdp" kind) bound returns instead of an RDP curve.

    Attributes:
      weights: w_j >= 0 summing to 1.
      mus: mu_j >= 0.
    """

    weights: tuple[float, ...]
    mus: tuple[float, ...]

    def __post_init__(self) -> None:
        _validate_mixture(self.weights, self.mus)

    @classmethod
    def gaussian(cls, mu: float) -> GaussianMixtureProfile:
        """Plain mu-GDP."""
        return cls((1.0,), (float(mu),))

    @classmethod
    def mixture(cls, weights, mus) -> GaussianMixtureProfile:
        """A mixture; equal mus are merged (the profile is unchanged)."""
        values, merged = _unique_sum(*_validate_mixture(weights, mus))
        merged = merged / merged.sum()
        # built from the arrays just validated: the tuples are not validated again, and the arrays of
        # delta and epsilon are the ones _merged would rebuild from them (a mixture of 16000 components
        # spent 7 ms converting and validating)
        out = object.__new__(cls)
        object.__setattr__(out, "weights", tuple(merged.tolist()))
        object.__setattr__(out, "mus", tuple(values.tolist()))
        out.__dict__["_merged"] = _merge_components(merged, values)
        return out

    @property
    def max_mu(self) -> float:
        """The largest component: the profile is below that of max_mu-GDP."""
        return max(self.mus)

    @functools.cached_property
    def _merged(self) -> tuple[np.ndarray, np.ndarray]:
        """The (weights, mus) arrays of :func:`mixture_delta` and :func:`mixture_epsilon`, built once."""
        w, m = _validate_mixture(self.weights, self.mus)
        return _merge_components(w, m)

    def delta(self, eps: float) -> float:
        """delta(eps) of the profile (:func:`mixture_delta`)."""
        return _merged_delta(*self._merged, eps)

    def epsilon(self, delta: float) -> float:
        """Smallest eps with delta(eps) <= delta (re-checked; :func:`mixture_epsilon`)."""
        if len(self.mus) == 1:
            return gdp_epsilon(self.mus[0], delta)
        return _merged_epsilon(*self._merged, delta)

    def rdp(self, orders) -> np.ndarray:
        """Renyi DP implied at each order (nats)."""
        return mixture_rdp(self.weights, self.mus, orders)
