r"""Ye & Shokri, "Differentially Private Learning Needs Hidden State (Or Much
Faster Convergence)" (seed 004).

Paper symbols: per-step noise :math:`\mathcal N(0, 2\eta\sigma^2 I)`, so
:math:`\sigma^2 = \eta z^2 C^2/(2b^2)`; gradient-sum sensitivity
:math:`S_g = 2C` (replace-one), hence the per-step term
:math:`\eta S_g^2/(4\sigma^2 b^2) = 2/z^2`; strong convexity :math:`\lambda`,
smoothness :math:`\beta = M`; K epochs of l batches. The gradient update is
:math:`\rho = 1-\eta\lambda` contractive (Lemma D.3) for
:math:`\lambda`-strongly convex, M-smooth losses and :math:`\eta < 2/(\lambda+M)`.
That contraction is a property of the unclipped gradient step: the bounds
here are only valid when clipping is never active (enforced by the registry).
"""

from __future__ import annotations

import math

import numpy as np

from lastiter_plugins.bounds._common import log_theta, theta


def _base_term(orders: np.ndarray, noise_multiplier: float) -> np.ndarray:
    r"""2 alpha / z^2: one use of the differing example (sensitivity 2C/b)."""
    return 2.0 * orders / noise_multiplier**2


def _epoch_growth(rho: float, epochs: int, steps_per_epoch: int) -> float:
    r"""G(K) = (1 - rho^(2(K-1)(l-h))) / (1 - rho^(2(l-h))), h = floor(l/2) (seed 004, eq. 91)."""
    if epochs <= 1:
        return 0.0
    if rho == 0.0:
        return 1.0
    gap = steps_per_epoch - steps_per_epoch // 2
    log_r = 2.0 * gap * math.log(rho)
    if log_r == 0.0:  # rho rounds to 1 (lam ~ 0): the limit of the geometric sum
        return float(epochs - 1)
    return math.expm1((epochs - 1) * log_r) / math.expm1(log_r)


def cyclic_rdp(
    orders: np.ndarray, *, noise_multiplier: float, steps_per_epoch: int, epochs: int, contraction: float
) -> np.ndarray:
    r"""ye-shokri-cyclic (seed 004, Theorem 3.3, worst batch position j0 = l - 1):

    .. math:: \varepsilon(\alpha) = e_0(\alpha, h)\, G(K) + 2\alpha/z^2,
       \quad e_0(\alpha, j) = \frac{2\alpha}{z^2}\theta_\rho(j),\ h = \lfloor l/2 \rfloor.

    Holds for every fixed partition into batches (cyclic, shuffle-once).
    ``epochs`` is K = ceil(T / l): the first term grows with K and the second is
    already the worst position, so a partial last epoch is covered.
    """
    orders = np.asarray(orders, dtype=float)
    base = _base_term(orders, noise_multiplier)
    h = steps_per_epoch // 2
    return base * float(theta(contraction, h)) * _epoch_growth(contraction, epochs, steps_per_epoch) + base


