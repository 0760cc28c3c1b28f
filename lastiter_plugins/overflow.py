r"""Random allocation with every batch cut at ``L = max_batch_size`` examples (a host that pads every batch to
``L`` rows so that it divides every step by the same number): the probability that some step's batch exceeds
``L``, and what it adds to every row's delta (docs/derivations/fixed-length-batches.md).

* :func:`overflow_probability` ``p``: at most ``T * P[Binomial(n + 1, k/t) > L]`` for both datasets of any
  neighbouring pair (part 3);
* the run with the cut is ``(eps, d + (1 + e^eps) p)``-DP wherever the run without it is ``(eps, d)``-DP
  (Lemma C, part 2): :class:`CutProfile` is that profile, :func:`cut_epsilon` its inverse (part 4);
* :func:`padded_batch_size`: the smallest ``L`` whose ``p`` meets a target.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from scipy import stats

from lastiter_plugins.config import TrainingConfig, check_count

#: the overflow probability a padding pipeline aims at by default (the Keras adapter's RandomAllocationDataset)
DEFAULT_OVERFLOW = 1e-9
#: iterations of :func:`cut_epsilon`'s search before it answers inf (valid, vacuous)
_ITERATIONS = 100
#: the relative margin added at each iteration, so that the search stops at a solution of (F)
_MARGIN = 1e-9


def _tail(dataset_size: int, steps_per_epoch: int, allocations_per_epoch: int, length: int) -> float:
    """P[Binomial(n + 1, k/t) > L]: one step's batch above ``length`` in the larger dataset of a pair."""
    q = min(1.0, allocations_per_epoch / steps_per_epoch)
    return float(stats.binom.sf(length, dataset_size + 1, q))


def overflow_probability(config: TrainingConfig) -> float:
    """p = min(1, T * P[Binomial(n + 1, k/t) > L]): a bound on the probability that some step of the run over
    either dataset of a neighbouring pair has a batch above ``config.max_batch_size`` (0 without one)."""
    if config.max_batch_size is None:
        return 0.0
    tail = _tail(config.dataset_size, config.steps_per_epoch, config.allocations_per_epoch, config.max_batch_size)
    return min(1.0, config.steps * tail)


def padded_batch_size(
    dataset_size: int, batch_size: int, allocations_per_epoch: int, steps: int, overflow: float
) -> int:
    """The smallest L whose overflow probability over ``steps`` steps of random allocation (n examples,
    t = ceil(n k / b) steps an epoch) is at most ``overflow`` (in (0, 1)); at most n + 1, where it is 0."""
    n = check_count("dataset_size", dataset_size, 1)
    b = check_count("batch_size", batch_size, 1)
    k = check_count("allocations_per_epoch", allocations_per_epoch, 1)
    steps = check_count("steps", steps, 1)
    if not (isinstance(overflow, (int, float)) and 0.0 < overflow < 1.0):
        raise ValueError(f"overflow must be a number in (0, 1). Found {overflow!r}.")
    t = -(-n * k // b)
    low, high = 0, n + 1  # p(high) = 0 <= overflow; find the smallest L meeting it
    while low < high:
        mid = (low + high) // 2
        if steps * _tail(n, t, k, mid) <= overflow:
            high = mid
        else:
            low = mid + 1
    return high


def cut_epsilon(epsilon_at: Callable[[float], float], delta: float, p: float) -> float:
    """The smallest epsilon found with ``epsilon >= epsilon_at(delta - (1 + e^epsilon) p)`` (condition (F),
    docs/derivations/fixed-length-batches.md#fl-conversion), where ``epsilon_at(d)`` is a valid epsilon at ``d`` of
    the run without the cut; the value returned satisfied (F) when evaluated; inf when none is found."""
    if p == 0.0:
        return float(epsilon_at(delta))
    eps = 0.0
    for _ in range(_ITERATIONS):
        room = delta - added_delta(eps, p)
        if room <= 0.0 or not math.isfinite(eps):
            return math.inf
        needed = float(epsilon_at(room))
        if needed <= eps:
            return eps
        eps = needed * (1.0 + _MARGIN) + _MARGIN
    return math.inf


def cut_delta(uncut_delta: float, eps: float, p: float) -> float:
    """min(1, d + (1 + e^eps) p): the delta at ``eps`` of the run with cut batches, from the run without the cut
    (its delta ``uncut_delta`` at ``eps``) and the overflow probability ``p`` (Lemma C)."""
    if p == 0.0:
        return uncut_delta
    return min(1.0, uncut_delta + added_delta(eps, p))


def added_delta(eps: float, p: float) -> float:
    """(1 + e^eps) p, what Lemma C adds to delta at ``eps``: formed as p + e^(eps + log p), so that a large ``eps``
    meets a tiny ``p`` exactly (no cap on e^eps); inf where it overflows or ``eps`` is not finite."""
    if p == 0.0:
        return 0.0
    log_term = eps + math.log(p)
    if not log_term <= 700.0:  # also NaN
        return math.inf
    return p + math.exp(log_term)


@dataclasses.dataclass(frozen=True)
class CutProfile:
    """The privacy profile of the run with cut batches, from the run without the cut (its ``epsilon_at`` and
    ``delta_at``) and the overflow probability ``p``: delta(eps) = min(1, delta_at(eps) + (1 + e^eps) p)."""

    epsilon_at: Callable[[float], float]
    delta_at: Callable[[float], float]
    p: float

    def delta(self, eps: float) -> float:
        return cut_delta(float(self.delta_at(eps)), eps, self.p)

    def epsilon(self, delta: float) -> float:
        return cut_epsilon(self.epsilon_at, delta, self.p)
