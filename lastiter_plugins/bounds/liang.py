r"""Liang, Zhang, He, Wu & Xing, "An Improved Privacy and Utility Analysis of
Differentially Private SGD with Bounded Domain and Smooth Losses" (seed 002).

Paper symbols: :math:`\sigma_{DP} = zC/b`, smoothness :math:`L = M`,
sampling rate :math:`q = b/n` (Poisson), add-or-remove-one neighbours.
Losses M-smooth (non-convex allowed), clipped gradients.
"""

from __future__ import annotations

import numpy as np

from lastiter_plugins.bounds._common import minimise_over_fraction
from lastiter_plugins.bounds.sgm import sgm_rdp


def bounded_rdp(
    orders: np.ndarray,
    *,
    sampling_probability: float,
    noise_multiplier: float,
    diameter: float,
    batch_size: int,
    learning_rate: float,
    clip_norm: float,
    expansion: float,
) -> np.ndarray:
    r"""liang-bounded (seed 002, Theorem 3.4 with the exact step term of Lemma 3.2(2)).

    .. math::
        \varepsilon(\alpha) = \min_{\beta\in(0,1)} S_\alpha(q, \sqrt\beta z/2)
          + \frac{\alpha c^2 D^2 b^2}{2\eta^2 z^2 C^2 (1-\beta)}

    ``expansion`` is the Lipschitz constant c of one gradient step (the paper's
    1 + eta M, eq. 37, for a batch of at most b examples; the registry passes the
    worst case over Poisson batch sizes, see docs/bounds.md).

    Decision (audit of seed 002): the closed-form step term 2 alpha q / (beta z^2)
    of eq. 14 is not used. It is not an upper bound on the sampled Gaussian
    divergence at large orders: its beta -> 1 limit, eq. 12, is below the exact
    divergence already at T = 1 (alpha = 32, q = 0.05, z = 1: 3.2 < 12.91). The
    exact term S_alpha(q, sqrt(beta) z/2) (sensitivity 2C, the mixture-vs-Gaussian
    direction computed by dp-accounting, which dominates the other) is used
    instead. The minimum over beta is a vectorised grid + golden-section search
    whose every candidate is a valid bound. Independent of T.
    """
    orders = np.asarray(orders, dtype=float)
    q, z = sampling_probability, noise_multiplier
    shift = orders * expansion**2 * diameter**2 * batch_size**2 / (2.0 * learning_rate**2 * z**2 * clip_norm**2)

    def objective(beta: np.ndarray) -> np.ndarray:
        return sgm_rdp(q, np.sqrt(beta) * z / 2.0, orders) + shift / (1.0 - beta)

    return minimise_over_fraction(objective, orders.size)


def unbounded_rdp(
    orders: np.ndarray, *, sampling_probability: float, noise_multiplier: float, steps: int
) -> np.ndarray:
    r"""liang-unbounded (seed 002, Theorem 3.3 with the exact step term): :math:`T\,S_\alpha(q, z/2)`.

    Decision (audit of seed 002): eq. 12's closed form T * 2 alpha q / z^2 is
    below the exact divergence at T = 1 for large orders, so only the exact
    sampled-Gaussian term is used. With sensitivity 2C it is never below the
    Poisson composition baseline: composition in disguise, kept for completeness.
    """
    orders = np.asarray(orders, dtype=float)
    return steps * sgm_rdp(sampling_probability, noise_multiplier / 2.0, orders, exact_fractional=True)
