r"""Ye & Shokri, "Differentially Private Learning Needs Hidden State (Or Much
Faster Convergence)" (NeurIPS 2022, arXiv 2203.05363).

Paper symbols: per-step noise :math:`\mathcal N(0, 2\eta\sigma^2 I)`, so
:math:`\sigma^2 = \eta z^2 C^2/(2b^2)`; gradient-sum sensitivity
:math:`S_g = 2C` (replace-one), hence the per-step term
:math:`\eta S_g^2/(4\sigma^2 b^2) = 2/z^2`; strong convexity :math:`\lambda`,
smoothness :math:`\beta = M`; K epochs of l batches. The gradient update is
:math:`\rho = 1-\eta\lambda` contractive (Lemma D.3) for
:math:`\lambda`-strongly convex, M-smooth losses and :math:`\eta < 2/(\lambda+M)`.
That contraction is a property of the unclipped gradient step: the bounds
here are only valid when clipping is never active (enforced by the registry).

Short last batch (cyclic and shuffle-once bounds): with l = ceil(n/b) batches, the
last holding r < b examples and divided by b, that step is only
:math:`\rho' = 1-\eta\lambda r/b` contractive. ``last_batch_fraction`` = r/b
switches on the re-derived bounds (Lemma 3.2 with per-step Lipschitz constants,
worst placement of the short step, see :func:`cyclic_rdp`); r = b gives the
paper's formulas exactly.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from lastiter_plugins.bounds._common import batch_sizes, inverse, inverse_square, log_theta, theta
from lastiter_plugins.bounds._glue import given
from lastiter_plugins.config import LossAssumptions, TrainingConfig


def max_learning_rate(strong_convexity: float, smoothness: float) -> float:
    r"""Step sizes must be < 2/(lam+M) for the rho-contraction (arXiv 2203.05363, Lemma D.3);
    with lam = 0 (Theorem D.4) this is 2/M."""
    return 2.0 * inverse(strong_convexity + smoothness)


def full_batch_max_learning_rate(smoothness: float) -> float:
    r"""Full-batch gradient descent (arXiv 2203.05363, Theorem D.6) needs eta < 1/M."""
    return inverse(smoothness)


def contraction(learning_rate: float, strong_convexity: float) -> float:
    r"""rho = 1 - eta*lam, the contraction factor of one gradient step of lam-strongly
    convex, M-smooth losses with eta < 2/(lam+M) (arXiv 2203.05363, Lemma D.3)."""
    return 1.0 - learning_rate * strong_convexity


def _base_term(orders: np.ndarray, noise_multiplier: float) -> np.ndarray:
    r"""2 alpha / z^2: one use of the differing example (sensitivity 2C/b); ``inf`` where it overflows."""
    with np.errstate(over="ignore"):
        return orders * (2.0 * inverse_square(noise_multiplier))


def _log_base_term(orders: np.ndarray, noise_multiplier: float) -> np.ndarray:
    r"""log(2 alpha / z^2), finite for every z > 0 (products with it are formed in log space, so that a
    factor that underflows never meets one that overflows)."""
    return np.log(2.0 * orders) - 2.0 * math.log(noise_multiplier)


def _epoch_growth(rho: float, epochs: int, steps_per_epoch: int) -> float:
    r"""G(K) = (1 - rho^(2(K-1)(l-h))) / (1 - rho^(2(l-h))), h = floor(l/2) (arXiv 2203.05363, eq. 91)."""
    if epochs <= 1:
        return 0.0
    if rho == 0.0:
        return 1.0
    gap = steps_per_epoch - steps_per_epoch // 2
    return _growth_from_log_factor(2.0 * gap * math.log(rho), epochs)


def _growth_from_log_factor(log_factor: float, epochs: int) -> float:
    r""":math:`(1 - F^{K-1}) / (1 - F)` for the per-epoch factor :math:`F = e^{\text{log\_factor}} \le 1`."""
    if epochs <= 1:
        return 0.0
    if log_factor == -math.inf:
        return 1.0
    if log_factor == 0.0:  # F rounds to 1 (lam ~ 0): the limit of the geometric sum
        return float(epochs - 1)
    return math.expm1((epochs - 1) * log_factor) / math.expm1(log_factor)


def _check_fraction(last_batch_fraction: float) -> None:
    if not 0.0 < last_batch_fraction <= 1.0:
        raise ValueError(
            f"last_batch_fraction (size of the last batch / batch_size) must be in (0, 1]. Found {last_batch_fraction}."
        )


def _kappa_squared(contraction: float, last_batch_fraction: float) -> float:
    r""":math:`\kappa^2 = (\rho'/\rho)^2`, :math:`\rho' = 1 - (1-\rho) r/b = 1 - \eta\lambda r/b`."""
    if last_batch_fraction == 1.0 or contraction == 1.0:
        return 1.0
    short = 1.0 - (1.0 - contraction) * last_batch_fraction
    return (short / contraction) ** 2


def _log_theta_short(contraction: float, kappa2: float, s: np.ndarray | float) -> np.ndarray:
    r"""log of :math:`\tilde\theta(j) = \kappa^2\theta_\rho(j)/(1 + (\kappa^2-1)\theta_\rho(j))`:
    the fresh-start term with the short step placed right after the use (its worst place)."""
    log_t = log_theta(contraction, s)
    if kappa2 == 1.0:
        return log_t
    return math.log(kappa2) + log_t - np.log1p((kappa2 - 1.0) * np.exp(log_t))


def _log_epoch_factor(contraction: float, kappa2: float, steps_per_epoch: int) -> float:
    r"""log F, the per-epoch factor of the second half-epoch (w = l - h non-use steps).

    kappa = 1: :math:`F = \rho^{2w}` (Ye & Shokri 2022, arXiv 2203.05363, eq. 104). Otherwise
    :math:`F = 1/(1 + (\rho^{-2w}-1)/(\kappa^2(1-\rho^2)\bar V))` with
    :math:`\bar V = 1 + \rho'^2(1-\rho^{2l})/((1-\rho^2)(1-\rho'^2\rho^{2(l-1)}))`
    bounding the inverse log-Sobolev constants (worst placement of the short step).
    """
    w = steps_per_epoch - steps_per_epoch // 2
    if contraction == 0.0:
        return -math.inf
    log_rho = math.log(contraction)
    if kappa2 == 1.0 or log_rho == 0.0:
        return 2.0 * w * log_rho
    s = -log_rho
    log_short = log_rho + 0.5 * math.log(kappa2)  # log rho'
    one_minus_rho2 = -math.expm1(-2.0 * s)
    ratio = -math.expm1(-2.0 * steps_per_epoch * s) / -math.expm1(2.0 * log_short - 2.0 * (steps_per_epoch - 1) * s)
    scaled_vbar = one_minus_rho2 + math.exp(2.0 * log_short) * ratio  # (1 - rho^2) * Vbar
    y = 2.0 * w * s  # log rho^{-2w}
    log_expm1_y = y + math.log(-math.expm1(-y))
    log_x = log_expm1_y - math.log(kappa2) - math.log(scaled_vbar)
    return -float(np.logaddexp(0.0, log_x))


def _first_term(
    orders: np.ndarray, noise_multiplier: float, contraction: float, kappa2: float, steps_per_epoch: int, epochs: int
) -> np.ndarray:
    r""":math:`(2\alpha/z^2)\,\tilde\theta(h)\,\tilde G(K)`; kappa = 1: :math:`e_0(\alpha,h)G(K)` (eq. 91).

    Formed in log space: :math:`\tilde\theta(h)` may underflow where :math:`2\alpha/z^2` overflows.
    """
    h = steps_per_epoch // 2
    if kappa2 == 1.0:
        growth = _epoch_growth(contraction, epochs, steps_per_epoch)
    else:
        growth = _growth_from_log_factor(_log_epoch_factor(contraction, kappa2, steps_per_epoch), epochs)
    if growth == 0.0:  # K = 1: no earlier pass
        return np.zeros_like(orders)
    log_factor = float(_log_theta_short(contraction, kappa2, h)) + math.log(growth)
    with np.errstate(over="ignore"):  # an overflow is the vacuous bound inf
        return np.exp(_log_base_term(orders, noise_multiplier) + log_factor)


def cyclic_rdp(
    orders: np.ndarray,
    *,
    noise_multiplier: float,
    steps_per_epoch: int,
    epochs: int,
    contraction: float,
    last_batch_fraction: float = 1.0,
) -> np.ndarray:
    r"""ye-shokri-cyclic (Ye & Shokri 2022, arXiv 2203.05363, Theorem 3.3, eq. 91,
    worst batch position :math:`j_0 = l - 1`):

    .. math:: \varepsilon(\alpha) = \frac{2\alpha}{z^2}\big(\tilde\theta(h)\, \tilde G(K) + 1\big),
       \quad h = \lfloor l/2 \rfloor.

    Holds for every fixed partition into batches (cyclic, shuffle-once).
    ``epochs`` is K = ceil(T / l): the first term grows with K and the second is
    already the worst position, so a partial last epoch is covered.

    Equal batches (``last_batch_fraction = 1``): :math:`\tilde\theta = \theta_\rho`,
    :math:`\tilde G(K) = G(K) = (1-\rho^{2(K-1)(l-h)})/(1-\rho^{2(l-h)})`, the paper's
    formula. Short last batch of r examples divided by b (``last_batch_fraction``
    = r/b < 1): that step contracts only by :math:`\rho' = 1-\eta\lambda r/b`, and
    the proof (App. D.5) is redone with per-step Lipschitz constants, placing the
    short step where it hurts most: with :math:`\kappa = \rho'/\rho`,
    :math:`\tilde\theta(j) = \kappa^2\theta_\rho(j)/(1+(\kappa^2-1)\theta_\rho(j))`,
    :math:`\tilde G(K) = (1-F^{K-1})/(1-F)`,
    :math:`F = 1/(1 + (\rho^{-2(l-h)}-1)/(\kappa^2(1-\rho^2)\bar V))`,
    :math:`\bar V = 1 + \rho'^2(1-\rho^{2l})/((1-\rho^2)(1-\rho'^2\rho^{2(l-1)}))`.
    The sensitivity is unchanged (the short batch is also divided by b).

    Args:
      orders: Renyi orders > 1.
      noise_multiplier: z.
      steps_per_epoch: l = ceil(n/b) >= 2.
      epochs: K = ceil(T/l) >= 1.
      contraction: :math:`\rho = 1-\eta\lambda` in (0, 1].
      last_batch_fraction: r/b in (0, 1], r = n - (l-1) b.

    Returns:
      RDP (nats) at each order, replace-one neighbours.
    """
    _check_fraction(last_batch_fraction)
    orders = np.asarray(orders, dtype=float)
    base = _base_term(orders, noise_multiplier)
    kappa2 = _kappa_squared(contraction, last_batch_fraction)
    return _first_term(orders, noise_multiplier, contraction, kappa2, steps_per_epoch, epochs) + base


_BLOCK_GROWTH = 1.0 + 1.0 / 64.0
_CHECK_EVERY = 64  # exact steps of the random-batch recursion between two checks of its stopping rule
_MAX_JUMPS = 4096  # jumps of the random-batch recursion after its exact steps
_LOG_NORMAL = math.log(np.finfo(float).tiny)  # e^x is subnormal (imprecise) or 0 below


def _log_expm1(x: np.ndarray) -> np.ndarray:
    """log(e^x - 1) = x + log(1 - e^-x) for x >= 0 (-inf at 0), without overflow."""
    with np.errstate(divide="ignore"):
        return x + np.log(-np.expm1(-x))


def _log_expm1_product(scale: np.ndarray, log_th: np.ndarray) -> np.ndarray:
    """log(expm1(c * t)) for every c in ``scale`` (rows; finite, > 0) and t = exp(log_th) (columns, <= 1).
    Where t is a normal double the product is formed directly; where it underflows, in log space (so
    that a large c times a tiny t is not lost)."""
    th = np.exp(log_th)
    product = scale[:, None] * th[None, :]
    tiny = log_th < _LOG_NORMAL
    if tiny.any():
        with np.errstate(divide="ignore"):
            product[:, tiny] = np.exp(np.log(scale)[:, None] + log_th[None, tiny])
    return _log_expm1(product)


def _log_position_excess(
    scale: np.ndarray, contraction: float, kappa2: float, steps_per_epoch: int, exact_positions: int
) -> np.ndarray:
    r"""Upper bound on :math:`\log\sum_{d=1}^{l} \mathrm{expm1}(c\,\tilde\theta(d))` for each c in ``scale``
    (finite, >= 0; the sum of :math:`E_d - 1`; kept apart from the l ones to avoid cancellation at small
    orders). The products :math:`c\,\tilde\theta(d)` are formed in log space.

    Exact for d <= ``exact_positions``; beyond, blocks [d0, d1] growing by a factor
    1 + 1/64, each bounded by
    :math:`\frac{\mathrm{expm1}(c\tilde\theta(d_0))}{\tilde\theta(d_0)}
    \frac{\kappa^2}{1+(\kappa^2-1)t_1}(d_1-d_0+1)\frac{t_0+t_1}{2}`, :math:`t_i = \theta_\rho(d_i)`:
    expm1 is convex and 0 at 0, :math:`\tilde\theta` is non-increasing in d, and
    :math:`\theta_\rho(x)` is convex in x so it lies below its chord. Memory
    O(len(scale) * exact_positions) and time O(log l), for any l.
    """
    scale = np.asarray(scale, dtype=float)
    exact_end = min(steps_per_epoch, exact_positions)
    log_th = _log_theta_short(contraction, kappa2, np.arange(1, exact_end + 1))
    out = np.empty_like(scale)
    chunk = max(1, 4_000_000 // exact_end)
    for start in range(0, scale.size, chunk):
        sl = slice(start, start + chunk)
        out[sl] = special.logsumexp(_log_expm1_product(scale[sl], log_th), axis=1)
    if steps_per_epoch <= exact_end:
        return out
    starts = [exact_end + 1]
    while True:
        nxt = max(starts[-1] + 1, math.floor(starts[-1] * _BLOCK_GROWTH))
        if nxt > steps_per_epoch:
            break
        starts.append(nxt)
    d0 = np.array(starts, dtype=float)
    d1 = np.append(d0[1:] - 1.0, float(steps_per_epoch))
    t0 = theta(contraction, d0)
    t1 = theta(contraction, d1)
    log_th0 = _log_theta_short(contraction, kappa2, d0)
    with np.errstate(divide="ignore"):
        log_rest = (
            math.log(kappa2) - np.log1p((kappa2 - 1.0) * t1) + np.log(d1 - d0 + 1.0) + np.log(0.5 * (t0 + t1)) - log_th0
        )
    ok = np.isfinite(log_th0) & np.isfinite(log_rest)  # theta underflowed to 0: the block adds nothing
    if not ok.any():
        return out
    log_th0, log_rest = log_th0[ok], log_rest[ok]
    chunk = max(1, 4_000_000 // log_th0.size)
    for start in range(0, scale.size, chunk):
        sl = slice(start, start + chunk)
        terms = _log_expm1_product(scale[sl], log_th0) + log_rest[None, :]
        out[sl] = np.logaddexp(out[sl], special.logsumexp(terms, axis=1))
    return out


def shuffle_rdp(
    orders: np.ndarray,
    *,
    noise_multiplier: float,
    steps_per_epoch: int,
    epochs: int,
    contraction: float,
    last_batch_fraction: float = 1.0,
    exact_positions: int = 512,
) -> np.ndarray:
    r"""ye-shokri-shuffle (Ye & Shokri 2022, arXiv 2203.05363, Theorem 4.2, shuffle
    once and partition, eq. 135):

    .. math:: \varepsilon(\alpha) = \frac{2\alpha}{z^2}\tilde\theta(h)\tilde G(K) + \frac{1}{\alpha-1}
       \log\Big(\frac{b}{n}\sum_{d=1}^{l} E_d - \frac{b-r}{n} E_l\Big),
       \quad E_d = e^{(\alpha-1)\frac{2\alpha}{z^2}\tilde\theta(d)},

    with :math:`\tilde\theta`, :math:`\tilde G` as in :func:`cyclic_rdp`. The
    differing example lands in a batch with probability |B|/n (b/n for full
    batches, r/n for the short one); E_d is non-increasing in d, so the weight
    r/n is put on d = l, its worst place. For r = b this is eq. 135 (weights 1/l).

    The sum over positions is exact up to d = ``exact_positions`` and bounded
    from above beyond (see :func:`_log_position_excess`): bounded memory and
    O(log l) time for any l, exact for l <= ``exact_positions``.

    Args:
      orders: Renyi orders > 1.
      noise_multiplier: z.
      steps_per_epoch: l = ceil(n/b) >= 2.
      epochs: K = ceil(T/l) >= 1.
      contraction: :math:`\rho = 1-\eta\lambda` in (0, 1].
      last_batch_fraction: r/b in (0, 1], r = n - (l-1) b.
      exact_positions: positions summed term by term.

    Returns:
      RDP (nats) at each order, replace-one neighbours.
    """
    _check_fraction(last_batch_fraction)
    orders = np.asarray(orders, dtype=float).reshape(-1)
    kappa2 = _kappa_squared(contraction, last_batch_fraction)
    first = _first_term(orders, noise_multiplier, contraction, kappa2, steps_per_epoch, epochs)
    with np.errstate(over="ignore"):
        scale = (orders - 1.0) * _base_term(orders, noise_multiplier)  # c = (alpha-1) 2 alpha/z^2
    # c overflows: E_1 = e^c is inf and carries weight b/n > 0, so the bound is inf; c = 0: every E_d is 1
    out = np.where(np.isinf(scale), np.inf, first)
    live = np.isfinite(scale) & (scale > 0.0)
    if not live.any():
        return out
    orders, scale = orders[live], scale[live]
    # (b/n) sum_d E_d - ((b-r)/n) E_l = 1 + (X - (1-f) expm1(c theta~(l))) / (l-1+f), X = sum_d expm1(c theta~(d))
    log_x = _log_position_excess(scale, contraction, kappa2, steps_per_epoch, exact_positions)
    f = last_batch_fraction
    if f < 1.0:
        log_th_last = _log_theta_short(contraction, kappa2, np.array([float(steps_per_epoch)]))
        log_last = _log_expm1_product(scale, log_th_last)[:, 0]
        with np.errstate(divide="ignore"):
            log_x = log_x + np.log1p(-(1.0 - f) * np.exp(log_last - log_x))
    log_mix = np.logaddexp(0.0, log_x - math.log(steps_per_epoch - 1.0 + f))
    out[live] = first[live] + log_mix / (orders - 1.0)
    return out


def random_batch_rdp(
    orders: np.ndarray,
    *,
    noise_multiplier: float,
    sampling_probability: float,
    steps: int,
    contraction: float,
    tolerance: float = 1e-10,
    max_iterations: int = 100_000,
    exact_steps: int = 32_768,
    lower_end: bool = False,
) -> np.ndarray:
    r"""ye-shokri-random (Ye & Shokri 2022, arXiv 2203.05363, Theorem 4.3, eq. 149): uniformly random batch
    of size b at every step, q = b/n,

    .. math:: S_0 = 1,\quad S_{t+1} = q e^{c} S_t + (1-q) S_t^{\rho^2},
       \quad c = (\alpha-1)\frac{2\alpha}{z^2},\quad
       \varepsilon(\alpha) = \frac{\log S_T}{\alpha - 1}.

    (The paper's step "E^{j+1} <= (E^j)^{rho^2} at the same alpha", eq. 157,
    does not follow from Lemma 3.2 alone, which lowers the order; it does hold,
    because for each fixed batch sequence the bound is alpha * u with u free of
    alpha, and Lemma 4.1 with Jensen on x^(rho^2) finishes it.)

    Run in log space, :math:`x_t = \log S_t`, :math:`x_{t+1} = f(x_t) = x_t + d(x_t)`,
    :math:`d(x) = \log(q e^c + (1-q) e^{(\rho^2-1)x})`. f is increasing, d is
    non-increasing, :math:`x_0 = 0` and :math:`d(0) \ge 0`, so :math:`x_t` is non-decreasing
    and its increments non-increasing. Without iterating T times (T can be 1e12), with
    sound bounds only:

    * fixed point: if :math:`q e^c < 1` and :math:`\rho < 1`,
      :math:`x^* = (\log(1-q) - \log(1-q e^c))/(1-\rho^2)` solves :math:`f(x^*) = x^*`,
      and :math:`x_t \le x^*` for every t (induction: f is increasing and :math:`x_0 \le x^*`);
    * jumps: :math:`x_{t+k} \le x_t + k\,d(x_t) = g_k(x_t)`, and :math:`g_k` is
      non-decreasing for :math:`k \le 1/(1-\rho^2)` (:math:`|d'| \le 1-\rho^2`), so an upper
      value :math:`u_t \ge x_t` propagates, :math:`u_{t+k} = g_k(u_t)`; a lower value
      propagates as :math:`l_{t+k} \le y^*`, :math:`y^* - k\,d(y^*) = l_t` (the increments are
      non-increasing, so :math:`x_{t+k} - k\,d(x_{t+k}) \ge x_t`), by one Newton step, which
      stays below :math:`y^*` since :math:`y - k\,d(y)` is increasing and concave. The first
      ``exact_steps`` steps are exact (u = l = x), later jumps span at most t/64 steps;
    * extrapolation: :math:`x_T \le u_t + (T-t)\,d(l_t)` and
      :math:`x_T \ge l_t + (T-t)\,d(U)` for any upper value U of :math:`x_T`.

    The iteration stops for an order once the interval for :math:`x_T` is narrower
    than ``tolerance`` relative to it (or :math:`x^*` is that close to the lower end), or
    after ``max_iterations`` steps or 4096 jumps; it returns the upper end, capped by
    :math:`x^*`: never below the exact recursion. O(exact_steps + 4096) time for any T.

    ``lower_end=True`` returns the lower end instead: never above the exact recursion, hence
    below the curve this function reports at any tolerance. Only for lower estimates
    (docs/derivations/lower-estimates.md#cheaper-curve), with a loose ``tolerance`` (fewer steps).
    """
    orders = np.asarray(orders, dtype=float).reshape(-1)
    q = sampling_probability
    with np.errstate(over="ignore"):  # an overflow is the vacuous bound inf
        c = (orders - 1.0) * _base_term(orders, noise_multiplier)
        if q >= 1.0:
            return steps * _base_term(orders, noise_multiplier)
    # c = inf: S_1 = q e^c + ... is inf already (q > 0), and so is the bound
    out = np.full(orders.shape, np.inf)
    live = np.isfinite(c)
    if not live.any():
        return out
    log_x = _random_batch_log_moment(
        math.log(q) + c[live], math.log1p(-q), contraction**2, steps, tolerance, max_iterations, exact_steps, lower_end
    )
    out[live] = log_x / (orders[live] - 1.0)
    return out


def _random_batch_log_moment(
    log_in: np.ndarray,
    log_out: float,
    rho2: float,
    steps: int,
    tolerance: float,
    max_iterations: int,
    exact_steps: int,
    lower_end: bool,
) -> np.ndarray:
    """Upper bound on x_T of :func:`random_batch_rdp`'s recursion, per entry of ``log_in`` (log(q e^c));
    a lower bound with ``lower_end``."""

    def slope(x: np.ndarray, log_in_: np.ndarray) -> np.ndarray:
        return np.logaddexp(log_in_, log_out + (rho2 - 1.0) * x)  # d(x), for x >= 0

    def _newton_lower(low: np.ndarray, start: np.ndarray, log_in_: np.ndarray, k: int) -> np.ndarray:
        # x_{t+k} >= y* where y* - k d(y*) = low (F(y) = y - k d(y) - low is increasing and concave); one
        # Newton step from any start lands at or below y* (the tangent of a concave F lies above it)
        d = slope(start, log_in_)
        weight = np.exp(log_out + (rho2 - 1.0) * start - d)  # -d'(y) / (1 - rho^2)
        step = (start - k * d - low) / (1.0 + k * (1.0 - rho2) * weight)
        return np.maximum(low, np.where(np.isfinite(step), start - step, low))

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        fixed = np.where((log_in < 0.0) & (rho2 < 1.0), (log_out - np.log1p(-np.exp(log_in))) / (1.0 - rho2), np.inf)
    longest_jump = math.inf if rho2 >= 1.0 else max(1.0, math.floor(1.0 / (1.0 - rho2)))
    result = np.empty_like(log_in)
    index = np.arange(log_in.size)  # entries still iterated
    upper = np.zeros_like(log_in)
    lower = np.zeros_like(log_in)
    t, iterations, jumps = 0, 0, 0
    while index.size:
        li = log_in[index]
        with np.errstate(over="ignore", invalid="ignore"):
            if t < exact_steps:  # exact steps, the stopping rule checked every _CHECK_EVERY of them
                count = min(exact_steps - t, steps - t, _CHECK_EVERY, max_iterations - iterations)
                for _ in range(count):
                    upper = upper + slope(upper, li)
                lower = upper.copy()
            else:
                count = int(min(steps - t, max(1, t // 64), longest_jump))
                new_upper = upper + count * slope(upper, li)
                lower = _newton_lower(lower, new_upper, li, count)
                upper = new_upper
                jumps += 1
            t += count
            iterations += count if t <= exact_steps else 1
            remaining = steps - t
            high = np.minimum(upper + remaining * np.maximum(slope(lower, li), 0.0), fixed[index])
            low = lower + remaining * np.maximum(slope(high, li), 0.0)  # x_t <= x*: every increment is >= 0
        done = (
            (remaining == 0)
            | (high - low <= tolerance * np.maximum(low, 1e-300))
            | (np.isfinite(fixed[index]) & (fixed[index] - low <= tolerance * fixed[index]))
            | (iterations >= max_iterations)
            | (jumps >= _MAX_JUMPS)
        )
        if done.any():
            # the lower end, capped by x* and lowered by a relative 1e-9: the rounding of the recursion (4e-11
            # seen) must not lift it above an upper end computed along another path
            end = np.minimum(low, fixed[index]) * (1.0 - 1e-9) if lower_end else high
            result[index[done]] = np.maximum(end[done], 0.0)  # x_T >= x_0 = 0: a rounding below 0 is raised
            keep = ~done
            index, upper, lower = index[keep], upper[keep], lower[keep]
    return result


def convex_rdp(orders: np.ndarray, *, noise_multiplier: float, steps_per_epoch: int, epochs: int) -> np.ndarray:
    r"""ye-shokri-convex (Ye & Shokri 2022, arXiv 2203.05363, Theorem D.4, eq. 80 with j0 = l - 1): convex,
    M-smooth, fixed batches, eta < 2/M:
    :math:`\frac{2\alpha}{z^2}\left(\frac{K-1}{l} + 1\right)`."""
    orders = np.asarray(orders, dtype=float)
    with np.errstate(over="ignore"):
        return _base_term(orders, noise_multiplier) * ((epochs - 1) / steps_per_epoch + 1.0)


def full_batch_rdp(
    orders: np.ndarray, *, noise_multiplier: float, epochs: int, learning_rate: float, strong_convexity: float
) -> np.ndarray:
    r"""ye-shokri-full-batch (Ye & Shokri 2022, arXiv 2203.05363, Theorem D.6, eq. 112): b = n, eta < 1/M:
    :math:`\frac{4\alpha}{z^2}\sum_{k=1}^{K}(1-\eta\lambda/2)^k`."""
    orders = np.asarray(orders, dtype=float)
    a = 1.0 - learning_rate * strong_convexity / 2.0  # in (1/2, 1] under the theorem's conditions
    total = float(epochs) if a == 1.0 else a * -math.expm1(epochs * math.log(a)) / (1.0 - a)
    with np.errstate(over="ignore"):
        return orders * (4.0 * inverse_square(noise_multiplier) * total)


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def _rho(cfg: TrainingConfig, a: LossAssumptions) -> float:
    return contraction(given(cfg.learning_rate, "learning_rate"), a.strong_convexity)


def _last_batch_fraction(cfg: TrainingConfig) -> float:
    """r/b, r the size of the last batch of an epoch (1 when b divides n)."""
    return batch_sizes(cfg.dataset_size, cfg.batch_size)[1] / cfg.batch_size


def ye_shokri_step_limit(cfg: TrainingConfig, a: LossAssumptions) -> float:
    """2/(lam+M) (strict), the limit of Lemma D.3's rho-contraction."""
    return max_learning_rate(a.strong_convexity, given(a.smoothness, "smoothness"))


def ye_shokri_convex_step_limit(cfg: TrainingConfig, a: LossAssumptions) -> float:
    """2/M (strict), Theorem D.4's limit (lam = 0)."""
    return max_learning_rate(0.0, given(a.smoothness, "smoothness"))


def ye_shokri_full_batch_step_limit(cfg: TrainingConfig, a: LossAssumptions) -> float:
    """1/M (strict), Theorem D.6's limit."""
    return full_batch_max_learning_rate(given(a.smoothness, "smoothness"))


def ye_shokri_cyclic(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return cyclic_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        steps_per_epoch=cfg.steps_per_epoch,
        epochs=cfg.epochs_started,
        contraction=_rho(cfg, a),
        last_batch_fraction=_last_batch_fraction(cfg),
    )


def ye_shokri_shuffle(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return shuffle_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        steps_per_epoch=cfg.steps_per_epoch,
        epochs=cfg.epochs_started,
        contraction=_rho(cfg, a),
        last_batch_fraction=_last_batch_fraction(cfg),
    )


def ye_shokri_random(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return random_batch_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        sampling_probability=cfg.sampling_probability,
        steps=cfg.steps,
        contraction=_rho(cfg, a),
    )


def ye_shokri_random_lower(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    """The recursion's lower end at a loose tolerance: below :func:`ye_shokri_random` at every order
    (docs/derivations/lower-estimates.md#cheaper-curve)."""
    return random_batch_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        sampling_probability=cfg.sampling_probability,
        steps=cfg.steps,
        contraction=_rho(cfg, a),
        tolerance=1e-2,
        lower_end=True,
    )


def ye_shokri_convex(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return convex_rdp(
        orders, noise_multiplier=cfg.noise_multiplier, steps_per_epoch=cfg.steps_per_epoch, epochs=cfg.epochs_started
    )


def ye_shokri_full_batch(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return full_batch_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        epochs=cfg.steps,  # b = n: every step is an epoch
        learning_rate=given(cfg.learning_rate, "learning_rate"),
        strong_convexity=a.strong_convexity,
    )
