r"""Mixtures against a law that does not mix: the dominating pair :math:`(\sum_j w_j N(\mu_j, 1), N(0, 1))`.

docs/derivations/poisson-amplification.md#amplification. When only ONE of the two released laws is a mixture,
:math:`P = \sum_u w_u P_u` against a single :math:`Q` (Poisson sampling under add-or-remove:
the world without the record has no membership to mix), and each pair is
:math:`\mu_u`-GDP, :math:`T(P_u, Q) \ge G_{\mu_u}`, then for every test the type II error of P
is the w-average of those of the :math:`P_u` at the same type I error under Q, so

.. math:: T(P, Q) \ge \sum_u w_u G_{\mu_u} = T\Big(\sum_u w_u \mathcal N(\mu_u, 1), \mathcal N(0, 1)\Big),

the equality because the likelihood ratio of the one-dimensional mixture against
:math:`\mathcal N(0,1)` is non-decreasing (every :math:`\mu_u \ge 0`): all the components share
their optimal tests. By Blackwell's theorem (Dong, Roth & Su 2019, Thm 2.10) (P, Q) is a
post-processing of that pair, so both hockey-stick divergences are at most the pair's, which
keeps the amplification by subsampling that the joint-convexity bound
:math:`\sum_u w_u \delta_{\mu_u}(\varepsilon)` loses.

:class:`DominatingMixtureProfile` computes
:math:`\delta(\varepsilon) = \max(H_{e^\varepsilon}(M\|N_0), H_{e^\varepsilon}(N_0\|M))` for
:math:`M = \sum_j w_j \mathcal N(\mu_j, 1)` (a component with :math:`\mu = \infty` is an atom
that every test detects), rounded up: each divergence is a threshold test's value at a point
of a certified bracket of the likelihood-ratio crossing, plus a bound on what the bracket's
width can hide, with a relative margin for the floating-point sums.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import numpy as np
from scipy import optimize, special

from lastiter_plugins import profiles
from lastiter_plugins.bounds import membership_mixtures
from lastiter_plugins.bounds.shifted_interpolation import replace_one_step_mu
from lastiter_plugins.config import LossAssumptions, TrainingConfig

__all__ = ["DominatingMixtureProfile", "best_over_events", "poisson_profile"]

#: Relative error allowed for every computed normal tail and every sum of them (scipy's log_ndtr is
#: accurate to a few ulps; a sum of K terms adds K ulps at most: 1e-12 covers 4096 components 200x).
_RELATIVE = 1e-12
#: The likelihood-ratio crossing is bracketed by points whose log ratio is this far from the target
#: (far above the rounding of a log-sum-exp of a few thousand terms, ~1e-13 times its size).
_LOG_MARGIN = 1e-9
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
#: No crossing within this many standard deviations: the divergence is bounded by 1 (a crossing within
#: 1e-9 of the ratio's limit, e.g. at eps = 0 with almost all mass at mu = 0).
_FAR = 1e8
#: Divergences at larger epsilons are computed at this one (an upper bound: they decrease in epsilon).
_LARGEST_EPS = 700.0


def _log_sum_exp(values: np.ndarray, extra: float) -> float:
    """log(sum(exp(values)) + exp(extra)), without overflow."""
    top = max(float(values.max()) if values.size else -math.inf, extra)
    if top == -math.inf:
        return -math.inf
    return top + math.log(float(np.exp(values - top).sum()) + math.exp(extra - top))


class _NoBracket(Exception):
    """The likelihood ratio does not cross the target by a certified margin within +-_FAR."""


@dataclasses.dataclass(frozen=True)
class DominatingMixtureProfile:
    r"""The privacy profile of the pair :math:`(M, L)`, :math:`M = \sum_j w_j N(\mu_j, 1)`, in both
    directions: :math:`L = N(0, 1)` (add-or-remove, docs/derivations/poisson-amplification.md#pa-add-or-remove) or,
    ``reflected``,
    :math:`L = \sum_j w_j N(-\mu_j, 1)` (replace-one through the absent record, part 3; symmetric).

    Attributes:
      weights: w_j >= 0 summing to 1 (up to rounding).
      mus: mu_j >= 0, ``inf`` allowed (an atom every test detects).
      reflected: the second law is M reflected, not N(0, 1).
      event_mass: p, the probability bound of an event of the other records' memberships outside which
        the pair is not claimed (docs/derivations/random-batch.md#rb-poisson-batch-sizes): the profile is (1 - p)
        delta_pair + p.
    """

    weights: tuple[float, ...]
    mus: tuple[float, ...]
    reflected: bool = False
    event_mass: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.event_mass <= 1.0:
            raise ValueError(f"event_mass must be in [0, 1]. Found {self.event_mass}.")

    @classmethod
    def of(cls, weights, mus, *, reflected: bool = False, event_mass: float = 0.0) -> DominatingMixtureProfile:
        """From arrays; equal mus merged, and more than 4096 distinct ones rounded UP onto a geometric
        grid (:func:`lastiter_plugins.profiles._merge_components`): every divergence of the pair grows
        with each mu (docs/derivations/poisson-amplification.md#amplification), so the profile only grows."""
        w, m = profiles._validate_mixture(weights, mus)
        w, m = profiles._merge_components(w, m)
        return cls(tuple(w.tolist()), tuple(m.tolist()), bool(reflected), float(event_mass))

    @functools.cached_property
    def _parts(self):
        w = np.asarray(self.weights, dtype=float)
        m = np.asarray(self.mus, dtype=float)
        inf = float(w[np.isinf(m)].sum())
        zero = float(w[m == 0.0].sum())
        pos = np.isfinite(m) & (m > 0.0) & (w > 0.0)
        return inf, zero, np.log(w[pos]), m[pos]

    @property
    def max_mu(self) -> float:
        return max(self.mus)

    @functools.cached_property
    def _exponents(self) -> tuple[np.ndarray, float]:
        """log w_j - mu_j^2 / 2 of the components with 0 < mu < inf, and log of the weight at mu = 0."""
        _, zero, log_w, mp = self._parts
        return log_w - 0.5 * mp * mp, (math.log(zero) if zero > 0.0 else -math.inf)

    def _log_ratio(self, x: float) -> float:
        """log of the likelihood ratio of M's finite part against L at x (non-decreasing in x)."""
        mp = self._parts[3]
        base, log_zero = self._exponents
        up = _log_sum_exp(base + mp * x, log_zero)
        if not self.reflected:
            return up
        return up - _log_sum_exp(base - mp * x, log_zero)

    def _margin(self, x: float) -> float:
        """A bound on the rounding of the computed log ratio at x, with room: _LOG_MARGIN times the size
        of the largest exponent summed (log-sum-exp rounds by about 1e-13 of it)."""
        top = float(self._parts[3].max()) if self._parts[3].size else 0.0
        return _LOG_MARGIN * (1.0 + top * abs(x) + 0.5 * top * top)

    def _bracket(self, log_target: float) -> tuple[float, float]:
        """(t1, t2) with log ratio <= target - margin at t1 and >= target + margin at t2: the crossing
        lies in [t1, t2]. The caller ensures that the crossing exists."""

        def below(x: float) -> bool:
            return self._log_ratio(x) <= log_target - self._margin(x)

        def above(x: float) -> bool:
            return self._log_ratio(x) >= log_target + self._margin(x)

        lo, hi = -1.0, 1.0
        while not below(lo):
            lo *= 2.0
            if lo < -_FAR:
                raise _NoBracket
        while not above(hi):
            hi *= 2.0
            if hi > _FAR:
                raise _NoBracket
        t = optimize.brentq(lambda x: self._log_ratio(x) - log_target, lo, hi, xtol=1e-14, rtol=1e-15)
        t1, t2, step = t, t, max(abs(t) * 1e-13, 1e-13)
        while not below(t1):
            t1 -= step
            step *= 2.0
        step = max(abs(t) * 1e-13, 1e-13)
        while not above(t2):
            t2 += step
            step *= 2.0
        return t1, t2

    def _max_second_density(self, t1: float, t2: float) -> float:
        """An upper bound on L's density on [t1, t2]: each component's density at its distance to the interval."""
        if not self.reflected:
            means, log_w = np.zeros(1), np.zeros(1)
        else:
            _, zero, log_w, mp = self._parts
            means = np.append(-mp, 0.0)
            log_w = np.append(log_w, math.log(zero) if zero > 0.0 else -math.inf)
        gap = np.maximum(np.maximum(t1 - means, means - t2), 0.0)
        return float(np.exp(log_w - 0.5 * gap * gap).sum()) * _INV_SQRT_2PI * (1.0 + _RELATIVE)

    def _forward(self, eps: float) -> float:
        r""":math:`H_{e^\varepsilon}(M \| L)`, rounded up."""
        inf, zero, log_w, mp = self._parts
        eps = min(eps, _LARGEST_EPS)  # a smaller gamma only raises the divergence
        gamma = math.exp(eps)
        if mp.size == 0:  # M's finite part is zero * N(0, 1); L is N(0, 1) (or the same mixture)
            return min(1.0, inf + max(zero - gamma * (1.0 if not self.reflected else zero), 0.0))
        t1, t2 = self._bracket(eps)
        # the test {x > t2} (t2 >= the crossing): M(x > t2) - gamma L(x > t2), the mu = 0 parts combined
        a = float(np.exp(log_w + special.log_ndtr(mp - t2)).sum())
        if self.reflected:
            b = gamma * float(np.exp(log_w + special.log_ndtr(-mp - t2)).sum())
            zero_part = (1.0 - gamma) * zero * float(special.ndtr(-t2))
        else:
            b = (gamma - zero) * float(special.ndtr(-t2))
            zero_part = 0.0
        f = a * (1.0 + _RELATIVE) - b * (1.0 - _RELATIVE) + zero_part * (1.0 - _RELATIVE)
        # what the bracket can hide: int_{t*}^{t2} m <= (t2 - t1) ratio(t2) max_{[t1, t2]} l
        try:
            hidden = (t2 - t1) * math.exp(self._log_ratio(t2) + self._margin(t2)) * self._max_second_density(t1, t2)
        except OverflowError:  # mus of 1e6 and more: a margin too wide to use (the cap of _pair_delta applies)
            hidden = math.inf
        return min(1.0, max(f, 0.0) + hidden + inf)

    def _backward(self, eps: float) -> float:
        r""":math:`H_{e^\varepsilon}(N_0 \| M)` (add-or-remove), rounded up (M's atom at infinity never helps N_0)."""
        _, zero, log_w, mp = self._parts
        eps = min(eps, _LARGEST_EPS)  # a smaller gamma only raises the divergence
        gamma = math.exp(eps)
        if zero * gamma >= 1.0:  # the ratio never drops below 1/gamma: N_0 <= gamma M everywhere
            return 0.0
        if mp.size == 0:
            return 1.0 - zero * gamma
        t1, t2 = self._bracket(-eps)
        # the test {x < t1} (t1 <= the crossing): (1 - gamma zero) Phi(t1) - gamma sum_{mu>0} w Phi(t1 - mu)
        a = (1.0 - gamma * zero) * float(special.ndtr(t1))
        b = gamma * float(np.exp(log_w + special.log_ndtr(t1 - mp)).sum())
        f = a * (1.0 + _RELATIVE) - b * (1.0 - _RELATIVE)
        hidden = (t2 - t1) * self._max_second_density(t1, t2)  # int_{t1}^{t*} phi
        return min(1.0, max(f, 0.0) + hidden)

    @functools.cached_property
    def _joint_convexity(self) -> profiles.GaussianMixtureProfile:
        """docs/derivations/random-batch.md#random-batch-poisson's bound on the same pair, sum_j w_j delta_{mu_j}
        (delta_{2 mu_j} reflected): also valid
        (joint convexity), never smaller in exact arithmetic; used where the crossing cannot be certified
        (mus of 1e-200 or 1e100, a ratio within rounding of the target) and as a cap."""
        scale = 2.0 if self.reflected else 1.0
        with np.errstate(over="ignore"):
            mus = np.asarray(self.mus, dtype=float) * scale
        return profiles.GaussianMixtureProfile.mixture(self.weights, mus)

    def _pair_delta(self, eps: float) -> float:
        cap = self._joint_convexity.delta(eps)
        if math.isinf(eps):
            return min(cap, self._parts[0])
        try:
            if self.reflected:  # H(M~||M) = H(M||M~) (x -> -x)
                return min(cap, self._forward(eps))
            return min(cap, max(self._forward(eps), self._backward(eps)))
        except _NoBracket:
            return cap

    def delta(self, eps: float) -> float:
        """delta(eps), both directions, rounded up: (1 - p) times the pair's, plus p."""
        eps = float(eps)
        if eps < 0.0 or math.isnan(eps):
            raise ValueError(f"eps must be >= 0. Found {eps}.")
        p = self.event_mass
        return min(1.0, (1.0 - p) * self._pair_delta(eps) * (1.0 + _RELATIVE) + p)

    @functools.cached_property
    def _epsilons(self) -> dict[float, float]:
        return {}

    def epsilon(self, delta: float) -> float:
        """Smallest eps with delta(eps) <= delta (re-checked at the returned value); remembered per delta
        (the Poisson rows choose their event at REFERENCE_DELTA, the delta most often asked)."""
        delta = float(delta)
        if delta not in self._epsilons:
            self._epsilons[delta] = self._epsilon(delta)
        return self._epsilons[delta]

    def _epsilon(self, delta: float) -> float:
        if delta < self.delta(math.inf):
            return math.inf

        def log_delta(eps: float) -> float:
            d = self.delta(eps)
            return math.log(d) if d > 0.0 else -math.inf

        finite = [m for m in self.mus if math.isfinite(m)]
        mu_max = 2.0 * max(finite) if finite else 1.0
        scale = mu_max * mu_max / 2.0 + mu_max * (math.sqrt(2.0 * max(-math.log(max(delta, 1e-300)), 1.0)) + 1.0)
        return profiles._solve_epsilon(log_delta, float(delta), max(scale, 1e-3))


def best_over_events(
    events, mixture_for: Callable[[float], tuple[np.ndarray, np.ndarray]], *, reflected: bool
) -> DominatingMixtureProfile:
    """The pair (M, N(0,1)) (add-or-remove) or (M, M reflected) (replace-one) of the mixture
    ``mixture_for(c)`` (weights, mus) under each (contraction c, event probability) pair of a batch-size
    event (:func:`membership_mixtures.batch_size_events`); the best at REFERENCE_DELTA (each is valid).

    Raises:
      ValueError: no event (no batch-size range keeps the step non-expansive, c <= 1).
    """
    if not events:
        raise ValueError("no range of batch sizes around the expected one keeps the step non-expansive (c <= 1).")
    candidates = []
    for c, mass in events:
        weights, mus = mixture_for(c)
        candidates.append(DominatingMixtureProfile.of(weights, mus, reflected=reflected, event_mass=mass))
    if len(candidates) == 1:
        return candidates[0]
    return min(candidates, key=lambda p: p.epsilon(membership_mixtures.REFERENCE_DELTA))


def poisson_profile(
    *, step_mu: float, sampling_probability: float, steps: int, events, reflected: bool
) -> DominatingMixtureProfile:
    """Poisson sampling (docs/derivations/poisson-amplification.md#pa-add-or-remove and #pa-replace-one-pivot): the
    per-pattern mixture of
    :func:`membership_mixtures.membership_profile` (``step_mu`` = 1/z: each pattern against the run
    without the record) under each (contraction, event probability) pair of
    :func:`membership_mixtures.poisson_size_events`, as the pair (M, N(0,1)) (add-or-remove) or (M, M
    reflected) (replace-one); the best at REFERENCE_DELTA (each is valid).

    Raises:
      ValueError: no event (no batch-size range keeps the step non-expansive, c <= 1).
    """

    def mixture_for(c: float) -> tuple[np.ndarray, np.ndarray]:
        mixture = membership_mixtures.membership_profile(
            step_mu=step_mu, contraction=c, use_probability=sampling_probability, steps=steps
        )
        return np.asarray(mixture.weights), np.asarray(mixture.mus)

    return best_over_events(events, mixture_for, reflected=reflected)


# ---------------------------------------------------------------- glue: DP-SGD hyperparameters -> the paper's symbols


def poisson_allocation(cfg: TrainingConfig, a: LossAssumptions, *, reflected: bool) -> DominatingMixtureProfile:
    """Poisson sampling: the additive allocation's law as the pair (M, N(0, 1)) (add-or-remove) or (M, M
    reflected) (replace-one). The rows ``shifted-interpolation-poisson`` and ``-poisson-replace-one`` take
    the smaller of this and the majorant's profile (:mod:`lastiter_plugins.bounds.concave_majorant`)."""
    # each pattern's run against the run without the record: shift C per use (the divisor b is fixed);
    # the patterns mixed against that one law (add-or-remove), or through it (replace-one):
    # docs/derivations/poisson-amplification.md#amplification
    return poisson_profile(
        step_mu=replace_one_step_mu(cfg.noise_multiplier) / 2.0,
        sampling_probability=cfg.sampling_probability,
        steps=cfg.steps,
        events=list(membership_mixtures.poisson_events(cfg, a)),
        reflected=reflected,
    )
