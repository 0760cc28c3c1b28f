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
    smoothness: float,
) -> np.ndarray:
    r"""liang-bounded (seed 002, Theorem 3.4, eq. 14 and Lemma 3.2(2)).

    .. math::
        \varepsilon(\alpha) = \min_{\beta\in(0,1)} \mathrm{step}(\alpha,\beta)
          + \frac{\alpha (1+\eta M)^2 D^2 b^2}{2\eta^2 z^2 C^2 (1-\beta)}

    with ``step`` the smaller of the closed form 2 alpha q / (beta z^2) (eq. 14)
    and the exact sampled-Gaussian term S_alpha(q, sqrt(beta) z / 2) (Lemma
    3.2(2) before its relaxation). Both are valid for every beta, so their
    minimum is. With the closed form only, the minimum over beta is
    :math:`(\sqrt{2\alpha q/z^2} + \sqrt{B})^2`; with the SGM term it is found
    by a vectorised grid + golden-section search (every candidate valid).
    The eq. 15 closed form is not used (its conditions, Lemma A.12, are not
    needed once the exact term is available). Independent of T.
    """
    orders = np.asarray(orders, dtype=float)
    q, z = sampling_probability, noise_multiplier
    shift = (
        orders
        * (1.0 + learning_rate * smoothness) ** 2
        * diameter**2
        * batch_size**2
        / (2.0 * learning_rate**2 * z**2 * clip_norm**2)
    )
    closed_form = (np.sqrt(2.0 * orders * q / z**2) + np.sqrt(shift)) ** 2

    def objective(beta: np.ndarray) -> np.ndarray:
        return sgm_rdp(q, np.sqrt(beta) * z / 2.0, orders) + shift / (1.0 - beta)

    return np.minimum(closed_form, minimise_over_fraction(objective, orders.size))


def unbounded_rdp(
    orders: np.ndarray, *, sampling_probability: float, noise_multiplier: float, steps: int
) -> np.ndarray:
    r"""liang-unbounded (seed 002, Theorem 3.3, eq. 12, beta -> 1):
    :math:`T \min(2\alpha q / z^2,\ S_\alpha(q, z/2))`. Composition in disguise."""
    orders = np.asarray(orders, dtype=float)
    q, z = sampling_probability, noise_multiplier
    closed_form = 2.0 * orders * q / z**2
    return steps * np.minimum(closed_form, sgm_rdp(q, z / 2.0, orders, exact_fractional=True))
