r"""Composition baselines: the standard accounting, which
certifies every iterate and therefore also the last one.

* every example used once per epoch (cyclic, shuffle-once, reshuffle),
  replace-one: one Gaussian mechanism with sensitivity 2C per epoch,
  :math:`\lceil T/l\rceil \cdot 2\alpha/z^2`; under random allocation each example is used in k
  steps of an epoch: k of them per epoch (docs/derivations/random-allocation.md#ra-rows);
* uniformly random batches of size b, replace-one: dp-accounting's
  ``SampledWithoutReplacementDpEvent(n, b, GaussianDpEvent(z/2))`` composed T
  times under ``REPLACE_ONE``. GaussianDpEvent takes noise / sensitivity and the
  clipped sum moves by up to 2C when one example is replaced, hence z/2
  (google/differential-privacy issue 378); passing z would under-estimate the
  RDP about four-fold;
* Poisson sampling, add-or-remove-one: the sampled Gaussian mechanism
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` composed T times, which is
  what Opacus' ``RDPAccountant`` and dp-accounting's ``RdpAccountant`` compute.
"""

from __future__ import annotations

import numpy as np

from lastiter_plugins.bounds._common import inverse_square
from lastiter_plugins.bounds.sgm import sgm_rdp, sgm_without_replacement_rdp
from lastiter_plugins.config import LossAssumptions, TrainingConfig


def epoch_rdp(orders: np.ndarray, *, noise_multiplier: float, epochs: int) -> np.ndarray:
    r""":math:`\lceil T/l \rceil \cdot 2\alpha / z^2` (``epochs`` = ceil(T/l))."""
    orders = np.asarray(orders, dtype=float)
    with np.errstate(over="ignore"):  # an overflow is the vacuous bound inf
        return orders * (2.0 * float(epochs) * inverse_square(noise_multiplier))


def random_batch_rdp(
    orders: np.ndarray, *, dataset_size: int, batch_size: int, noise_multiplier: float, steps: int
) -> np.ndarray:
    r"""T x RDP of sampling b of n without replacement, Gaussian noise z/2 (replace-one).

    The value of dp-accounting's ``SampledWithoutReplacementDpEvent(n, b,
    GaussianDpEvent(z/2))`` under ``REPLACE_ONE`` (pinned to it by the tests),
    computed by :func:`~lastiter_plugins.bounds.sgm.sgm_without_replacement_rdp`
    in tens of milliseconds instead of seconds.
    """
    per_step = sgm_without_replacement_rdp(batch_size / dataset_size, noise_multiplier / 2.0, orders)
    with np.errstate(over="ignore"):
        return float(steps) * per_step


def poisson_rdp(orders: np.ndarray, *, sampling_probability: float, noise_multiplier: float, steps: int) -> np.ndarray:
    r"""T x RDP of the Poisson-sampled Gaussian mechanism (add-or-remove-one)."""
    per_step = sgm_rdp(sampling_probability, noise_multiplier, orders, exact_fractional=True)
    with np.errstate(over="ignore"):
        return float(steps) * per_step


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def composition_epochs(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    # one Gaussian mechanism per use of the record: at most k per epoch (k = 1 but under random allocation)
    return epoch_rdp(
        orders, noise_multiplier=cfg.noise_multiplier, epochs=cfg.epochs_started * cfg.allocations_per_epoch
    )


def composition_random_batch(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return random_batch_rdp(
        orders,
        dataset_size=cfg.dataset_size,
        batch_size=cfg.batch_size,
        noise_multiplier=cfg.noise_multiplier,
        steps=cfg.steps,
    )


def composition_poisson(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    return poisson_rdp(
        orders, sampling_probability=cfg.sampling_probability, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps
    )
