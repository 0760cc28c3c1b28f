r"""Kong & Ribero, "Privacy of the last iterate in cyclically-traversed DP-SGD on
nonconvex composite losses" (arXiv 2407.05237; its first version for the curvature-free bound).

Paper symbols: stepsize :math:`\lambda` (= learning rate ``eta``), parameter-space
noise :math:`\sigma = \eta z C / b`, so :math:`\lambda C/(b\sigma) = 1/z`;
:math:`\ell` steps per pass, :math:`E` full passes, Lipschitz constant :math:`L`
of the (clipped) gradient update. Losses are m-weakly convex and M-upper-curved
(arXiv 2407.05237, (A2) and eq. 11); the optional regulariser/projection is convex.
"""

from __future__ import annotations

import math

import numpy as np

from lastiter_plugins.bounds._common import inverse_square, square, theta
from lastiter_plugins.bounds._glue import given
from lastiter_plugins.config import LossAssumptions, TrainingConfig


def update_lipschitz(
    learning_rate: float, smoothness: float, weak_convexity: float, clipping_may_be_active: bool
) -> float:
    r"""Lipschitz constant L of one (clipped) gradient step.

    :math:`L_\eta = \sqrt{1 + 2\eta m (1 + m/(2(M+m)))}` (arXiv 2407.05237, eq. 13;
    1 when m = 0). With clipping possibly active the clipped update is only
    proven :math:`\sqrt 2 L_\eta`-Lipschitz (arXiv 2407.05237, Prop. 2.1(b)); without
    clipping (every per-example gradient norm <= C on the whole domain, arXiv 2407.05237
    Prop. 2.1(c)) it is :math:`L_\eta`. docs/bounds.md
    """
    m, big_m = weak_convexity, smoothness
    l_eta = 1.0 if m == 0.0 else math.sqrt(1.0 + 2.0 * learning_rate * m * (1.0 + m / (2.0 * (big_m + m))))
    return l_eta if not clipping_may_be_active else math.sqrt(2.0) * l_eta


def max_learning_rate(smoothness: float, weak_convexity: float, clipping_may_be_active: bool) -> float:
    r"""Largest step size the theorems allow: 1/(2(M+m)) with clipping, 1/(M+m)
    without (arXiv 2407.05237, Thm. 2.2/2.3 and Prop. 2.1(c)); inf for linear losses."""
    curvature = smoothness + weak_convexity
    if curvature == 0.0:
        return math.inf
    return 1.0 / (2.0 * curvature) if clipping_may_be_active else 1.0 / curvature


def cyclic_rdp(
    orders: np.ndarray, *, noise_multiplier: float, steps_per_epoch: int, epochs: int, lipschitz: float
) -> np.ndarray:
    r"""kong-ribero-cyclic: :math:`\varepsilon(\alpha) = \frac{4\alpha}{z^2}(1 + E\,\theta_L(\ell))`.

    Seed 003, Theorem 2.3 (eqs. 17 and 19). Holds for cyclic traversal of any
    fixed (data-independent) order of the examples, hence also shuffle-once.
    The published statement is implemented, not the (tighter, unpublished)
    expression of its proof. ``epochs`` is E = floor(T / l).
    """
    orders = np.asarray(orders, dtype=float)
    factor = 4.0 * inverse_square(noise_multiplier) * (1.0 + epochs * float(theta(lipschitz, steps_per_epoch)))
    with np.errstate(over="ignore"):  # an overflow is the vacuous bound inf, never below the truth
        return orders * factor


def bounded_rdp(
    orders: np.ndarray,
    *,
    noise_multiplier: float,
    lipschitz: float,
    diameter: float,
    batch_size: int,
    learning_rate: float,
    clip_norm: float,
) -> np.ndarray:
    r"""kong-ribero-bounded: :math:`\frac{\alpha}{2}\left(\frac{L D b}{\eta z C} + \frac{2}{z}\right)^2`.

    Seed 003, Theorem 2.2 (eq. 16): iterates confined to a convex set of
    diameter D. Independent of the number of steps. L is the Lipschitz
    constant of the clipped update (see :func:`update_lipschitz`; docs/bounds.md
    decision: sqrt(2) L_eta when clipping may be active).
    """
    orders = np.asarray(orders, dtype=float)
    z = noise_multiplier
    # Python float arithmetic rounds an overflow to inf (the vacuous bound) instead of raising
    shift = lipschitz * diameter * batch_size / learning_rate / z / clip_norm + 2.0 / z
    with np.errstate(over="ignore"):
        return orders * (square(shift) / 2.0)


def curvature_free_rdp(orders: np.ndarray, *, noise_multiplier: float, steps: int, batch_size: int) -> np.ndarray:
    r"""kong-ribero-curvature-free: :math:`8\alpha T b^2 / z^2`.

    Seed 000, Theorem 4.3 (eq. 18): no assumption on the losses beyond
    clipped gradients. Always worse than composition; kept for completeness.
    """
    orders = np.asarray(orders, dtype=float)
    factor = 8.0 * float(steps) * square(batch_size) * inverse_square(noise_multiplier)
    with np.errstate(over="ignore"):  # an overflow is the vacuous bound inf
        return orders * factor


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def _lipschitz(cfg: TrainingConfig, a: LossAssumptions) -> float:
    # The scalar-GLM route makes the clipped update the gradient step of convex losses psi_i with
    # |grad psi_i| <= C: Kong & Ribero's no-clipping constant L_eta applies (no sqrt(2)).
    return update_lipschitz(
        given(cfg.learning_rate, "learning_rate"),
        given(a.smoothness, "smoothness"),
        a.weak_convexity,
        not a.update_is_gradient_step,
    )


def kong_ribero_step_limit(cfg: TrainingConfig, a: LossAssumptions) -> float:
    """The largest learning rate the row's theorems allow for this pipeline (see :func:`max_learning_rate`)."""
    return max_learning_rate(given(a.smoothness, "smoothness"), a.weak_convexity, not a.update_is_gradient_step)


def kong_ribero_cyclic(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return cyclic_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        steps_per_epoch=cfg.steps_per_epoch,
        epochs=cfg.full_epochs,
        lipschitz=_lipschitz(cfg, a),
    )


def kong_ribero_bounded(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return bounded_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        lipschitz=_lipschitz(cfg, a),
        diameter=given(a.diameter, "diameter"),
        batch_size=cfg.batch_size,
        learning_rate=given(cfg.learning_rate, "learning_rate"),
        clip_norm=cfg.clip_norm,
    )


def kong_ribero_curvature_free(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return curvature_free_rdp(orders, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps, batch_size=cfg.batch_size)
