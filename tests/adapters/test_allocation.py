"""lastiter_plugins/adapters/_allocation.py: random allocation's draw, and a run's batches against the scheme.

Pure numpy (no host library): the draw's law (every example in exactly k distinct steps, each k-subset
equally likely, afresh every epoch), and the record accepting the epochs a genuine sampler draws and refusing
each way a loop can leave them, with its cause.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from lastiter_plugins.adapters._allocation import AllocationRecord, allocate, steps_per_epoch
from lastiter_plugins.adapters._derivation import DrawnBatch


def _epoch(pass_id: int, batches: list[np.ndarray]) -> list[DrawnBatch]:
    return [DrawnBatch(pass_id, j, tuple(int(i) for i in b)) for j, b in enumerate(batches)]


def _feed(record: AllocationRecord, batches: list[DrawnBatch], first_step: int = 1) -> str | None:
    for step, batch in enumerate(batches, start=first_step):
        problem = record.check(step, batch)
        if problem is not None:
            return problem
    return None


@pytest.mark.parametrize(("n", "b", "k"), [(100, 10, 1), (103, 7, 1), (50, 9, 3), (5, 5, 1), (6, 4, 2)])
def test_every_example_joins_k_distinct_steps_of_ceil_nk_over_b(n, b, k):
    t = steps_per_epoch(n, b, k)
    assert t == math.ceil(n * k / b)
    batches = allocate(n, t, k, np.random.default_rng(1))
    assert len(batches) == t
    counts = np.bincount(np.concatenate(batches), minlength=n)
    assert (counts == k).all()
    assert all(len(set(batch.tolist())) == len(batch) for batch in batches)


@pytest.mark.parametrize("k", [1, 2])
def test_each_k_subset_of_the_steps_is_equally_likely(k):
    """One example's k steps over many epochs: a chi-square test at the 1e-4 level (t = 4: 4 or 6 subsets)."""
    t, draws = 4, 6000
    rng = np.random.default_rng(7)
    seen: dict[tuple[int, ...], int] = {}
    for _ in range(draws):
        batches = allocate(3, t, k, rng)
        subset = tuple(j for j, batch in enumerate(batches) if 0 in batch.tolist())
        seen[subset] = seen.get(subset, 0) + 1
    subsets = list(itertools.combinations(range(t), k))
    assert set(seen) == set(subsets)
    expected = draws / len(subsets)
    chi2 = sum((seen[s] - expected) ** 2 / expected for s in subsets)
    assert chi2 < {3: 21.1, 5: 25.7}[len(subsets) - 1]  # the chi-square quantile at 1 - 1e-4


def test_the_examples_are_allocated_independently():
    """Two examples in the same step with probability 1/t (k = 1), over many epochs."""
    t, draws, rng = 5, 20000, np.random.default_rng(3)
    together = sum(
        any(0 in batch.tolist() and 1 in batch.tolist() for batch in allocate(4, t, 1, rng)) for _ in range(draws)
    )
    assert abs(together / draws - 1 / t) < 4 * math.sqrt((1 / t) * (1 - 1 / t) / draws)


def test_genuine_epochs_are_accepted_with_a_partial_last_one():
    n, b, k = 40, 8, 2
    t = steps_per_epoch(n, b, k)
    record, rng = AllocationRecord(n, t, k), np.random.default_rng(0)
    batches = [
        *_epoch(1, allocate(n, t, k, rng)),
        *_epoch(2, allocate(n, t, k, rng)),
        *_epoch(3, allocate(n, t, k, rng))[:3],
    ]
    assert _feed(record, batches) is None


def test_a_skipped_batch_is_refused():
    """An empty batch skipped by the loop (``if len(x) == 0: continue``) is a step the accounting counts."""
    n, t = 30, 10
    batches = _epoch(1, allocate(n, t, 1, np.random.default_rng(0)))
    problem = _feed(AllocationRecord(n, t, 1), [*batches[:4], *batches[5:]])
    assert "batch 6 of its epoch after 4 steps of it: batch 5 was drawn and used by no step" in problem


def test_an_epoch_broken_off_is_refused():
    n, t, rng = 30, 10, np.random.default_rng(0)
    problem = _feed(
        AllocationRecord(n, t, 1), [*_epoch(1, allocate(n, t, 1, rng))[:6], *_epoch(2, allocate(n, t, 1, rng))]
    )
    assert "new allocation started at step 7 after the previous one used 6 of its 10 batches" in problem


def test_an_allocation_must_start_where_an_accounted_epoch_starts():
    """A run resumed mid-epoch starts a new allocation at a step the accounting puts inside an epoch."""
    n, t = 30, 10
    problem = _feed(AllocationRecord(n, t, 1), _epoch(1, allocate(n, t, 1, np.random.default_rng(0))), first_step=5)
    assert (
        "allocation must start after a multiple of 10 accounted steps. Found a new allocation started at step 5"
        in problem
    )
    assert (
        _feed(AllocationRecord(n, t, 1), _epoch(1, allocate(n, t, 1, np.random.default_rng(0))), first_step=21) is None
    )


def test_an_example_in_more_than_k_batches_is_refused():
    n, t = 6, 3
    batches = [DrawnBatch(1, 0, (0, 1)), DrawnBatch(1, 1, (0, 2, 3)), DrawnBatch(1, 2, (4, 5))]
    assert "at most 1 time(s) an epoch. Found step 2 using an example its epoch had already used" in _feed(
        AllocationRecord(n, t, 1), batches
    )


def test_an_epoch_missing_examples_is_refused():
    batches = [DrawnBatch(1, 0, (0, 1)), DrawnBatch(1, 1, (2,)), DrawnBatch(1, 2, (4, 5))]
    assert "epoch ending at step 3 with 5 of its 6 allocations" in _feed(AllocationRecord(6, 3, 1), batches)


def test_a_repeated_allocation_is_refused_fresh_ones_accepted():
    """Fixed bins: a generator re-seeded with the same seed every epoch draws the same allocation."""
    n, t = 12, 4
    fixed = [_epoch(p, allocate(n, t, 1, np.random.default_rng(5))) for p in (1, 2)]
    assert "equal to an earlier epoch's" in _feed(AllocationRecord(n, t, 1), [*fixed[0], *fixed[1]])
    rng = np.random.default_rng(5)
    fresh = [_epoch(p, allocate(n, t, 1, rng)) for p in (1, 2, 3)]
    assert _feed(AllocationRecord(n, t, 1), [b for epoch in fresh for b in epoch]) is None


def test_a_repeated_prefix_is_refused_once_beyond_chance():
    """n = 1000, t = 100: one batch repeated is about 1000 log2(1/(1 - 1/100)) + 10 log2(100) ~ 81 bits: refused at
    the first step of the second epoch; with n = 12, t = 4 a first batch repeats by chance (about 5 bits): not."""
    n, t = 1000, 100
    epoch = allocate(n, t, 1, np.random.default_rng(2))
    record = AllocationRecord(n, t, 1)
    assert _feed(record, _epoch(1, epoch)) is None
    assert "equal to an earlier epoch's" in record.check(t + 1, _epoch(2, epoch)[0])
    small = allocate(12, 4, 1, np.random.default_rng(2))
    record = AllocationRecord(12, 4, 1)
    assert _feed(record, _epoch(1, small)) is None
    assert record.check(5, _epoch(2, small)[0]) is None
