r"""Bounded domain, convex smooth losses, random batches: a proven T-independent bound.

Privacy amplification by iteration (Feldman, Mironov, Talwar & Thakurta 2018,
arXiv 1808.06651, Lemmas 20-21; with a bounded-diameter start as in Altschuler &
Talwar 2022, arXiv 2205.13710, Propositions 3.2 and 5.6) is applied for every
FIXED batch sequence, where the update maps are deterministic; the final laws
are mixtures over the batch sequences with the same weights for both datasets,
so the joint convexity of :math:`e^{(\alpha-1)D_\alpha}` (Ye & Shokri 2022,
arXiv 2203.05363, Lemma 4.1) averages the per-sequence bounds. Absorbing the
shift of each use of the differing example in the step that creates it makes
the average factorise over the independent Bernoulli(q) uses.

Symbols: :math:`\sigma_p = \eta z C / b` (parameter-space noise),
:math:`d = D/\sigma_p = D b / (\eta z C)`, :math:`\kappa_0 = 2\alpha/z^2`,
:math:`L(x) = \log(1 - q + q e^{(\alpha-1)x})`. Convex case, window of the
last R steps:

.. math::
    \varepsilon_R(\alpha) = \frac{\alpha d^2}{2R}
      + \frac{R}{\alpha-1} L\Big(\kappa_0 + \frac{2\alpha d}{zR}\Big).

Assumptions: per-example losses convex and M-smooth; every per-example gradient
norm <= C on the domain (clipping never active); projection onto a closed
convex set of diameter D after every step; step size :math:`\eta |B|/b \le 2/M`
for every batch (random batches: :math:`\eta \le 2/M`; Poisson:
:math:`\eta \le 2b/(nM)`); batches drawn independently of the data;
replace-one neighbours. The derivation is in docs/derivations/bounded-domain.md#bounded-domain-random.
"""

from __future__ import annotations

import math

import numpy as np

from lastiter_plugins.bounds._common import inverse_square, log_theta, square
from lastiter_plugins.bounds._glue import domain_inputs, fixed_size_strong_contraction
from lastiter_plugins.config import LossAssumptions, TrainingConfig

_SINGLETONS = 8  # the first terms of the strongly convex sum are evaluated exactly
_BLOCK_LOG_RATIO = 0.5  # later blocks: the variable part of x varies by at most e^(1/2)
_NEGLIGIBLE_LOG = 30.0  # beyond c^j < e^-30 only index-doubling blocks
_GRID = 32  # geometric grid of window lengths evaluated besides the convex minimiser
_GRID_CONTRACTING = 24  # window lengths evaluated for the strongly convex variant
# the convex minimiser's search: log R in [0, log T] to within log(T) 64^-7 = log(T) 2^-42 (T <= 1e30: R to a
# relative 2e-11); R is then rounded down and up to integers, each a valid window
_GRID_POINTS = 64
_REFINEMENTS = 7


def _log_mgf(x: np.ndarray, am1: np.ndarray, q: float) -> np.ndarray:
    r""":math:`L(x) = \log(1 - q + q e^{(\alpha-1)x})`, stable for x from 0 to inf and q in (0, 1]."""
    e = am1 * x
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        small = np.log1p(q * np.expm1(np.minimum(e, 30.0)))
        large = np.logaddexp(math.log1p(-q) if q < 1.0 else -np.inf, math.log(q) + e)
    return np.where(e < 30.0, small, large)


def _tail_weights(steps: int, windows: np.ndarray, q: float) -> tuple[np.ndarray, np.ndarray]:
    """log P(no use in the first T - R steps) and log P(some use there)."""
    prefix = steps - windows
    with np.errstate(divide="ignore", invalid="ignore"):
        log_none = np.where(prefix == 0, 0.0, prefix * (math.log1p(-q) if q < 1.0 else -np.inf))
        log_some = np.log(-np.expm1(log_none))
    return log_none, log_some


