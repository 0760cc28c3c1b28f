r"""Numerically stable helpers shared by the bound modules."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np


def log_theta(lipschitz: float, s: np.ndarray | float) -> np.ndarray:
    r"""Natural log of :math:`\theta_L(s) = L^{2(s-1)} / \sum_{j=0}^{s-1} L^{2j}`.

    docs/bounds.md (Kong & Ribero, arXiv 2407.05237, eq. 15). ``theta_L(0) = 0``
    (log is ``-inf``); ``theta_1(s) = 1/s``. Written with ``expm1`` so that it
    neither overflows nor loses precision for ``s`` up to 1e7 and ``L`` up to 10
    or more, and is exact in the limit ``L -> 1``.

    Args:
      lipschitz: L >= 0.
      s: integer(s) >= 0.

    Returns:
      log(theta_L(s)) with the shape of ``s``.
    """
    s = np.asarray(s, dtype=float)
    out = np.full(s.shape, -np.inf)
    pos = s >= 1
    if lipschitz == 0.0:
        # 0^0 = 1 in the sum, so theta_0(1) = 1 and theta_0(s) = 0 for s > 1.
        out[s == 1] = 0.0
        return out
    u = 2.0 * np.log(lipschitz)  # log(L^2)
    sp = s[pos]
    if u == 0.0:
        out[pos] = -np.log(sp)
    elif u > 0.0:
        # (1 - L^-2) / (1 - L^-2s)
        out[pos] = np.log(-np.expm1(-u)) - np.log(-np.expm1(-sp * u))
    else:
        # L^(2(s-1)) (1 - L^2) / (1 - L^(2s))
        out[pos] = (sp - 1.0) * u + np.log(-np.expm1(u)) - np.log(-np.expm1(sp * u))
    return out


def theta(lipschitz: float, s: np.ndarray | float) -> np.ndarray:
    r""":math:`\theta_L(s)`, see :func:`log_theta`."""
    return np.exp(log_theta(lipschitz, s))


def inverse_square(value: float) -> float:
    r""":math:`1/x^2` for x > 0, rounded to ``inf`` when it overflows and to 0 when it
    underflows, never raising (``x ** 2`` raises OverflowError for x > 1.3e154 and
    ``1 / x ** 2`` ZeroDivisionError for x < 1.5e-162; IEEE multiplication and division
    round instead). Every bound is increasing in 1/z^2, so ``inf`` is the correct
    (vacuous) rounding of an overflow; an underflow rounds to 0 as any floating-point
    result below the smallest double does."""
    reciprocal = 1.0 / float(value)
    return reciprocal * reciprocal


def square(value: float) -> float:
    """x^2 of a Python float, ``inf`` on overflow instead of OverflowError."""
    value = float(value)
    return value * value


def inverse(value: float) -> float:
    """1/value, with 1/0 = inf (a step-size limit with no curvature is no limit)."""
    return math.inf if value == 0 else 1.0 / value


def step_contraction(scaled_low: float, scaled_high: float) -> float:
    r"""Lipschitz constant of one gradient step :math:`x \mapsto x - \nabla h(x)` of a function h whose
    curvature (the Hessian's eigenvalues) lies in [``scaled_low``, ``scaled_high``]:
    :math:`c = \max(|1-\eta\lambda|, |1-\eta M|)` for :math:`h = \eta f`, f lam-strongly convex and M-smooth
    (Hardt, Recht & Singer 2016, arXiv 1509.01240, Lemma 3.7); < 1 for 0 < eta < 2/M and lam > 0.

    The one place this lemma is coded: callers pass the step size times the curvature range of the step's
    objective (per batch size, per l2 split), each product formed as the caller's formula writes it.
    Holds for the unclipped gradient step only."""
    return max(abs(1.0 - scaled_low), abs(1.0 - scaled_high))


def non_expansive_max_learning_rate(smoothness: float, poisson_sampling_probability: float | None = None) -> float:
    r"""Largest step size keeping every gradient step of convex M-smooth losses non-expansive: 2/M
    (Altschuler & Talwar 2022, arXiv 2205.13710, Observation 3.3 / Lemma 2.1; inf for M = 0). Decision
    (audit): a Poisson batch of up to n examples is divided by the expected b, so its step is eta*|B|/b;
    non-expansive for every batch needs eta <= 2b/(nM) = 2q/M, ``poisson_sampling_probability`` = q."""
    limit = 2.0 * inverse(smoothness)
    return limit if poisson_sampling_probability is None else limit * poisson_sampling_probability


def batch_sizes(dataset_size: int, batch_size: int) -> tuple[int, int]:
    r"""(l, r): a pass over n examples in batches of b takes :math:`l = \lceil n/b\rceil` steps, the last
    holding :math:`r = n - (l-1) b` examples (r = b when b divides n). With Poisson sampling b is the
    expected batch size, :math:`b = qn`. The one place these sizes are computed."""
    per_epoch = -(-dataset_size // batch_size)
    return per_epoch, dataset_size - (per_epoch - 1) * batch_size


_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def minimise_over_fraction(
    objective: Callable[[np.ndarray], np.ndarray],
    size: int,
    *,
    grid_points: int = 11,
    refine_iterations: int = 12,
) -> np.ndarray:
    r"""Minimise ``objective`` over a split parameter in (0, 1), independently
    for each of ``size`` orders, vectorised across the orders.

    ``objective(x)`` takes one value of the parameter per order (shape
    ``(size,)``) and returns one value per order. Used for the noise split
    (gamma in Altschuler & Talwar, beta in Liang et al.), where every value of
    the parameter gives a valid bound: the minimum over the points actually
    evaluated is itself a valid bound, so a coarse search can only make the
    result larger than the true minimum, never smaller.

    A logit-spaced grid brackets the minimum, then a golden-section search
    refines it inside the bracket (a real 1-D optimiser, run for all orders at
    once so that each evaluation is a single vectorised call).
    """
    logits = np.linspace(-7.0, 9.0, grid_points)
    grid = 1.0 / (1.0 + np.exp(-logits))
    values = np.stack([objective(np.full(size, g)) for g in grid])  # (grid, size)
    best = np.min(values, axis=0)
    k = np.argmin(values, axis=0)
    lo = grid[np.maximum(k - 1, 0)]
    hi = grid[np.minimum(k + 1, grid_points - 1)]
    lo = np.where(k == 0, grid[0] / 8.0, lo)
    hi = np.where(k == grid_points - 1, 1.0 - (1.0 - grid[-1]) / 8.0, hi)
    x1 = hi - _GOLDEN * (hi - lo)
    x2 = lo + _GOLDEN * (hi - lo)
    f1, f2 = objective(x1), objective(x2)
    best = np.minimum(best, np.minimum(f1, f2))
    for _ in range(refine_iterations):
        left = f1 < f2  # minimum lies in [lo, x2]
        hi = np.where(left, x2, hi)
        lo = np.where(left, lo, x1)
        new_x1 = np.where(left, hi - _GOLDEN * (hi - lo), x2)
        new_x2 = np.where(left, x1, lo + _GOLDEN * (hi - lo))
        x_eval = np.where(left, new_x1, new_x2)
        f_eval = objective(x_eval)
        f1, f2 = np.where(left, f_eval, f2), np.where(left, f1, f_eval)
        x1, x2 = new_x1, new_x2
        best = np.minimum(best, f_eval)
    return best
