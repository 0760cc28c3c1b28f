r"""The batch sampler of random allocation for torch's ``DataLoader`` and Opacus (docs/sampling.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler
from torch.utils.data._utils.collate import default_collate

from lastiter_plugins.adapters._allocation import allocate, count, steps_per_epoch


class RandomAllocationSampler(Sampler[list[int]]):
    r"""RANDOM_ALLOCATION: every epoch, each example joins ``allocations_per_epoch`` (k) of the epoch's
    ``t = ceil(n k / b)`` steps, drawn uniformly at random and afresh every epoch (k = 1: balls in bins;
    Chua et al. 2024, arXiv 2412.16802; its privacy loss distribution: Feldman & Shenfeld, arXiv 2602.17284).

    A batch sampler: ``DataLoader(dataset, batch_sampler=RandomAllocationSampler(len(dataset), b),
    collate_fn=...)`` (or :meth:`data_loader`, which also collates the empty batches the scheme can draw),
    then ``make_private(..., poisson_sampling=False)``. Each iteration (epoch) draws a new allocation from
    the sampler's generator, which must stay secret: by default one seeded from the operating system's
    entropy. A step's batch has about ``n k / t`` examples; it may be empty (a step that adds only noise: train
    on it like any other). Opacus divides the noisy sum by its ``expected_batch_size``, ``int(n / t)`` for
    this loader (``len(loader)`` = t); the accountant counts that divisor (the step size it gives in the
    core's terms is ``lr * b / expected_batch_size``).

    Args:
      dataset_size: n, the number of examples (``len(dataset)``).
      batch_size: b, the core's batch size: the epoch has ``t = ceil(n k / b)`` steps.
      allocations_per_epoch: k, the steps each example joins in an epoch (default 1).
      generator: the source of the allocations: a ``numpy.random.Generator``, or a ``torch.Generator`` (each
        epoch's allocation is then drawn from a seed taken from it); default: a numpy generator seeded from
        the operating system (secret). A seed you publish makes the allocations public.
    """

    def __init__(
        self,
        dataset_size: int,
        batch_size: int,
        allocations_per_epoch: int = 1,
        generator: np.random.Generator | torch.Generator | None = None,
    ) -> None:
        n = count("dataset_size", dataset_size, 1)
        b = count("batch_size", batch_size, 1)
        if b > n:
            raise ValueError(f"batch_size must be <= dataset_size = {n}. Found {b}.")
        k = count("allocations_per_epoch", allocations_per_epoch, 1)
        if generator is not None and not isinstance(generator, (np.random.Generator, torch.Generator)):
            kind = type(generator).__name__
            raise ValueError(f"generator must be a numpy.random.Generator, a torch.Generator or None. Found {kind}.")
        self.dataset_size, self.batch_size, self.allocations_per_epoch = n, b, k
        self.steps_per_epoch = steps_per_epoch(n, b, k)
        self.generator = np.random.default_rng() if generator is None else generator

    def _rng(self) -> np.random.Generator:
        if isinstance(self.generator, torch.Generator):
            seed = torch.randint(0, 2**62, (2,), generator=self.generator, dtype=torch.int64)
            return np.random.default_rng([int(s) for s in seed])
        return self.generator

    def __iter__(self) -> Iterator[list[int]]:
        batches = allocate(self.dataset_size, self.steps_per_epoch, self.allocations_per_epoch, self._rng())
        return (batch.tolist() for batch in batches)

    def __len__(self) -> int:
        return self.steps_per_epoch

    def data_loader(self, dataset: Any, collate_fn: Callable[[list], Any] | None = None, **kwargs: Any) -> DataLoader:
        """``DataLoader(dataset, batch_sampler=self, collate_fn=...)`` whose collate gives an empty batch the
        shape of a one-example batch with zero rows (what Opacus' Poisson loader does); ``kwargs``: the
        DataLoader's other arguments (``num_workers``, ...)."""
        if len(dataset) != self.dataset_size:
            raise ValueError(f"len(dataset) must equal dataset_size = {self.dataset_size}. Found {len(dataset)}.")
        return DataLoader(dataset, batch_sampler=self, collate_fn=EmptyBatchCollate(dataset, collate_fn), **kwargs)


class EmptyBatchCollate:
    """A collate function that also collates an empty batch: every tensor of a one-example batch cut to zero
    rows (the shapes and types of the data, no example's values)."""

    def __init__(self, dataset: Any, collate_fn: Callable[[list], Any] | None = None) -> None:
        self.dataset = dataset
        self.collate_fn = default_collate if collate_fn is None else collate_fn

    def __call__(self, batch: list) -> Any:
        if batch:
            return self.collate_fn(batch)
        return _empty(self.collate_fn([self.dataset[0]]))


def _empty(value: Any) -> Any:
    if torch.is_tensor(value):
        return value[:0]
    if isinstance(value, (list, tuple)):
        return type(value)(_empty(v) for v in value)
    if isinstance(value, dict):
        return {key: _empty(v) for key, v in value.items()}
    return value