def _first_use_refinement(
    scaled: np.ndarray, windows: np.ndarray, steps: int, am1: np.ndarray, q: float, log_m0: np.ndarray
) -> np.ndarray:
    r"""Combine a window bound with the event that the differing example is unused before the window.

    ``scaled`` is :math:`(\alpha-1)\varepsilon_R`. Returns
    :math:`\log((1-q)^{T-R} m_0^R + (1-(1-q)^{T-R}) e^{(\alpha-1)\varepsilon_R}) / (\alpha-1)`.
    """
    log_none, log_some = _tail_weights(steps, windows, q)
    with np.errstate(invalid="ignore"):
        out = np.logaddexp(log_none + windows * log_m0, np.where(np.isneginf(log_some), -np.inf, log_some + scaled))
    return out / am1


def _convex_scaled(windows, am1, orders, d, z, q):
    r""":math:`(\alpha-1)\varepsilon_R` of the convex window bound."""
    with np.errstate(over="ignore", invalid="ignore"):
        det = am1 * orders * square(d) / (2.0 * windows)
        x = orders * (2.0 * inverse_square(z)) + 2.0 * orders * (d / z) / windows
        return det + windows * _log_mgf(x, am1, q)


def _convex_minimiser(orders, am1, d, z, q, steps):
    r"""Continuous minimiser in [1, T] of the convex window bound (it is convex in R:
    alpha d^2/(2R) plus the perspective R L(kappa_0 + beta/R) of the convex L), from the sign
    of the derivative in log R on a grid of _GRID_POINTS intervals, refined _REFINEMENTS times
    inside the interval where it turns non-negative (a bisection that halves _GRID_POINTS-fold)."""
    # (an overflow, or inf * 0 = NaN at absurd orders, only moves the candidate R: every R is valid)
    with np.errstate(over="ignore", invalid="ignore"):
        a_coef = am1 * orders * (square(d) / 2.0)  # (alpha-1) alpha d^2 / 2
        kappa0 = orders * (2.0 * inverse_square(z))
        beta = 2.0 * orders * (d / z)
    lo = np.zeros_like(orders)
    hi = np.full_like(orders, math.log(steps))
    log_q = math.log(q)
    inner = np.arange(1, _GRID_POINTS)[:, None] / _GRID_POINTS  # the interior points, as fractions
    columns = np.arange(orders.size)
    for _ in range(_REFINEMENTS):
        points = lo + (hi - lo) * inner  # (_GRID_POINTS - 1) x orders
        r = np.exp(points)
        x = kappa0 + beta / r
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            ell = _log_mgf(x, am1, q)
            slope = np.exp(log_q + am1 * x - ell)  # q e^{(a-1)x} / (1 - q + q e^{(a-1)x})
            derivative = -a_coef / r**2 + ell - am1 * beta * slope / r
        rising = ~(derivative < 0.0)  # NaN counts as rising: any R is valid
        first = np.where(rising.any(axis=0), rising.argmax(axis=0), _GRID_POINTS - 1)  # first rising point
        new_hi = np.where(first < _GRID_POINTS - 1, points[np.minimum(first, _GRID_POINTS - 2), columns], hi)
        lo = np.where(first > 0, points[np.maximum(first - 1, 0), columns], lo)
        hi = new_hi
    return np.exp(0.5 * (lo + hi))


def _block_edges(windows: np.ndarray, log_c: float) -> list[np.ndarray]:
    """Edges of the blocks of j in [0, R) for the trapezoid bound, for each window R: singletons first,
    then blocks over which c^j falls by e^-_BLOCK_LOG_RATIO, then index-doubling ones, then R. The
    edges below R do not depend on R: they are computed once."""
    k_max = int(_NEGLIGIBLE_LOG / _BLOCK_LOG_RATIO)
    ratio_edges = np.ceil(np.arange(1, k_max + 1) * _BLOCK_LOG_RATIO / -log_c)
    doubling = _SINGLETONS * 2.0 ** np.arange(0, 64)
    edges = np.unique(np.concatenate((np.arange(_SINGLETONS + 1, dtype=float), ratio_edges, doubling)))
    return [np.append(edges[: np.searchsorted(edges, r)], r) for r in windows.tolist()]


