r"""Random allocation (balls in bins): the privacy loss distribution of every iterate.

Every epoch, each example joins ``k`` of the epoch's ``t`` steps, chosen uniformly at random and
afresh every epoch (``k = 1``: balls in bins); the noise on the sum of clipped gradients is
:math:`\mathcal N(0, (zC)^2 I)`. In noise units one record moves one step's sum by at most
:math:`s = 1/z`.

* **One epoch, add-or-remove** (docs/derivations/random-allocation.md#ra-one-epoch): for every
  adaptive run, the release of an epoch is dominated, in each direction and at every epsilon, by
  the pair :math:`P_{t,k} = \binom{t}{k}^{-1}\sum_{|S| = k}\mathcal N(s 1_S, I_t)` against
  :math:`Q_t = \mathcal N(0, I_t)` (remove: :math:`(P, Q)`; add: :math:`(Q, P)`), and for
  ``k > 1`` by ``k`` such pairs of ``floor(t/k)`` or ``ceil(t/k)`` steps composed
  (#ra-k-of-t). The privacy loss distribution of one such pair is Feldman & Shenfeld's (2026, arXiv
  2602.17284), computed by their library ``PLD_accounting`` (MIT): :func:`allocation_pld`, its FFT
  route and pessimistic (``DOMINATES``) discretisation.
* **E epochs** (#ra-epochs): the allocations of the epochs are independent, and the direction is
  the same in every epoch (the record is in the larger dataset for the whole run), so the epochs
  compose as dominating pairs, each direction on its own: dp-accounting's ``self_compose`` of the
  one-epoch distribution (:func:`composed`), cached per epoch count.
* **Replace-one** (#ra-replace-one): the run on ``D`` against the run on ``D'`` through the run on
  ``D`` without the record: :math:`\delta(\varepsilon) \le \delta_{rem}(\varepsilon_1) +
  e^{\varepsilon_1}\delta_{add}(\varepsilon - \varepsilon_1)` for every :math:`\varepsilon_1`, the
  hockey-stick triangle inequality applied to the whole run (:func:`replace_one_delta`).

``allocation_lower_pld`` is ``PLD_accounting``'s optimistic (``IS_DOMINATED``) distribution: a
lower bound for the docs and the tests, never part of a reported number.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import Any, NamedTuple

import numpy as np

#: One allocation's loss interval (``PLD_accounting``'s ``loss_discretization``). The FFT route also uses it as the
#: grid step of each step's likelihood ratio, rounded up, so an allocation's loss is biased up by about
#: ``steps * interval / 2`` (docs/derivations/random-allocation.md#ra-numerics).
ONE_EPOCH_INTERVAL = 5e-5
#: At most this many grid points per step (``PLD_accounting``'s ``max_grid_fft`` is this times the steps): the
#: cost of one allocation is about proportional to it; where a step needs more, the grid is coarser (still pessimistic).
POINTS_PER_STEP = 120_000
#: The composed distribution holds at most about this many points (memory: about 50 bytes each while it is
#: composed); where it would hold more, the one-epoch interval is widened to fit.
MAX_COMPOSED_POINTS = 1_500_000
#: dp-accounting's tail truncation of the composition (pessimistic: the mass truncated counts as an infinite loss).
TAIL_MASS_TRUNCATION = 1e-15
#: The noise multipliers the distribution is computed for: below MIN_NOISE the loss spans more than the grid holds
#: (at z = 0.05 PLD_accounting fails; the number is vacuous anyway: epsilon > 100 after ten epochs at z = 0.5) and
#: the rows use the Gaussian mechanism without amplification (:func:`unamplified_mu`); noise above MAX_NOISE is
#: accounted as MAX_NOISE (a pair with more noise is a post-processing of the one with less: only larger).
MIN_NOISE = 0.5
MAX_NOISE = 1e4
#: At most this many steps per allocation: the library's grid per step shrinks as the steps grow (at 10^9 steps it
#: fails; from about 10^4 it is already looser than no amplification at z = 1); beyond, the rows use the Gaussian
#: mechanism without amplification (:func:`unamplified_mu`).
MAX_GROUP_STEPS = 10**6
#: PLD_accounting's tail budget of one allocation (its default; the mass cut counts as an infinite loss).
ONE_EPOCH_TAIL = 1e-12


def unamplified_mu(noise_multiplier: float, allocations: int, epochs: int, *, replace_one: bool) -> float:
    r"""mu of the run without amplification: every allocation puts the record in ``k`` steps of each epoch, each a
    Gaussian mechanism of shift ``s`` (add-or-remove) or ``2s`` (replace-one), so ``P_{t,k}`` is a mixture of laws at
    distance ``s sqrt(k)`` from ``Q_t`` and by joint convexity the run is :math:`\mu`-GDP with
    :math:`\mu = \sqrt{kE}/z` (add-or-remove) or :math:`2\sqrt{kE}/z` (replace-one)
    (docs/derivations/random-allocation.md#ra-numerics)."""
    return (2.0 if replace_one else 1.0) * math.sqrt(float(allocations) * float(epochs)) / float(noise_multiplier)


def _pld_accounting() -> Any:
    """PLD_accounting, imported quietly: without numba it warns (ImportWarning) that it falls back on numpy."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import PLD_accounting

    return PLD_accounting


def _allocation_pld(noise_multiplier: float, steps: int, interval: float, *, upper: bool):
    lib = _pld_accounting()
    params = lib.PrivacyParams(sigma=float(noise_multiplier), num_steps=int(steps), num_selected=1, num_epochs=1)
    if upper:
        config = lib.AllocationSchemeConfig(
            loss_discretization=float(interval),
            tail_truncation=ONE_EPOCH_TAIL,
            convolution_method=lib.ConvolutionMethod.FFT,
            max_grid_fft=POINTS_PER_STEP * int(steps),
        )
        bound = lib.BoundType.DOMINATES
    else:  # the optimistic distribution needs the geometric route (its FFT route only rounds up)
        config = lib.AllocationSchemeConfig(
            loss_discretization=float(interval),
            tail_truncation=ONE_EPOCH_TAIL,
            convolution_method=lib.ConvolutionMethod.GEOM,
        )
        bound = lib.BoundType.IS_DOMINATED
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PLD_accounting's notes on its own grids; the numbers are unaffected
        return lib.gaussian_allocation_pld(params=params, config=config, bound_type=bound)


@functools.lru_cache(maxsize=32)
def allocation_pld(noise_multiplier: float, steps: int, interval: float = ONE_EPOCH_INTERVAL):
    r"""The pessimistic privacy loss distribution of one allocation of a record to one of ``steps`` steps (a
    dp-accounting ``PrivacyLossDistribution``: the remove and add PMFs), cached on every input.

    ``PLD_accounting.gaussian_allocation_pld`` (Feldman & Shenfeld 2026, arXiv 2602.17284) with ``sigma = z``,
    ``num_steps = steps``, ``num_selected = 1``, one epoch, the FFT route and ``BoundType.DOMINATES``, at most
    POINTS_PER_STEP grid points per step. It refuses ``steps = 1``.
    """
    return _allocation_pld(noise_multiplier, steps, interval, upper=True)


def allocation_lower_pld(noise_multiplier: float, steps: int, interval: float = 0.01):
    """The optimistic distribution of one allocation (``BoundType.IS_DOMINATED``, the geometric route): dominated by
    the exact pair, so its composition is a lower bound on the exact epsilon (docs and tests only; seconds per call)."""
    return _allocation_pld(noise_multiplier, steps, interval, upper=False)


def groups(steps_per_epoch: int, allocations: int, epochs: int) -> tuple[tuple[int, int], ...]:
    """The allocations of one step the run is dominated by (docs/derivations/random-allocation.md#ra-k-of-t): pairs
    (steps of the group, how many such groups in the run): ``E (k - r)`` groups of ``floor(t/k)`` steps and ``E r``
    of ``floor(t/k) + 1``, ``r = t mod k``."""
    size, extra = divmod(int(steps_per_epoch), int(allocations))
    out = ((size, int(epochs) * (int(allocations) - extra)), (size + 1, int(epochs) * extra))
    return tuple((steps, count) for steps, count in out if count > 0)


def _composed_points(pld, count: int) -> int:
    """How many points dp-accounting's composition of ``pld`` ``count`` times would hold (its own truncation bounds)."""
    from dp_accounting.pld import common

    if count == 1:
        return max(pmf._probs.size for pmf in (pld._pmf_remove, pld._pmf_add))
    size = 0
    for pmf in (pld._pmf_remove, pld._pmf_add):
        lower, upper = common.compute_self_convolve_bounds(pmf._probs, int(count), TAIL_MASS_TRUNCATION)
        size = max(size, upper - lower + 1)
    return size


def run_interval(noise_multiplier: float, parts: tuple[tuple[int, int], ...]) -> float:
    """The interval of a run's composition: ONE_EPOCH_INTERVAL, or a multiple of it where the composed distribution
    would otherwise hold more than MAX_COMPOSED_POINTS points (long runs)."""
    points = sum(
        _composed_points(allocation_pld(noise_multiplier, steps, ONE_EPOCH_INTERVAL), count) for steps, count in parts
    )
    return ONE_EPOCH_INTERVAL * max(1, math.ceil(points / MAX_COMPOSED_POINTS))


@functools.lru_cache(maxsize=16)
def composed(noise_multiplier: float, steps_per_epoch: int, allocations: int, epochs: int):
    r"""The privacy loss distribution of ``epochs`` epochs of random allocation (k of t steps), cached on every input:
    the allocations of :func:`groups` composed by dp-accounting (remove and add PMFs, each on its own, with its
    pessimistic tail truncation)."""
    parts = groups(steps_per_epoch, allocations, epochs)
    interval = run_interval(noise_multiplier, parts)
    composed_parts = [
        pld if count == 1 else pld.self_compose(count, tail_mass_truncation=TAIL_MASS_TRUNCATION)
        for pld, count in ((allocation_pld(noise_multiplier, steps, interval), count) for steps, count in parts)
    ]
    result = composed_parts[0]
    for part in composed_parts[1:]:
        result = result.compose(part, tail_mass_truncation=TAIL_MASS_TRUNCATION)
    return result


# ---------------------------------------------------------------- replace-one: the triangle through the run without x


class DeltaTable(NamedTuple):
    """One PMF's hockey-stick divergence at every point of its grid: ``delta[i] >= delta(losses[i])``.

    ``below`` bounds delta below the first point (1, the largest a hockey-stick divergence of probability
    laws can be); ``infinity_mass`` is delta beyond the last one.
    """

    first: int  # the grid index of losses[0] (losses are integers times the interval)
    interval: float
    delta: np.ndarray
    infinity_mass: float

    def at(self, eps: np.ndarray) -> np.ndarray:
        """An upper bound on delta at every epsilon of ``eps``: delta is non-increasing, so the value at the grid
        point at or below each epsilon (a quotient rounded down by floating point picks a lower point: larger)."""
        index = np.floor(np.asarray(eps, dtype=float) / self.interval).astype(np.int64) - self.first
        out = np.where(index < 0, 1.0, self.infinity_mass)
        inside = (index >= 0) & (index < self.delta.size)
        out[inside] = self.delta[index[inside]]
        return out


#: Relative safety factor on every tabulated delta: covers the rounding of the O(N) recursion below.
_TABLE_ROUNDING = 1e-9


def _decaying_tail_sums(values: np.ndarray, h: float) -> np.ndarray:
    r""":math:`y_j = \sum_{m \ge j} x_m e^{-h (m - j)}` for non-negative x: sums of non-negative terms (no
    cancellation), in blocks short enough that no weight underflows (within a block the weights are at least
    :math:`e^{-50}`)."""
    out = np.empty_like(values)
    block = max(1, int(50.0 / h))
    carry = 0.0  # y at the first index after the block
    for stop in range(values.size, 0, -block):
        start = max(0, stop - block)
        weights = np.exp(-h * np.arange(stop - start))  # e^{-h (m - start)}
        sums = np.cumsum((values[start:stop] * weights)[::-1])[
            ::-1
        ]  # sum over m >= j in the block, times e^{-h(j-start)}
        out[start:stop] = sums / weights + carry * np.exp(-h * np.arange(stop - start, 0, -1))
        carry = out[start]
    return out


def delta_table(pmf, margin: float) -> DeltaTable:
    r"""The hockey-stick divergence of a dense dp-accounting PMF at every loss of its grid, plus ``margin`` (the
    FFT noise margin of the composition, docs/derivations/baselines.md#fft-noise-margin).

    With losses :math:`l_i = (f + i)h` and probabilities :math:`p_i` (FFT noise below 0 taken as 0),
    :math:`D_k = \sum_{i > k} p_i (1 - e^{l_k - l_i}) = (1 - e^{-h}) \sum_{m \ge k} T_m e^{-h(m - k)}` with
    :math:`T_m = \sum_{i > m} p_i` (the recursion :math:`D_{k-1} = e^{-h} D_k + (1 - e^{-h}) T_{k-1}` unrolled): sums of
    non-negative terms, no cancellation; :math:`\delta(l_k) = m_\infty + D_k`.
    """
    probs = np.maximum(np.asarray(pmf._probs, dtype=float), 0.0)
    h = float(pmf._discretization)
    tail = np.concatenate((np.cumsum(probs[::-1])[::-1][1:], [0.0]))  # T_m = sum_{i > m} p_i
    d = -math.expm1(-h) * _decaying_tail_sums(tail, h)
    delta = (float(pmf._infinity_mass) + d) * (1.0 + _TABLE_ROUNDING) + margin
    return DeltaTable(int(pmf._lower_loss), h, np.minimum(delta, 1.0), min(1.0, float(pmf._infinity_mass) + margin))


def _through(first: DeltaTable, second: DeltaTable, eps: float) -> float:
    r""":math:`\min_{\varepsilon_1} \delta_1(\varepsilon_1) + e^{\varepsilon_1}\delta_2(\varepsilon - \varepsilon_1)`
    over the losses of the first table's grid where its delta is below 1."""
    useful = first.delta < 1.0
    if not useful.any():
        return 1.0
    losses = (first.first + np.flatnonzero(useful)) * first.interval
    with np.errstate(over="ignore"):
        total = first.delta[useful] + np.exp(losses) * second.at(eps - losses)
    return float(min(1.0, np.min(total)))


def replace_one_delta(remove: DeltaTable, add: DeltaTable, eps: float) -> float:
    r"""The triangle through the run without the record (docs/derivations/random-allocation.md#ra-replace-one):
    :math:`\min_{\varepsilon_1} \delta_{rem}(\varepsilon_1) + e^{\varepsilon_1}
    \delta_{add}(\varepsilon - \varepsilon_1)`, or the same through the run with both records,
    :math:`\delta_{add}(\varepsilon_1) + e^{\varepsilon_1} \delta_{rem}(\varepsilon - \varepsilon_1)`, whichever is
    smaller; :math:`\varepsilon_1` over the grid's losses (every one gives a valid bound, the grid only decides how
    close to the best it gets). At most 1."""
    return min(_through(remove, add, eps), _through(add, remove, eps))


def replace_one_epsilon(remove: DeltaTable, add: DeltaTable, delta: float) -> float:
    """The smallest epsilon (bisection, to a relative 1e-10, rounded up) with :func:`replace_one_delta` at most
    ``delta``; inf where none is."""
    if replace_one_delta(remove, add, 1e4) > delta:
        return math.inf
    lo, hi = 0.0, 1.0
    if replace_one_delta(remove, add, 0.0) <= delta:
        return 0.0
    while replace_one_delta(remove, add, hi) > delta:
        lo, hi = hi, 2.0 * hi
    while hi - lo > 1e-10 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if replace_one_delta(remove, add, mid) > delta else (lo, mid)
    return hi
