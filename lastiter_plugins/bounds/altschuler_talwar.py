r"""Altschuler & Talwar, "Privacy of Noisy Stochastic Gradient Descent: More
Iterations without More Privacy Loss" (arXiv 2205.13710).

Paper symbols: gradient-space noise :math:`\sigma = zC/b`, gradient bound
(Lipschitz constant) :math:`L = C`, so a replaced example moves the averaged
gradient by at most :math:`2C/b` and each step is a sampled Gaussian mechanism
with noise-to-sensitivity ratio :math:`z/2`. Losses convex and M-smooth,
step size :math:`\eta \le 2/M`, projection onto a convex set of diameter D
after every step; the differing example is used with probability q per step.
"""

from __future__ import annotations

import numpy as np

from lastiter_plugins.bounds._common import minimise_over_fraction, square
from lastiter_plugins.bounds._glue import domain_inputs, fixed_size_strong_contraction
from lastiter_plugins.bounds.sgm import sgm_rdp
from lastiter_plugins.config import LossAssumptions, TrainingConfig


def _min_over_horizon(per_step: np.ndarray, shift: np.ndarray, steps: int) -> np.ndarray:
    r"""min over integer R in [1, steps] of R * per_step + shift / R.

    The objective is convex in R with continuous minimiser sqrt(shift/per_step);
    its two integer neighbours (clipped to [1, steps]) contain the minimum.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # 0/0, inf/inf: any R is valid (R = T)
        r_star = np.sqrt(shift / per_step)
    best = np.full(per_step.shape, np.inf)
    for r in (np.floor(r_star), np.ceil(r_star)):
        r = np.clip(np.nan_to_num(r, nan=steps, posinf=steps), 1, steps)
        with np.errstate(over="ignore"):
            best = np.minimum(best, r * per_step + shift / r)
    return best


def _min_over_horizon_contracting(
    per_step: np.ndarray, shift: np.ndarray, contraction: float, steps: int
) -> np.ndarray:
    r"""min over integer R in [1, steps] of R * per_step + contraction^(2R) * shift.

    Convex in R; the stationary point solves per_step = -2 ln(c) c^(2R) shift.
    """
    if contraction == 0.0:
        return per_step.copy()  # c^(2R) = 0 for every R >= 1
    log_c = np.log(contraction)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        r_star = np.log(per_step / (-2.0 * log_c * shift)) / (2.0 * log_c)
    best = np.full(per_step.shape, np.inf)
    for r in (np.floor(r_star), np.ceil(r_star)):
        r = np.clip(np.nan_to_num(r, nan=1.0, posinf=steps, neginf=1.0), 1, steps)
        with np.errstate(over="ignore", divide="ignore"):
            # c^(2R) shift in log space: c^(2R) may underflow where the shift overflows (then the term is inf)
            decayed = np.exp(2.0 * r * log_c + np.log(shift))
            best = np.minimum(best, r * per_step + decayed)
    return best


def rdp(
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
    r"""altschuler-talwar RDP bound (arXiv 2205.13710, eq. 3.6; strongly convex: eq. 5.3, Remark 5.3).

    .. math::
        \varepsilon(\alpha) = \min\Big( T S_\alpha(q, z/2),\;
          \min_{\gamma\in(0,1),\,R\in\{1..T\}} R\,S_\alpha(q, z\sqrt\gamma/2)
          + \frac{\alpha D^2 b^2}{2\eta^2 z^2 C^2 (1-\gamma) R} \Big)

    where gamma splits the noise between the privacy-amplification-by-iteration
    shift and the last R sampled-Gaussian steps. With strong convexity
    (``contraction`` c = max(|1 - eta lam|, |1 - eta M|) < 1) the shift term
    ``alpha D^2 b^2 / (2 eta^2 z^2 C^2 (1-gamma) R)`` may be replaced by
    ``c^(2R) alpha D^2 b^2 / (2 eta^2 z^2 C^2 (1-gamma))``; both are valid, the
    smaller is kept. The minimisation over R is exact (closed form plus its
    integer neighbours); over gamma it is a vectorised grid + golden-section
    search whose every candidate is a valid bound.

    Args:
      orders: Renyi orders.
      sampling_probability: q, the probability that the differing example is
        in a given batch (b/n).
      noise_multiplier: z.
      steps: T.
      diameter: D.
      batch_size: b.
      learning_rate: eta.
      clip_norm: C.
      contraction: c for the strongly convex variant, or None.
    """
    orders = np.asarray(orders, dtype=float)
    q, z = sampling_probability, noise_multiplier
    with np.errstate(over="ignore"):  # an overflow is the vacuous bound inf
        composition = float(steps) * sgm_rdp(q, z / 2.0, orders)
        # alpha (D b / (eta z C))^2 / 2; Python floats round an overflow to inf instead of raising
        shift_unit = orders * (square(diameter * batch_size / learning_rate / z / clip_norm) / 2.0)

    def objective(gamma: np.ndarray) -> np.ndarray:
        per_step = sgm_rdp(q, z * np.sqrt(gamma) / 2.0, orders)
        with np.errstate(over="ignore"):
            shift = shift_unit / (1.0 - gamma)
        value = _min_over_horizon(per_step, shift, steps)
        if contraction is not None and contraction < 1.0:
            value = np.minimum(value, _min_over_horizon_contracting(per_step, shift, contraction, steps))
        return value

    return np.minimum(composition, minimise_over_fraction(objective, orders.size))


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def altschuler_talwar_random_batch(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    # The strongly convex variant (eq. 5.3) needs the step to contract by c < 1.
    return rdp(orders, steps=cfg.steps, contraction=fixed_size_strong_contraction(cfg, a), **domain_inputs(cfg, a))


def altschuler_talwar_poisson(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    # the convex form only: an empty Poisson batch does not contract
    return rdp(orders, steps=cfg.steps, contraction=None, **domain_inputs(cfg, a))