def _contracting_scaled(windows, am1, orders, d, z, q, contraction) -> np.ndarray:
    r""":math:`(\alpha-1)\varepsilon_R` of the strongly convex window bound, for each window R (rows)
    and order (columns); a single R gives one row, flattened.

    Deterministic schedule :math:`a'_j \propto c^{R+j}` (the minimiser of
    :math:`\sum a'^2`): deterministic part :math:`(\alpha/2) d^2 c^{2R}/S_R`, per-step
    arguments :math:`x_j = \kappa_0 + (2\alpha/z)\, y_0 c^j`, :math:`y_0 = d c^R / S_R`,
    :math:`S_R = \sum_{i<R} c^{2i}`, j = 0..R-1. :math:`\sum_j L(x_j)` is bounded
    above blockwise by the trapezoid of the convex increasing L: on a block of
    consecutive j the mean of :math:`c^j` is at most the mean of its end values.
    The blocks of every R are laid end to end and summed per R in one pass.
    """
    scalar = np.ndim(windows) == 0
    windows = np.atleast_1d(np.asarray(windows, dtype=float))
    log_c = math.log(contraction)
    edges = _block_edges(windows, log_c)
    first = np.concatenate([e[:-1] for e in edges])
    last = np.concatenate([e[1:] - 1.0 for e in edges])  # inclusive j ranges
    count = np.concatenate([np.diff(e) for e in edges])
    starts = np.cumsum([0] + [e.size - 1 for e in edges[:-1]])
    log_det = 2.0 * log_c + log_theta(contraction, windows)  # log(c^{2R} / S_R)
    log_s = np.log(-np.expm1(2.0 * windows * log_c)) - math.log(-math.expm1(2.0 * log_c))
    log_y0 = math.log(d) + windows * log_c - log_s  # y0 = d c^R / S_R, d > 0 finite
    block_y0 = np.repeat(log_y0, [e.size - 1 for e in edges])
    am1c = am1[:, None]
    with np.errstate(over="ignore", invalid="ignore"):  # inf: vacuous; NaN (inf * 0): a candidate dropped
        det = am1c * orders[:, None] * np.exp(2.0 * math.log(d) + log_det)[None, :] / 2.0
        # x_j = kappa_0 + w c^j, w = 2 alpha y0 / z, formed in log space (c^j may underflow where w overflows)
        log_w = np.log(2.0 * orders)[:, None] - math.log(z) + block_y0[None, :]
        kappa0 = orders[:, None] * (2.0 * inverse_square(z))
        l_first = _log_mgf(kappa0 + np.exp(log_w + first[None, :] * log_c), am1c, q)
        l_last = _log_mgf(kappa0 + np.exp(log_w + last[None, :] * log_c), am1c, q)
        total = np.add.reduceat(count[None, :] * 0.5 * (l_first + l_last), starts, axis=1)
        out = (det + total).T
    return out[0] if scalar else out


def _contracting(orders, am1, d, z, q, steps, contraction, log_m0):
    """Minimum of the refined strongly convex window bound over a grid of R (each R valid)."""
    log_c = math.log(max(contraction, 1e-300))  # a c-Lipschitz map is c'-Lipschitz for c' >= c
    contraction = math.exp(log_c)
    cap = min(float(steps), max(1.0, math.ceil(_NEGLIGIBLE_LOG / -log_c)))  # c^{2R} < e^-60 beyond
    grid = np.unique(np.round(np.geomspace(1.0, cap, _GRID_CONTRACTING)))
    scaled = _contracting_scaled(grid, am1, orders, d, z, q, contraction)
    values = _first_use_refinement(scaled, grid[:, None], steps, am1, q, log_m0)
    return np.fmin.reduce(values, axis=0)  # a NaN candidate (inf * 0 at absurd orders) is dropped: the others are valid


