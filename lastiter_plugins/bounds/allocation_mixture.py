r"""Random allocation (balls in bins): the last iterate, the differing record's positions mixed against the run
without it, so that the amplification by the secret allocation is kept.

docs/derivations/random-allocation-last-iterate.md. Every epoch each example is assigned to k of the epoch's
t steps, uniformly at random, independently of the other examples and afresh each epoch; the noisy clipped sum
of a step is divided by a FIXED divisor b (the expected batch size n k / t). In the units of
:mod:`lastiter_plugins.bounds.shifted_interpolation` (per-step noise std :math:`\sigma_p = \eta z C / b`):

* each use of the record moves the step by at most :math:`\eta C / b`, ``step_mu`` :math:`s = 1/z`, against the
  run on the other records alone (add-or-remove: that run is the other world; replace-one: a pivot both worlds
  are compared through);
* the batch sizes depend on the other records' allocation only; conditioned on an event G on it (every count of
  the others in a range), every step is c-Lipschitz, and :math:`P(\text{not } G)` is added to delta;
* given the others' allocation in G and the record's, shifted interpolation gives a mu per schedule; every
  epoch but the last one started is moved to its last k steps, the k uses of an epoch merged into one claimed
  injection :math:`k s` at its last use (docs/derivations/schedule-mixtures.md#sm-per-schedule-optimum, Lemma 2):
  mu then depends only on the last use in the last epoch started, a t-component mixture;
* the mixture is compared with :math:`N(0, 1)` (add-or-remove) or with its reflection (replace-one) by
  :class:`~lastiter_plugins.bounds.dominating_mixture.DominatingMixtureProfile`
  (docs/derivations/poisson-amplification.md#lemma-m and #pa-replace-one-pivot).
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction

import numpy as np

from lastiter_plugins.bounds import membership_mixtures, shifted_interpolation
from lastiter_plugins.bounds._glue import given
from lastiter_plugins.bounds.dominating_mixture import DominatingMixtureProfile, best_over_events
from lastiter_plugins.config import LossAssumptions, TrainingConfig

__all__ = [
    "allocation_mixture",
    "last_use_weights",
    "random_allocation_events",
    "random_allocation_profile",
    "shifted_interpolation_random_allocation",
    "shifted_interpolation_random_allocation_replace_one",
]


def last_use_weights(steps_per_epoch: int, allocations: int, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    r"""Probability that the LAST step the record is allocated to, within the first w steps of an epoch (the
    window), is r in [start, end) steps before the window's end: :math:`[\binom{t - r_0}{k} -
    \binom{t - r_1}{k}] / \binom{t}{k}` (the record's k steps are a uniform k-subset of the t; "some of them
    among the last r_1 steps of the window but none among the last r_0" has that probability, whatever w).
    k = 1: :math:`(r_1 - r_0)/t`. Exact integers, then rounded once."""
    t, k = steps_per_epoch, allocations
    total = math.comb(t, k)
    out = [
        float(Fraction(math.comb(t - int(a), k) - math.comb(t - int(b), k), total))
        for a, b in zip(starts, ends, strict=True)
    ]
    return np.asarray(out, dtype=float)


def allocation_mixture(
    *,
    step_mu: float,
    contraction: float,
    steps_per_epoch: int,
    allocations: int,
    steps: int,
    diameter_ratio: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    r"""(weights, mus) of the per-schedule mu-GDP parameters of random allocation, relaxed to depend on the
    last epoch started only (docs/derivations/random-allocation-last-iterate.md#ra-schedules).

    The record's k steps of each epoch are a uniform k-subset of the t, independent across epochs and of the
    data. Relaxations (each raises mu, docs/derivations/schedule-mixtures.md#sm-per-schedule-optimum, Lemma 2,
    shifts may be over-claimed): every epoch but the last one started claims its k uses as one injection
    ``k s`` at its last step; the last epoch started claims ``k s`` at the record's last step within the
    run (a partial epoch may use fewer than k: over-claimed). That is
    :func:`shifted_interpolation.last_pass_mixture` with step ``k s``, weighted by
    :func:`last_use_weights`.

    Args:
      step_mu: s, the shift of one use in per-step noise stds (1/z under the pivot or add-or-remove).
      contraction: c in [0, 1], every step's Lipschitz constant (on the batch-size event).
      steps_per_epoch: t >= 1.
      allocations: k in [1, t], the steps of each epoch the record is assigned to.
      steps: T >= 0.
      diameter_ratio: D / sigma_p, or None.
    """
    if not 1 <= allocations <= steps_per_epoch:
        raise ValueError(f"allocations must be in [1, steps_per_epoch] = [1, {steps_per_epoch}]. Found {allocations}.")
    t, k = steps_per_epoch, allocations
    rest = steps % t if steps >= 0 else 0
    return shifted_interpolation.last_pass_mixture(
        step_mu=k * step_mu,
        contraction=contraction,
        steps_per_epoch=t,
        steps=steps,
        block_weights=functools.partial(last_use_weights, t, k),
        unreached_weight=float(Fraction(math.comb(t - rest, k), math.comb(t, k))) if rest > 0 else 0.0,
        diameter_ratio=diameter_ratio,
    )


def random_allocation_profile(
    *,
    step_mu: float,
    steps_per_epoch: int,
    allocations: int,
    steps: int,
    events,
    reflected: bool,
    diameter_ratio: float | None = None,
) -> DominatingMixtureProfile:
    """Random allocation, both relations (docs/derivations/random-allocation-last-iterate.md#ra-add-or-remove and
    #ra-replace-one): :func:`allocation_mixture` under each (contraction, event probability) pair of
    :func:`random_allocation_events`, as the pair (M, N(0,1)) (add-or-remove) or (M, M reflected)
    (replace-one); the best at REFERENCE_DELTA (each is valid).

    Raises:
      ValueError: no event (no batch-size range keeps the step non-expansive, c <= 1).
    """

    def mixture_for(c: float) -> tuple[np.ndarray, np.ndarray]:
        return allocation_mixture(
            step_mu=step_mu,
            contraction=c,
            steps_per_epoch=steps_per_epoch,
            allocations=allocations,
            steps=steps,
            diameter_ratio=diameter_ratio,
        )

    return best_over_events(events, mixture_for, reflected=reflected)


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def _allocation(cfg: TrainingConfig) -> tuple[int, int]:
    """(t, k): the steps of an epoch, ``ceil(n k / b)``, and the steps each example is assigned to in it
    (``allocations_per_epoch``; k = 1 is balls in bins); b is the fixed divisor, at least the expected batch
    size n k / t. Every function below is written for any k."""
    return cfg.steps_per_epoch, cfg.allocations_per_epoch


def random_allocation_events(cfg: TrainingConfig, a: LossAssumptions) -> tuple[tuple[float, float], ...]:
    """The batch-size events of random allocation (docs/derivations/random-allocation-last-iterate.md#ra-sizes):
    every other record joins a given step with probability k/t (the upper tail at n others, the lower at n - 1);
    empty when no range keeps the step non-expansive."""
    t, k = _allocation(cfg)
    return _events(
        dataset_size=cfg.dataset_size,
        batch_size=cfg.batch_size,
        rate=k / t,
        steps=cfg.steps,
        learning_rate=given(cfg.learning_rate, "learning_rate"),
        strong_convexity=a.strong_convexity,
        smoothness=given(a.smoothness, "smoothness"),
        l2_outside_clip=a.l2_outside_clip,
    )


@functools.lru_cache(maxsize=256)
def _events(
    *,
    dataset_size: int,
    batch_size: int,
    rate: float,
    steps: int,
    learning_rate: float,
    strong_convexity: float,
    smoothness: float,
    l2_outside_clip: bool,
) -> tuple[tuple[float, float], ...]:
    # keyed on every input; the binomial-tail bisections are asked by the row's condition and by its glue
    return tuple(
        membership_mixtures.batch_size_events(
            dataset_size=dataset_size,
            batch_size=batch_size,
            low_rate=rate,
            high_rate=rate,
            steps=steps,
            learning_rate=learning_rate,
            strong_convexity=strong_convexity,
            smoothness=smoothness,
            l2_outside_clip=l2_outside_clip,
        )
    )


def _random_allocation(cfg: TrainingConfig, a: LossAssumptions, *, reflected: bool) -> DominatingMixtureProfile:
    # each schedule's run against the run on the other records alone: shift C per use (the divisor b is fixed)
    t, k = _allocation(cfg)
    learning_rate = given(cfg.learning_rate, "learning_rate")
    return random_allocation_profile(
        step_mu=shifted_interpolation.replace_one_step_mu(cfg.noise_multiplier) / 2.0,
        steps_per_epoch=t,
        allocations=k,
        steps=cfg.steps,
        events=list(random_allocation_events(cfg, a)),
        reflected=reflected,
        diameter_ratio=shifted_interpolation.diameter_in_noise_units(
            a.diameter,
            batch_size=cfg.batch_size,
            learning_rate=learning_rate,
            noise_multiplier=cfg.noise_multiplier,
            clip_norm=cfg.clip_norm,
        ),
    )


def shifted_interpolation_random_allocation(cfg: TrainingConfig, a: LossAssumptions) -> DominatingMixtureProfile:
    """Add-or-remove: the schedules mixed against the run without the record."""
    return _random_allocation(cfg, a, reflected=False)


def shifted_interpolation_random_allocation_replace_one(
    cfg: TrainingConfig, a: LossAssumptions
) -> DominatingMixtureProfile:
    """Replace-one: both worlds compared through the run without the record."""
    return _random_allocation(cfg, a, reflected=True)
