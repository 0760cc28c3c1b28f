r"""Random allocation in the hosts' terms: drawing one epoch's allocation, and checking a run's batches against
the scheme. Shared by the host adapters; it imports no host library.

The scheme (``sampling="random_allocation"``, docs/sampling.md): every epoch, each of the n examples joins
k of the epoch's ``t = ceil(n k / b)`` steps, chosen uniformly at random among the k-subsets of the t steps,
independently of the other examples and afresh every epoch (k = 1: balls in bins). A step's batch is every
example allocated to it (its size varies, it may be empty); b is the fixed number the clipped sum is divided
by (docs/derivations/random-allocation.md).

:func:`allocate` draws one epoch; :class:`AllocationRecord` checks the batches a run's steps used against
the scheme, step by step (docs/derivations/opacus-adapter.md#random-allocation-monitor):

* an epoch is one allocation: its t batches, in the order drawn, each used by one step, and a new
  allocation starts only where the accounted epochs start (after a multiple of t steps): a loop that skips
  a batch (an empty one, say), breaks off an epoch or resumes mid-epoch runs allocations the accounting does
  not count;
* within an epoch each example is in at most k batches, and a completed epoch holds every example exactly
  k times (n k indices);
* a fresh allocation every epoch: an epoch equal to an earlier one (a generator re-seeded with the same seed
  every epoch: fixed bins, jax_privacy's ``BallsInBinsSampling`` over several cycles) is refused once a
  fresh draw would repeat it with probability below 2^-EVIDENCE_BITS, and always when complete.

Equality with earlier epochs is tested on 64-bit hashes of the batches' index tuples: a collision can only
refuse a genuine run, never accept a wrong one.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np

from lastiter_plugins.adapters._derivation import EVIDENCE_BITS, DrawnBatch

#: rows of the (examples x steps) random keys drawn at once for k > 1 (bounds the memory of a draw)
_CHUNK = 1 << 22


def count(name: str, value: Any, low: int) -> int:
    """``value`` as an int when it is an integer (not a bool) >= ``low``; else ValueError naming ``name``, the
    constraint and the value (the samplers' arguments)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or int(value) < low:
        raise ValueError(f"{name} must be an integer >= {low}. Found {value!r}.")
    return int(value)


def steps_per_epoch(dataset_size: int, batch_size: int, allocations_per_epoch: int) -> int:
    """t = ceil(n k / b), the core's steps of an epoch (``TrainingConfig.steps_per_epoch``)."""
    return -(-dataset_size * allocations_per_epoch // batch_size)


def allocate(dataset_size: int, steps: int, allocations_per_epoch: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch of random allocation: the ``steps`` batches (sorted index arrays, some possibly empty) when
    each of ``dataset_size`` examples joins ``allocations_per_epoch`` distinct steps chosen uniformly at random
    (each k-subset of the steps equally likely), independently of the others, from ``rng``."""
    n, t, k = int(dataset_size), int(steps), int(allocations_per_epoch)
    if k == 1:
        chosen = rng.integers(t, size=n)
        examples = np.arange(n)
    elif k == t:  # every example in every step
        chosen = np.tile(np.arange(t), n)
        examples = np.repeat(np.arange(n), k)
    else:  # the k smallest of t i.i.d. uniform keys: a uniformly random k-subset
        rows = max(1, _CHUNK // t)
        parts = [np.argsort(rng.random((min(rows, n - i), t)), axis=1)[:, :k] for i in range(0, n, rows)]
        chosen = np.concatenate(parts).ravel()
        examples = np.repeat(np.arange(n), k)
    order = np.argsort(chosen, kind="stable")  # by step, then by example
    counts = np.bincount(chosen, minlength=t)
    return np.split(examples[order], np.cumsum(counts)[:-1])


class AllocationRecord:
    """The batches the steps of a run used, against random allocation with n examples, t steps an epoch and k
    allocations per example (see the module's docstring).

    Args:
      dataset_size: n.
      steps_per_epoch: t.
      allocations_per_epoch: k.
    """

    def __init__(self, dataset_size: int, steps_per_epoch: int, allocations_per_epoch: int) -> None:
        self.n, self.t, self.k = int(dataset_size), int(steps_per_epoch), int(allocations_per_epoch)
        self._pass: int | None = None  # the sampler's pass the current epoch is
        self._counts = np.zeros(self.n, dtype=np.int64)  # the current epoch: allocations of each example so far
        self._used = 0  # indices the current epoch used
        self._hashes: list[int] = []  # the current epoch's batches
        self._epochs: list[list[int]] = []  # earlier epochs' batches (hashes)
        self._candidates: list[list[int]] = []  # earlier epochs equal to the current one so far

    def check(self, step: int, batch: DrawnBatch) -> str | None:
        """Whether noisy step ``step`` (1-based, counted over the whole run) used ``batch`` as random allocation
        draws it: None when it did (recorded), else the reason."""
        position = len(self._hashes)
        if batch.pass_id != self._pass:
            if self._pass is not None and (position != self.t or self._used != self.n * self.k):
                return (
                    f"sampling='random_allocation' assumes whole epochs: each epoch uses the {self.t} batches of "
                    f"one allocation, each by one step. Found a new allocation started at step {step} after the "
                    f"previous one used {position} of its {self.t} batches: a loop that broke out of an epoch or "
                    "skipped a batch (an empty batch is a step too: it adds the noise), or a loader re-created "
                    "mid-epoch. Let every epoch run to its end, one step per batch"
                )
            if (step - 1) % self.t:
                return (
                    f"sampling='random_allocation' counts an epoch as {self.t} steps: an allocation must start "
                    f"after a multiple of {self.t} accounted steps. Found a new allocation started at step {step} "
                    f"(a run resumed mid-epoch, or a loader iterated before the accounted steps). Resume at an "
                    "epoch's end"
                )
            if batch.position != 0:
                return (
                    f"sampling='random_allocation' assumes whole epochs. Found step {step} using batch "
                    f"{batch.position + 1} of an allocation whose first batches no step used"
                )
            if self._pass is not None:
                self._epochs.append(self._hashes)
            self._pass, self._hashes, self._used = batch.pass_id, [], 0
            self._counts[:] = 0
            self._candidates = [e for e in self._epochs if e]
            position = 0
        if batch.position != position:
            return (
                f"sampling='random_allocation' assumes each epoch uses the batches of its allocation in the order "
                f"drawn, each by one step. Found step {step} using batch {batch.position + 1} of its epoch after "
                f"{position} steps of it: batch {position + 1} was drawn and used by no step (a loop that skips "
                "batches, an empty one say, or feeds two batches to one step)"
            )
        if position >= self.t:
            return (
                f"sampling='random_allocation' assumes {self.t} steps an epoch. Found step {step} using batch "
                f"{position + 1} of its epoch: the loader's allocation has more steps than the accounted one"
            )
        rows = np.fromiter(batch.indices, dtype=np.int64, count=len(batch.indices))
        if rows.size and (rows.min() < 0 or rows.max() >= self.n or len(np.unique(rows)) != rows.size):
            return f"a batch must hold distinct indices in [0, {self.n}). Found step {step}'s batch outside that"
        if rows.size and self._counts[rows].max() >= self.k:
            return (
                f"sampling='random_allocation' with allocations_per_epoch={self.k} uses each example at most "
                f"{self.k} time(s) an epoch. Found step {step} using an example its epoch had already used "
                f"{self.k} time(s): the batches are not the sampler's allocation"
            )
        self._counts[rows] += 1
        self._used += rows.size
        key = hash(batch.indices)
        self._hashes.append(key)
        if len(self._hashes) == self.t and self._used != self.n * self.k:
            return (
                f"sampling='random_allocation' puts every example in exactly {self.k} of an epoch's steps. Found "
                f"the epoch ending at step {step} with {self._used} of its {self.n * self.k} allocations: the "
                "batches are not the sampler's allocation"
            )
        if self._candidates:
            self._candidates = [e for e in self._candidates if position < len(e) and e[position] == key]
            if self._candidates and self._repeat_is_evident():
                return (
                    "sampling='random_allocation' draws a fresh allocation every epoch. Found the allocation of "
                    f"the epoch running at step {step} equal to an earlier epoch's: a generator re-seeded with "
                    "the same seed every epoch keeps the same bins (fixed bins are random allocation for one "
                    "epoch only). Seed the sampler's generator once, before training (or leave it to the sampler)"
                )
        return None

    def _repeat_is_evident(self) -> bool:
        """Whether the current epoch, equal so far to an earlier one, is beyond chance: the probability that a
        fresh allocation's first m batches are these is prod_i C(t - m, k - c_i) / C(t, k), c_i the example's
        allocations among them."""
        m = len(self._hashes)
        if m >= self.t:
            return True
        hist = np.bincount(self._counts, minlength=self.k + 1)
        bits = sum(int(hist[c]) * (_log2_choose(self.t, self.k) - _log2_choose(self.t - m, self.k - c))
                   for c in range(self.k + 1) if hist[c])  # fmt: skip
        return bits >= EVIDENCE_BITS


def _log2_choose(a: int, b: int) -> float:
    if b < 0 or b > a:
        return -math.inf
    return (math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)) / math.log(2)