def random_batch_rdp(
    orders: np.ndarray,
    *,
    sampling_probability: float,
    noise_multiplier: float,
    steps: int,
    diameter: float,
    batch_size: int,
    learning_rate: float,
    clip_norm: float,
    contraction: float | None = None,
) -> np.ndarray:
    r"""RDP (nats) of the last iterate of projected noisy SGD with random batches, replace-one.

    For every R in {1..T} (the window of the last R steps; each R is a valid bound):

    .. math::
        e^{(\alpha-1)\varepsilon} \le (1-q)^{T-R} m_0^R
          + \big(1 - (1-q)^{T-R}\big) e^{(\alpha-1)\varepsilon_R(\alpha)},
        \qquad m_0 = 1 - q + q e^{(\alpha-1) 2\alpha/z^2},

    with :math:`\varepsilon_R` as in the module docstring (convex), or, with
    ``contraction`` c < 1 (lam-strongly convex losses, fixed batch size b),
    :math:`\varepsilon_R = \frac{\alpha}{2} d^2 \frac{c^{2R}}{S_R} + \frac{1}{\alpha-1}
    \sum_{j=0}^{R-1} L(\kappa_0 + \frac{2\alpha d}{z} \frac{c^{R+j}}{S_R})`,
    :math:`S_R = \sum_{i<R} c^{2i}`; the minimum of both variants is returned.
    The first term covers the batch sequences in which the differing example is
    not used before the window (then the two laws agree at its start). The
    minimum over R is searched (bisection on the convex window bound, plus a
    geometric grid); a search can only make the result larger than the true
    minimum. Every value is independent of T once T exceeds the best window.

    Reference: Feldman, Mironov, Talwar & Thakurta 2018, arXiv 1808.06651, Lemmas
    20 and 21; Altschuler & Talwar 2022, arXiv 2205.13710, Propositions 3.2 and
    5.6, Lemma 5.7 (applied per fixed batch sequence only); Ye & Shokri 2022,
    arXiv 2203.05363, Lemma 4.1 (joint convexity). Assumptions: see the module
    docstring; the caller checks them.

    Args:
      orders: Renyi orders (> 1).
      sampling_probability: q = b/n, the probability that the differing example
        is in a given batch (independently across steps).
      noise_multiplier: z (noise std on the gradient sum is z*C).
      steps: T >= 1.
      diameter: D > 0 of the projection set.
      batch_size: b (the divisor of the gradient sum).
      learning_rate: eta > 0.
      clip_norm: C > 0 (a bound on every per-example gradient norm on the domain).
      contraction: c = max(|1 - eta lam|, |1 - eta M|) in [0, 1) for the strongly
        convex variant (random batches of fixed size only), or None.

    Returns:
      RDP epsilon at each order: finite or inf, never NaN.
    """
    orders = np.array(orders, dtype=float).reshape(-1)
    q, z, steps = float(sampling_probability), float(noise_multiplier), int(steps)
    if q <= 0.0:
        return np.zeros_like(orders)
    with np.errstate(over="ignore"):
        kappa0 = orders * (2.0 * inverse_square(z))
    # kappa_0 = 2 alpha / z^2 overflows: m_0 and every window bound are inf
    out = np.full(orders.shape, np.inf)
    live = np.isfinite(kappa0)
    if not live.any():
        return out
    orders, kappa0 = orders[live], kappa0[live]
    am1 = orders - 1.0
    # d = D b / (eta z C) in Python floats: an overflow rounds to inf instead of raising
    d = float(diameter) * batch_size / learning_rate / z / clip_norm
    with np.errstate(over="ignore"):
        log_m0 = _log_mgf(kappa0, am1, q)
    # convex window bound: its minimiser, its integer neighbours, R = T and a geometric grid
    r_star = _convex_minimiser(orders, am1, d, z, q, steps) if math.isfinite(d) else np.full_like(orders, steps)
    grid = np.unique(np.round(np.geomspace(1.0, float(steps), _GRID)))
    windows = np.concatenate(
        (
            np.clip(np.floor(r_star), 1, steps)[None, :],
            np.clip(np.ceil(r_star), 1, steps)[None, :],
            np.broadcast_to(grid[:, None], (grid.size, orders.size)),
        )
    )
    scaled = _convex_scaled(windows, am1, orders, d, z, q)
    best = np.fmin.reduce(_first_use_refinement(scaled, windows, steps, am1, q, log_m0), axis=0)  # NaN: dropped
    if contraction is not None and contraction < 1.0 - 1e-12 and 0.0 < d < math.inf:
        best = np.fmin(best, _contracting(orders, am1, d, z, q, steps, float(contraction), log_m0))
    out[live] = np.where(np.isnan(best), np.inf, np.maximum(best, 0.0))
    return out


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def bounded_domain_random_batch(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return random_batch_rdp(
        orders, steps=cfg.steps, contraction=fixed_size_strong_contraction(cfg, a), **domain_inputs(cfg, a)
    )


def bounded_domain_poisson(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    # the convex form only: an empty Poisson batch does not contract
    return random_batch_rdp(orders, steps=cfg.steps, contraction=None, **domain_inputs(cfg, a))