def shuffle_rdp(
    orders: np.ndarray, *, noise_multiplier: float, steps_per_epoch: int, epochs: int, contraction: float
) -> np.ndarray:
    r"""ye-shokri-shuffle (seed 004, Theorem 4.2, shuffle once and partition, eq. 135):

    .. math:: \varepsilon(\alpha) = e_0(\alpha, h) G(K) + \frac{1}{\alpha-1}
       \log\Big(\frac1l \sum_{j=1}^{l} e^{(\alpha-1) e_0(\alpha, j)}\Big).

    The log-mean-exp over the batch position of the differing example is
    evaluated in log space (it is dominated by j = 1 at large orders).
    """
    orders = np.asarray(orders, dtype=float)
    base = _base_term(orders, noise_multiplier)
    h = steps_per_epoch // 2
    first = base * float(theta(contraction, h)) * _epoch_growth(contraction, epochs, steps_per_epoch)
    thetas = np.exp(log_theta(contraction, np.arange(1, steps_per_epoch + 1)))
    mix = np.empty_like(orders)
    chunk = max(1, 4_000_000 // steps_per_epoch)
    for start in range(0, orders.size, chunk):
        sl = slice(start, start + chunk)
        exponents = ((orders[sl] - 1.0) * base[sl])[:, None] * thetas[None, :]
        peak = exponents.max(axis=1)
        mix[sl] = peak + np.log(np.exp(exponents - peak[:, None]).sum(axis=1)) - math.log(steps_per_epoch)
    return first + mix / (orders - 1.0)


def random_batch_rdp(
    orders: np.ndarray,
    *,
    noise_multiplier: float,
    sampling_probability: float,
    steps: int,
    contraction: float,
    tolerance: float = 1e-10,
    max_iterations: int = 100_000,
) -> np.ndarray:
    r"""ye-shokri-random (seed 004, Theorem 4.3, eq. 149): uniformly random batch
    of size b at every step, q = b/n,

    .. math:: S_0 = 1,\quad S_{t+1} = q e^{c} S_t + (1-q) S_t^{\rho^2},
       \quad c = (\alpha-1)\frac{2\alpha}{z^2},\quad
       \varepsilon(\alpha) = \frac{\log S_T}{\alpha - 1}.

    (The paper's step "E^{j+1} <= (E^j)^{rho^2} at the same alpha", eq. 157,
    does not follow from Lemma 3.2 alone, which lowers the order; it does hold,
    because for each fixed batch sequence the bound is alpha * u with u free of
    alpha, and Lemma 4.1 with Jensen on x^(rho^2) finishes it.)

    Run in log space, x_t = log S_t. Sound shortcut for large T (BOUNDS.md
    3.7): x_t is non-decreasing and the increment d_t = x_{t+1} - x_t =
    log(q e^c + (1-q) e^{(rho^2 - 1) x_t}) is non-increasing in t, so
    x_T <= x_{t+1} + (T - t - 1) d_t for every t. The recursion is iterated until
    the increments have settled (their remaining decrease, extrapolated over the
    remaining steps, is below ``tolerance`` relative to x) or ``max_iterations``
    steps, then extrapolated linearly: the result is never below the exact
    recursion, only (negligibly) above it.
    """
    orders = np.asarray(orders, dtype=float)
    q = sampling_probability
    c = (orders - 1.0) * _base_term(orders, noise_multiplier)
    if q >= 1.0:
        return steps * c / (orders - 1.0)
    rho2 = contraction**2
    log_in = math.log(q) + c
    log_out = math.log1p(-q)
    x = np.zeros_like(orders)
    prev_inc = np.full_like(orders, np.inf)
    t = 0
    while t < steps:
        x_next = np.logaddexp(log_in + x, log_out + rho2 * x)
        inc = x_next - x
        x = x_next
        t += 1
        remaining = steps - t
        if remaining == 0:
            break
        settled = remaining * (prev_inc - inc) <= tolerance * np.maximum(x, 1e-300)
        if settled.all() or t >= max_iterations:
            x = x + remaining * inc
            break
        prev_inc = inc
    return x / (orders - 1.0)


def convex_rdp(orders: np.ndarray, *, noise_multiplier: float, steps_per_epoch: int, epochs: int) -> np.ndarray:
    r"""ye-shokri-convex (seed 004, Theorem D.4, eq. 80 with j0 = l - 1): convex,
    M-smooth, fixed batches, eta < 2/M:
    :math:`\frac{2\alpha}{z^2}\left(\frac{K-1}{l} + 1\right)`."""
    orders = np.asarray(orders, dtype=float)
    return _base_term(orders, noise_multiplier) * ((epochs - 1) / steps_per_epoch + 1.0)


def full_batch_rdp(
    orders: np.ndarray, *, noise_multiplier: float, epochs: int, learning_rate: float, strong_convexity: float
) -> np.ndarray:
    r"""ye-shokri-full-batch (seed 004, Theorem D.6, eq. 112): b = n, eta < 1/M:
    :math:`\frac{4\alpha}{z^2}\sum_{k=1}^{K}(1-\eta\lambda/2)^k`."""
    orders = np.asarray(orders, dtype=float)
    a = 1.0 - learning_rate * strong_convexity / 2.0  # in (1/2, 1] under the theorem's conditions
    total = float(epochs) if a == 1.0 else a * -math.expm1(epochs * math.log(a)) / (1.0 - a)
    return 4.0 * orders / noise_multiplier**2 * total
