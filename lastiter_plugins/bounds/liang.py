r"""Liang, Zhang, He, Wu & Xing, "An Improved Privacy and Utility Analysis of
Differentially Private SGD with Bounded Domain and Smooth Losses" (ICML 2025,
arXiv 2502.17772).

Paper symbols: :math:`\sigma_{DP} = zC/b`, smoothness :math:`L = M`,
sampling rate :math:`q = b/n` (Poisson), add-or-remove-one neighbours.
Losses M-smooth (non-convex allowed), clipped gradients.
"""

from __future__ import annotations

import math

import numpy as np

from lastiter_plugins.bounds._common import minimise_over_fraction, square
from lastiter_plugins.bounds._glue import domain_inputs, given
from lastiter_plugins.bounds.sgm import sgm_rdp
from lastiter_plugins.config import LossAssumptions, TrainingConfig


def step_expansion(learning_rate: float, smoothness: float, largest_batch: int, batch_size: int) -> float:
    r"""Lipschitz constant of one clipped gradient step of M-smooth losses (clipping is a
    projection, hence 1-Lipschitz, so clip o grad f is M-Lipschitz): 1 + eta*M for a
    batch of at most b examples (arXiv 2502.17772, eq. 37). Decision (audit): a Poisson
    batch B is divided by the fixed b, so the step is (1 + eta*M*|B|/b)-Lipschitz; |B|
    can be as large as the dataset, and under add-or-remove the larger of the two
    neighbouring datasets has n + 1 examples, so pass ``largest_batch`` = n + 1."""
    return 1.0 + learning_rate * smoothness * largest_batch / batch_size


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
    r"""liang-bounded (Liang et al. 2025, arXiv 2502.17772, Theorem 3.4 with the exact step
    term of Lemma 3.2(2)), add-or-remove-one neighbours, Poisson sampling:

    .. math::
        \varepsilon(\alpha) = \min_{\beta\in(0,1)} S_\alpha(q, \sqrt\beta z)
          + \frac{\alpha c^2 D^2 b^2}{2\eta^2 z^2 C^2 (1-\beta)}

    ``expansion`` is the Lipschitz constant c of one gradient step (the paper's
    1 + eta M, eq. 37, for a batch of at most b examples; the registry passes the
    worst case over Poisson batch sizes, see docs/bounds.md).

    Decision (sensitivity): adding or removing one example changes the clipped
    gradient sum by at most C, so the sampled-Gaussian step term has
    noise/sensitivity :math:`\sqrt\beta z` (the paper's proof, eq. 41, uses 2C, the
    replace-one sensitivity, i.e. :math:`\sqrt\beta z/2`). The shift term depends
    on the diameter, the expansion and the noise only. :math:`S_\alpha` is
    dp-accounting's sampled Gaussian RDP (mixture versus Gaussian), which dominates
    the other direction (Mironov, Talwar & Zhang 2019, arXiv 1908.10530, Thm. 5), so
    both directions of the add-or-remove relation are covered.

    Decision (closed forms): the step term 2 alpha q / (beta z^2) of eq. 14 is not
    used. It is not an upper bound on the sampled Gaussian divergence at large
    orders: its beta -> 1 limit, eq. 12, is below the exact divergence already at
    T = 1 (alpha = 32, q = 0.05, z = 1: 3.2 < 12.91). The minimum over beta is a
    vectorised grid + golden-section search whose every candidate is a valid bound.
    Independent of T.

    Args:
      orders: Renyi orders > 1.
      sampling_probability: q = b/n.
      noise_multiplier: z (noise std on the clipped gradient sum is z*C).
      diameter: D, diameter of the projection set.
      batch_size: b.
      learning_rate: eta.
      clip_norm: C.
      expansion: c >= 1, Lipschitz constant of one (clipped) gradient step.

    Returns:
      RDP (nats) at each order, add-or-remove-one neighbours.
    """
    orders = np.asarray(orders, dtype=float)
    q, z = sampling_probability, noise_multiplier
    rho = _shift_rho(z, diameter, batch_size, learning_rate, clip_norm, expansion)
    with np.errstate(over="ignore"):
        shift = orders * rho

    def objective(beta: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return sgm_rdp(q, np.sqrt(beta) * z, orders) + shift / (1.0 - beta)

    return minimise_over_fraction(objective, orders.size)


def _shift_rho(
    noise_multiplier: float, diameter: float, batch_size: int, learning_rate: float, clip_norm: float, expansion: float
) -> float:
    r""":math:`\rho = (c D b / (\eta z C))^2 / 2`, the shift term's slope in the order; in Python floats,
    which round an overflow to inf (vacuous) instead of raising."""
    return square(expansion * diameter * batch_size / learning_rate / noise_multiplier / clip_norm) / 2.0


def bounded_lower_epsilon(
    delta: float,
    *,
    sampling_probability: float,
    noise_multiplier: float,
    diameter: float,
    batch_size: int,
    learning_rate: float,
    clip_norm: float,
    expansion: float,
) -> float:
    r"""A proven lower bound on the epsilon that liang-bounded reports at ``delta``, without its
    sampled-Gaussian term (docs/derivations/lower-estimates.md#liang-bounded-estimate): every candidate of
    :func:`bounded_rdp`
    is at least its shift term, :math:`\rho\alpha` with :math:`\rho = (c D b/(\eta z C))^2/2`, and
    dp-accounting's conversion of :math:`\rho\alpha` at any order exceeds
    :math:`\rho + 2\sqrt{\rho(\log(1/\delta) - 1)} - 1`."""
    del sampling_probability  # the estimate leaves out the sampled-Gaussian term, the only one using q
    rho = _shift_rho(noise_multiplier, diameter, batch_size, learning_rate, clip_norm, expansion)
    log_inv_delta = -math.log(delta)
    if log_inv_delta <= 1.0 or not rho > 0.0:
        return 0.0
    return max(0.0, rho + 2.0 * math.sqrt(rho * (log_inv_delta - 1.0)) - 1.0)


def unbounded_rdp(
    orders: np.ndarray, *, sampling_probability: float, noise_multiplier: float, steps: int
) -> np.ndarray:
    r"""liang-unbounded (Liang et al. 2025, arXiv 2502.17772, Theorem 3.3 with the exact
    step term): :math:`T\,S_\alpha(q, z)`, add-or-remove-one neighbours, Poisson sampling.

    With no shift to reduce, every beta < 1 gives :math:`T S_\alpha(q, \sqrt\beta z)`;
    the infimum is the limit beta -> 1. Sensitivity C under add-or-remove (see
    :func:`bounded_rdp`), so this equals the Poisson composition baseline (Opacus'
    RDP accountant): composition in disguise, kept for completeness.

    Decision (audit): eq. 12's closed form T * 2 alpha q / z^2 is below the exact
    divergence at T = 1 for large orders, so only the exact sampled-Gaussian term
    (Mironov, Talwar & Zhang 2019, arXiv 1908.10530; dominates both directions,
    their Thm. 5) is used.

    Args:
      orders: Renyi orders > 1.
      sampling_probability: q = b/n.
      noise_multiplier: z.
      steps: T.

    Returns:
      RDP (nats) at each order, add-or-remove-one neighbours.
    """
    orders = np.asarray(orders, dtype=float)
    per_step = sgm_rdp(sampling_probability, noise_multiplier, orders, exact_fractional=True)
    with np.errstate(over="ignore"):
        return float(steps) * per_step


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def _expansion(cfg: TrainingConfig, a: LossAssumptions) -> float:
    # the larger neighbouring dataset has n + 1 examples, all of which a Poisson batch can hold
    return step_expansion(
        given(cfg.learning_rate, "learning_rate"),
        given(a.smoothness, "smoothness"),
        cfg.dataset_size + 1,
        cfg.batch_size,
    )


def liang_bounded_lower(cfg: TrainingConfig, a: LossAssumptions, delta: float, beat: float = math.inf) -> float:
    return bounded_lower_epsilon(delta, expansion=_expansion(cfg, a), **domain_inputs(cfg, a))


def liang_bounded(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return bounded_rdp(orders, **domain_inputs(cfg, a), expansion=_expansion(cfg, a))


def liang_unbounded(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return unbounded_rdp(
        orders, sampling_probability=cfg.sampling_probability, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps
    )
