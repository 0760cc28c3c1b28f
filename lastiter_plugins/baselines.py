r"""The standard every-iterate baselines of ``best``, as the registry's rows compute them.

The tightest baselines whose validity is proven (docs/derivations/baselines.md#baselines):

* epoch schemes (cyclic, shuffle_once, reshuffle), replace-one: one Gaussian mechanism
  with shift ``2/z`` per epoch, ``ceil(T/l)`` epochs, composed exactly:
  :math:`\mu = 2\sqrt{E}/z`-GDP (Dong, Roth & Su 2019, arXiv 1905.02383, Cor. 3.3),
  converted exactly (:func:`epoch_gdp_profile`);
* Poisson, add-or-remove: dp-accounting's privacy loss distribution of
  ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` composed T times
  (:class:`PoissonPldProfile`);
* Poisson, replace-one: the same construction for the dominating pair proven in
  docs/derivations/baselines.md#poisson-replace-one-pair;
* fixed-size random batches, replace-one: the same construction for the pair proven in
  docs/derivations/baselines.md#random-batch-pair (noise multiplier ``z/2``, the larger of the remove and add pairs'
  profiles at every epsilon, :class:`RandomBatchPldProfile`);
* random allocation (each example in k of an epoch's t steps), add-or-remove: Feldman & Shenfeld's
  privacy loss distribution of one allocation (``PLD_accounting``), composed over the epochs by
  dp-accounting (:class:`RandomAllocationPldProfile`); replace-one: the remove and add profiles of the
  same run joined by the triangle inequality through the run without the record
  (:class:`RandomAllocationReplaceOneProfile`); docs/derivations/random-allocation.md.

A PLD figure depends on the discretisation, pinned here (interval ``1e-4``,
pessimistic connect-the-dots, dp-accounting's truncations), and, in its last digits,
on dp-accounting's version. A composed distribution is cached per process on every
input that determines it. :func:`poisson_pld_lower_epsilon` and
:func:`random_batch_pld_lower_epsilon` are the proven lower bounds ``best`` uses to skip the
composition when it cannot change the minimum.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Protocol

from lastiter_plugins.bounds import random_allocation, sampled_gaussian_pld
from lastiter_plugins.bounds._glue import PrivacyProfile
from lastiter_plugins.config import LossAssumptions, Relation, TrainingConfig
from lastiter_plugins.profiles import GaussianMixtureProfile

#: A PLD row composes at most this many steps (memory and time grow with the support of
#: the composed distribution, about sqrt(T)); beyond, it does not apply and the RDP rows remain.
PLD_MAX_STEPS = 10**6


#: A mu above this is vacuous at any delta of interest; rounded up to inf so that mu^2 never overflows.
_MU_VACUOUS = 1e150


def epoch_gdp_mu(noise_multiplier: float, epochs: int) -> float:
    r""":math:`\mu = 2\sqrt{E}/z`: ``epochs`` Gaussian mechanisms of shift ``2/z`` composed
    (Dong, Roth & Su 2019, Cor. 3.3); ``inf`` (vacuous) above 1e150."""
    mu = 2.0 * math.sqrt(float(epochs)) / float(noise_multiplier)
    return mu if mu <= _MU_VACUOUS else math.inf


def epoch_gdp_profile(cfg: TrainingConfig, a: LossAssumptions) -> GaussianMixtureProfile:
    """The mu-GDP profile of every iterate of an epoch scheme under replace-one: one Gaussian mechanism per use of the
    record, at most ``k`` uses per epoch (k = 1 but under random allocation,
    docs/derivations/random-allocation.md#ra-rows)."""
    return GaussianMixtureProfile.gaussian(
        epoch_gdp_mu(cfg.noise_multiplier, cfg.epochs_started * cfg.allocations_per_epoch)
    )


class _ComposedPld(Protocol):
    """A profile read from one composed dp-accounting ``PrivacyLossDistribution`` (hashable: the caches key on it)."""

    def __hash__(self) -> int: ...

    def _pld(self) -> Any: ...


@dataclasses.dataclass(frozen=True)
class PoissonPldProfile:
    """The privacy profile of T Poisson-sampled Gaussian steps, from dp-accounting's PLD.

    The composed distribution is built on first use and cached on every field
    (:func:`lastiter_plugins.bounds.sampled_gaussian_pld.composed`).

    Attributes:
      sampling_probability: q.
      noise_multiplier: z (noise std over the clip norm).
      steps: T.
      relation: add-or-remove (the remove and add pairs) or replace-one (the pair of
        docs/derivations/baselines.md#poisson-replace-one-pair).
    """

    sampling_probability: float
    noise_multiplier: float
    steps: int
    relation: Relation

    def _pld(self):
        return sampled_gaussian_pld.composed(
            self.sampling_probability,
            self.noise_multiplier,
            self.steps,
            self.relation is Relation.ADD_OR_REMOVE_ONE,
        )

    def epsilon(self, delta: float) -> float:
        """Epsilon at ``delta``: dp-accounting's ``get_epsilon_for_delta`` (pessimistic), computed vectorised
        (:func:`~lastiter_plugins.bounds.sampled_gaussian_pld.epsilon_for_delta`), at ``delta`` less the
        FFT noise margin (:func:`fft_noise_margin`); cached on every field and ``delta``."""
        return _pld_epsilon(self, float(delta))

    def delta(self, eps: float) -> float:
        """Delta at ``eps``: dp-accounting's ``get_delta_for_epsilon`` (pessimistic), computed vectorised
        (:func:`~lastiter_plugins.bounds.sampled_gaussian_pld.delta_for_epsilon`), plus the FFT noise
        margin, at most 1."""
        return min(sampled_gaussian_pld.delta_for_epsilon(self._pld(), float(eps)) + _margin(self), 1.0)


#: The smallest FFT noise margin added to a PLD row's delta (docs/derivations/baselines.md#fft-noise-margin).
MIN_FFT_NOISE_MARGIN = 1e-12


def fft_noise_margin(pld) -> float:
    """What a PLD row adds to the host's delta for the rounding of its FFT composition
    (docs/derivations/baselines.md#fft-noise-margin): ten times the total of the composed PMFs' negative probabilities
    (pure FFT
    noise: every true probability is >= 0), at least MIN_FFT_NOISE_MARGIN."""
    return max(MIN_FFT_NOISE_MARGIN, 10.0 * sampled_gaussian_pld.negative_mass(pld))


@functools.lru_cache(maxsize=64)
def _margin(profile: _ComposedPld) -> float:
    # the negative mass walks the composed tables: once per distribution, not once per delta asked
    return fft_noise_margin(profile._pld())


@functools.lru_cache(maxsize=64)
def _pld_epsilon(profile: _ComposedPld, delta: float) -> float:
    margin = _margin(profile)
    return sampled_gaussian_pld.epsilon_for_delta(profile._pld(), delta - margin) if delta > margin else math.inf


@dataclasses.dataclass(frozen=True)
class RandomBatchPldProfile(PoissonPldProfile):
    """The privacy profile of T steps with fixed-size random batches (b of n without replacement,
    replace-one): the pair of docs/derivations/baselines.md#random-batch-pair, at rate ``q = b/n`` and noise
    multiplier ``z/2``, composed T times. ``relation`` is replace-one."""

    def _pld(self):
        return sampled_gaussian_pld.composed_pairs(
            self.sampling_probability, self.noise_multiplier / 2.0, self.steps, (sampled_gaussian_pld.SUBSTITUTE,)
        )


def poisson_pld_profile(cfg: TrainingConfig, a: LossAssumptions) -> PoissonPldProfile:
    """The PLD profile of the pipeline's Poisson steps under its declared relation."""
    return PoissonPldProfile(cfg.sampling_probability, cfg.noise_multiplier, cfg.steps, cfg.relation)


def poisson_pld_lower_epsilon(cfg: TrainingConfig, a: LossAssumptions, delta: float, beat: float = math.inf) -> float:
    """A proven lower bound on the PLD row's epsilon at ``delta`` (one bit per step;
    docs/derivations/baselines.md#skip-pld-rows); it stops
    once it is above ``beat``."""
    return sampled_gaussian_pld.binarised_lower_epsilon(
        delta,
        sampling_probability=cfg.sampling_probability,
        noise_multiplier=cfg.noise_multiplier,
        steps=cfg.steps,
        add_or_remove=cfg.relation is Relation.ADD_OR_REMOVE_ONE,
        beat=beat,
    )


def random_batch_pld_profile(cfg: TrainingConfig, a: LossAssumptions) -> RandomBatchPldProfile:
    """The PLD profile of the pipeline's fixed-size random batches under replace-one."""
    return RandomBatchPldProfile(cfg.sampling_probability, cfg.noise_multiplier, cfg.steps, Relation.REPLACE_ONE)


def random_batch_pld_lower_epsilon(
    cfg: TrainingConfig, a: LossAssumptions, delta: float, beat: float = math.inf
) -> float:
    """A proven lower bound on the random-batch PLD row's epsilon at ``delta``: the bits of the remove and
    add pairs at noise ``z/2`` (docs/derivations/baselines.md#skip-pld-rows), both dominated by the row's pair
    (docs/derivations/baselines.md#random-batch-pair)."""
    return sampled_gaussian_pld.binarised_lower_epsilon(
        delta,
        sampling_probability=cfg.sampling_probability,
        noise_multiplier=cfg.noise_multiplier / 2.0,
        steps=cfg.steps,
        add_or_remove=True,
        beat=beat,
    )


@dataclasses.dataclass(frozen=True)
class RandomAllocationPldProfile:
    """The privacy profile of every iterate of a run with random allocation, add-or-remove: dp-accounting's remove
    and add PMFs of the run (:func:`~lastiter_plugins.bounds.random_allocation.composed`), read as the Poisson rows
    read theirs (epsilon at ``delta`` less the FFT noise margin; delta plus it).

    Attributes:
      noise_multiplier: z (noise std over the clip norm).
      steps_per_epoch: t.
      allocations: k, the steps of an epoch each example joins.
      epochs: epochs begun, ``ceil(T/t)`` (a partial last epoch is accounted as a whole one).
    """

    noise_multiplier: float
    steps_per_epoch: int
    allocations: int
    epochs: int

    def _pld(self):
        return random_allocation.composed(self.noise_multiplier, self.steps_per_epoch, self.allocations, self.epochs)

    def epsilon(self, delta: float) -> float:
        """Epsilon at ``delta`` (dp-accounting's ``get_epsilon_for_delta``, vectorised), at ``delta`` less the FFT
        noise margin; cached on every field and ``delta``."""
        return _pld_epsilon(self, float(delta))

    def delta(self, eps: float) -> float:
        """Delta at ``eps`` (dp-accounting's ``get_delta_for_epsilon``, vectorised) plus the FFT noise margin, at
        most 1."""
        return min(sampled_gaussian_pld.delta_for_epsilon(self._pld(), float(eps)) + _margin(self), 1.0)


@dataclasses.dataclass(frozen=True)
class RandomAllocationReplaceOneProfile(RandomAllocationPldProfile):
    r"""The privacy profile of every iterate of a run with random allocation, replace-one:
    :math:`\delta(\varepsilon) \le \min_{\varepsilon_1} \delta_{rem}(\varepsilon_1) +
    e^{\varepsilon_1}\delta_{add}(\varepsilon - \varepsilon_1)`, the remove and add profiles of the same run
    (each with the FFT noise margin) joined through the run without the record
    (docs/derivations/random-allocation.md#ra-replace-one)."""

    def epsilon(self, delta: float) -> float:
        """The smallest epsilon (bisection, rounded up) whose :meth:`delta` is at most ``delta``; cached."""
        return _replace_one_epsilon(self, float(delta))

    def delta(self, eps: float) -> float:
        """The triangle's delta at ``eps``, at most 1."""
        remove, add = _replace_one_tables(self)
        return random_allocation.replace_one_delta(remove, add, float(eps))


@functools.lru_cache(maxsize=16)
def _replace_one_tables(
    profile: RandomAllocationReplaceOneProfile,
) -> tuple[random_allocation.DeltaTable, random_allocation.DeltaTable]:
    pld, margin = profile._pld(), _margin(profile)
    return random_allocation.delta_table(pld._pmf_remove, margin), random_allocation.delta_table(pld._pmf_add, margin)


@functools.lru_cache(maxsize=64)
def _replace_one_epsilon(profile: RandomAllocationReplaceOneProfile, delta: float) -> float:
    remove, add = _replace_one_tables(profile)
    return random_allocation.replace_one_epsilon(remove, add, delta)


def _allocation_fields(cfg: TrainingConfig) -> tuple[float, int, int, int]:
    """(z, t, k, epochs begun) of a random-allocation pipeline; noise above the module's MAX_NOISE is accounted as
    MAX_NOISE (a pair with more noise is a post-processing of the one with less: only larger)."""
    z = min(cfg.noise_multiplier, random_allocation.MAX_NOISE)
    return float(z), cfg.steps_per_epoch, cfg.allocations_per_epoch, cfg.epochs_started


@dataclasses.dataclass(frozen=True)
class SmallerProfile:
    """The smaller of two valid privacy profiles at every epsilon (each an upper bound on the same delta(eps), so
    their minimum is one too; its epsilon at delta is the smaller epsilon)."""

    first: PrivacyProfile
    second: PrivacyProfile

    def epsilon(self, delta: float) -> float:
        return min(self.first.epsilon(delta), self.second.epsilon(delta))

    def delta(self, eps: float) -> float:
        return min(self.first.delta(eps), self.second.delta(eps))


def _random_allocation_profile(cfg: TrainingConfig, *, replace_one: bool) -> PrivacyProfile:
    """The distribution's profile, and never above the Gaussian mechanism without amplification (both valid: the
    smaller at every epsilon); below the module's MIN_NOISE, or with more than MAX_GROUP_STEPS steps per allocation,
    that Gaussian alone (docs/derivations/random-allocation.md#ra-numerics)."""
    mu = random_allocation.unamplified_mu(
        cfg.noise_multiplier, cfg.allocations_per_epoch, cfg.epochs_started, replace_one=replace_one
    )
    gaussian = GaussianMixtureProfile.gaussian(mu if mu <= _MU_VACUOUS else math.inf)
    largest_group = -(-cfg.steps_per_epoch // cfg.allocations_per_epoch)
    if cfg.noise_multiplier < random_allocation.MIN_NOISE or largest_group > random_allocation.MAX_GROUP_STEPS:
        return gaussian
    kind = RandomAllocationReplaceOneProfile if replace_one else RandomAllocationPldProfile
    return SmallerProfile(kind(*_allocation_fields(cfg)), gaussian)


def random_allocation_pld_profile(cfg: TrainingConfig, a: LossAssumptions) -> PrivacyProfile:
    """The every-iterate profile of the pipeline's random allocation under add-or-remove."""
    return _random_allocation_profile(cfg, replace_one=False)


def random_allocation_replace_one_profile(cfg: TrainingConfig, a: LossAssumptions) -> PrivacyProfile:
    """The every-iterate profile of the pipeline's random allocation under replace-one."""
    return _random_allocation_profile(cfg, replace_one=True)
