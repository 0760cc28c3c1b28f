"""Data loaders: which sampling scheme a loader implements, and whether it still does at each step."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import numbers
import secrets
import weakref
from collections.abc import Iterator, Sized
from typing import Any, cast

import numpy as np
import torch
from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler, UniformWithReplacementSampler
from torch.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    Subset,
)
from torch.utils.data.distributed import DistributedSampler

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus._allocation_sampler import RandomAllocationSampler
from lastiter_plugins.adapters.opacus._errors import LastIterateConfigurationError
from lastiter_plugins.adapters.opacus._patches import PASS_IDS

Sampling = lp.Sampling
POISSON_SAMPLERS = (UniformWithReplacementSampler, DistributedUniformWithReplacementSampler)


class ShuffleOnceSampler(Sampler[int]):
    r"""SHUFFLE_ONCE: one random permutation, drawn at construction, reused every epoch.

    ``DataLoader(dataset, batch_size=b, sampler=ShuffleOnceSampler(dataset))``
    gives the same batches in every epoch, in an order the adversary does not
    know. The shuffle-once bound (Ye & Shokri 2022, arXiv 2205.13710, Thm 4.2) needs
    the permutation to be random and secret: by default the seed comes from the
    operating system (``secrets``); a seed you pass must be kept secret (a public seed
    makes the order public, i.e. cyclic). Reuse the same seed when resuming.

    Args:
      data_source: a sized dataset, or the number of examples.
      seed: seed of the permutation (default: a fresh secret one).
    """

    generator = None  # Opacus' secure_mode swaps samplers' generators; the permutation is already drawn

    def __init__(self, data_source: Any, *, seed: int | None = None) -> None:
        size = data_source if isinstance(data_source, numbers.Integral) else len(data_source)
        if isinstance(size, bool) or int(size) < 1:
            raise ValueError(f"data_source must hold at least one example. Found {size!r}.")
        self.seed = secrets.randbits(63) if seed is None else int(seed)
        gen = torch.Generator()
        gen.manual_seed(self.seed)
        self._permutation = tuple(torch.randperm(int(size), generator=gen).tolist())
        self._digest = hashlib.sha256(np.asarray(self._permutation, dtype="<i8").tobytes()).hexdigest()

    @property
    def permutation(self) -> tuple[int, ...]:
        return self._permutation

    @property
    def digest(self) -> str:
        """SHA-256 of the permutation: lets a resumed run check that it uses the same one.
        For a small dataset it reveals the order to whoever reads it: keep it as private as the seed."""
        return self._digest

    def __iter__(self) -> Iterator[int]:
        PERMUTATIONS.started(len(self._permutation), self._digest)
        listeners = PERMUTATIONS.listeners(self._digest)
        if not listeners:
            return iter(self._permutation)
        return itertools.chain.from_iterable(_reported(self._permutation, listeners))

    def __len__(self) -> int:
        return len(self._permutation)


def _reported(permutation: tuple[int, ...], listeners: list) -> Iterator[tuple[int, ...]]:
    """The permutation in chunks, cut where a listener's batch starts; before a chunk is drawn from, each
    listener whose batch starts there is told ``listener.batch_drawn(pass_id, start)`` (a BatchSampler
    draws a batch's indices one by one from the chained chunks: the report comes with its first index)."""
    pass_id = next(PASS_IDS)
    starts = sorted(set().union(*(listener.starts for listener in listeners)))
    for start, end in zip(starts, [*starts[1:], len(permutation)], strict=True):
        for listener in listeners:
            if start in listener.starts:
                listener.batch_drawn(pass_id, start)
        yield permutation[start:end]
    for listener in listeners:
        listener.pass_ended(pass_id)


class PermutationLog:
    """Which shuffle-once permutations have started an epoch, in order: a ``ShuffleOnceSampler``
    reports each iteration, so that an accountant bound to one permutation sees another one
    used for the same number of examples (a new sampler built every epoch reshuffles)."""

    def __init__(self) -> None:
        self.serial = 0
        self._latest: dict[tuple[int, str], int] = {}  # (size, digest) -> serial of its latest epoch start
        self._listeners: dict[str, weakref.WeakSet] = {}  # digest -> monitors told of every index drawn

    def listen(self, digest: str, listener: Any) -> None:
        """Tell ``listener`` (``.starts``: where its batches start; ``.batch_drawn(pass_id, start)``) of every
        batch any ``ShuffleOnceSampler`` with this permutation starts drawing (whatever loader iterates it:
        the permutation, not the object, is the run's)."""
        self._listeners.setdefault(digest, weakref.WeakSet()).add(listener)

    def listeners(self, digest: str) -> list:
        return list(self._listeners.get(digest, ()))

    def started(self, size: int, digest: str) -> None:
        self.serial += 1
        self._latest[(size, digest)] = self.serial

    def other_since(self, size: int, digest: str, serial: int) -> str | None:
        """The digest of another permutation of ``size`` elements started after ``serial``, else None."""
        for (n, other), latest in self._latest.items():
            if n == size and other != digest and latest > serial:
                return other
        return None


PERMUTATIONS = PermutationLog()


@dataclasses.dataclass(frozen=True)
class LoaderFacts:
    """What a data loader does, as far as the accounting is concerned.

    Attributes:
      sampling: the scheme it implements.
      dataset_size: ``len(loader.dataset)``.
      num_batches: batches per epoch, ``len(loader)`` (for Poisson: round(1 / sample_rate)).
      batch_size: the fixed batch size (None for Poisson).
      sample_rate: the per-example inclusion probability of a Poisson batch (None otherwise).
      distributed: Opacus' distributed Poisson sampler.
      description: the sampler, in words.
      permutation_digest: for a ShuffleOnceSampler, the SHA-256 of its permutation (None otherwise).
      drop_last: the batch sampler's drop_last (accepted only when the batch size divides n).
      allocations_per_epoch: k of a ``RandomAllocationSampler`` (1 otherwise); its ``batch_size`` is the core's b
        and ``num_batches`` its t = ceil(n k / b).
    """

    sampling: Sampling
    dataset_size: int
    num_batches: int
    batch_size: int | None
    sample_rate: float | None
    distributed: bool
    description: str
    permutation_digest: str | None = None
    drop_last: bool = False
    allocations_per_epoch: int = 1

    @property
    def opacus_sample_rate(self) -> float:
        """The sample rate Opacus passes to the accountant: q for Poisson, else 1 / len(loader)."""
        return self.sample_rate if self.sample_rate is not None else 1.0 / self.num_batches

    def batch_at(self, position: int) -> int | None:
        """Examples in the ``position``-th batch of an epoch (None for Poisson and random allocation: random)."""
        if self.batch_size is None or self.sampling is Sampling.RANDOM_ALLOCATION:
            return None
        if position == self.num_batches - 1:
            return self.dataset_size - (self.num_batches - 1) * self.batch_size
        return self.batch_size


def _refuse(message: str) -> LastIterateConfigurationError:
    return LastIterateConfigurationError(message)


def _describe_poisson(batch_sampler: Any, n: int) -> LoaderFacts:
    distributed = isinstance(batch_sampler, DistributedUniformWithReplacementSampler)
    size = batch_sampler.total_size if distributed else batch_sampler.num_samples
    if size != n:
        raise _refuse(
            f"the Poisson sampler must draw from the whole dataset: its "
            f"{'total_size' if distributed else 'num_samples'} must equal "
            f"len(dataset) = {n}. Found {size}. Let make_private(poisson_sampling=True) build it."
        )
    return LoaderFacts(
        Sampling.POISSON,
        n,
        max(1, round(1.0 / batch_sampler.sample_rate)),
        None,
        float(batch_sampler.sample_rate),
        distributed,
        f"Opacus Poisson sampler (sample_rate={batch_sampler.sample_rate:g})",
    )


def _describe_allocation(sampler: RandomAllocationSampler, n: int) -> LoaderFacts:
    if sampler.dataset_size != n:
        raise _refuse(
            f"RandomAllocationSampler must allocate the whole dataset: its dataset_size must equal len(dataset) = "
            f"{n}. Found {sampler.dataset_size}. Build it with RandomAllocationSampler(len(dataset), batch_size)."
        )
    k, b = sampler.allocations_per_epoch, sampler.batch_size
    return LoaderFacts(
        Sampling.RANDOM_ALLOCATION,
        n,
        sampler.steps_per_epoch,
        b,
        None,
        False,
        f"RandomAllocationSampler (each example in {k} of each epoch's {sampler.steps_per_epoch} steps, drawn "
        f"afresh every epoch; batch_size={b})",
        allocations_per_epoch=k,
    )


def _examples(dataset: Any, leaves: dict[int, tuple[int, Any]], depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Which example of which underlying dataset each item of ``dataset`` is, through ``Subset`` and
    ``ConcatDataset`` (any other dataset is its own examples): two arrays (leaf number, index in that leaf),
    one entry per item. ``leaves`` numbers the underlying datasets by identity (kept alive while it lives)."""
    if depth < 32 and type(dataset) is Subset:
        chosen = np.asarray(dataset.indices, dtype=np.int64).reshape(-1)
        parent = dataset.dataset
        if type(parent) not in (Subset, ConcatDataset):  # a Subset of a plain dataset: its indices are the examples
            number = leaves.setdefault(id(parent), (len(leaves), parent))[0]
            return np.full(len(chosen), number, dtype=np.int64), chosen % max(1, len(cast(Sized, parent)))
        leaf, index = _examples(parent, leaves, depth + 1)
        chosen %= max(1, len(index))
        return leaf[chosen], index[chosen]
    if depth < 32 and type(dataset) is ConcatDataset:
        parts = [_examples(part, leaves, depth + 1) for part in dataset.datasets]
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    number = leaves.setdefault(id(dataset), (len(leaves), dataset))[0]
    size = len(dataset)
    return np.full(size, number, dtype=np.int64), np.arange(size, dtype=np.int64)


def check_examples_once(dataset: Any) -> None:
    """Each example of the underlying datasets is at most one item of ``dataset`` (checked through ``Subset`` and
    ``ConcatDataset``: ``ConcatDataset([ds, Subset(ds, minority)])`` oversamples, so one person is two items)."""
    if type(dataset) not in (Subset, ConcatDataset):
        return
    leaves: dict[int, tuple[int, Any]] = {}
    leaf, index = _examples(dataset, leaves)
    if len(leaf) < 2:
        return
    keys = leaf * (int(index.max()) + 1) + index
    unique, counts = np.unique(keys, return_counts=True)
    if len(unique) == len(keys):
        return
    worst = int(np.argmax(counts))
    repeated = int((counts > 1).sum())
    number, position = divmod(int(unique[worst]), int(index.max()) + 1)
    owner = next(d for n, d in leaves.values() if n == number)
    raise _refuse(
        "each person's data must be one example of the data loader's dataset, used once per pass: every bound "
        "counts one clipped gradient per example and pass, and neighbouring datasets differ in one example. Found "
        f"{repeated} example(s) of an underlying {type(owner).__name__} appearing more than once (the most often: "
        f"its example {position}, {int(counts[worst])} times) through the dataset's {type(dataset).__name__}: a "
        "ConcatDataset "
        "whose parts share examples (ConcatDataset([ds, Subset(ds, minority)]) to oversample a class) or a Subset "
        "with repeated indices. Oversampling duplicates people, so one person changes several examples; no bound "
        "covers it. Use each example once."
    )


def describe_data_loader(loader: Any) -> LoaderFacts:
    r"""Map a data loader to the sampling scheme it implements.

    ==========================================================  ==============
    loader                                                       sampling
    ==========================================================  ==============
    Opacus ``DPDataLoader`` (``make_private(poisson_sampling=True)``),
    also distributed                                             poisson
    ``DataLoader(shuffle=False)`` (``SequentialSampler``)        cyclic
    ``DataLoader(sampler=ShuffleOnceSampler(...))``              shuffle_once
    ``DataLoader(shuffle=True)`` (``RandomSampler``)             reshuffle
    ``DataLoader(batch_sampler=RandomAllocationSampler(...))``   random_allocation
    ==========================================================  ==============

    Every sampler must cover the whole dataset, each example once per epoch, and the dataset must hold each
    example once (checked through ``Subset`` and ``ConcatDataset``).

    Raises:
      LastIterateConfigurationError: an example twice in the dataset (oversampling by ``ConcatDataset``), or
        anything else (``drop_last=True`` with a batch
        size not dividing n, a sampler over a subset or with ``num_samples``,
        ``RandomSampler(replacement=True)``, ``DistributedSampler``, weighted or custom
        samplers, iterable datasets), naming the problem and the fix.
    """
    if not isinstance(loader, DataLoader):
        raise _refuse(f"data_loader must be a torch DataLoader. Found {type(loader).__name__}.")
    if isinstance(loader.dataset, IterableDataset):
        raise _refuse(
            "data_loader.dataset must be a map-style dataset (its sampling must be known). Found an IterableDataset."
        )
    n = len(cast(Sized, loader.dataset))  # map-style: torch's Dataset does not declare __len__
    check_examples_once(loader.dataset)
    batch_sampler = loader.batch_sampler
    if isinstance(batch_sampler, POISSON_SAMPLERS):
        return _describe_poisson(batch_sampler, n)
    if type(batch_sampler) is RandomAllocationSampler:
        return _describe_allocation(batch_sampler, n)
    if type(batch_sampler) is not BatchSampler:
        raise _refuse(
            "data_loader must batch with torch's BatchSampler (DataLoader(batch_size=...)) or Opacus' Poisson sampler. "
            f"Found batch_sampler={type(batch_sampler).__name__}; its sampling scheme cannot be verified."
        )
    sampler = batch_sampler.sampler
    digest = None
    whole = f"cover the whole dataset once per epoch: len(sampler) must equal len(dataset) = {n}"
    if isinstance(sampler, ShuffleOnceSampler):
        digest = sampler.digest
        sampling, description = Sampling.SHUFFLE_ONCE, "ShuffleOnceSampler (one secret permutation, every epoch)"
        if len(sampler) != n:
            raise _refuse(f"ShuffleOnceSampler must {whole}. Found {len(sampler)}. Build it from the dataset.")
    elif type(sampler) is SequentialSampler:
        sampling, description = Sampling.CYCLIC, "SequentialSampler (DataLoader(shuffle=False): fixed order)"
        if len(sampler) != n:
            raise _refuse(
                f"SequentialSampler must {whole}. Found {len(sampler)} (a sampler over a subset uses those examples "
                "more often than the accountant counts). Use DataLoader(subset, shuffle=False) and register "
                "dataset_size=len(subset) instead."
            )
    elif type(sampler) is RandomSampler:
        source = len(sampler.data_source)
        if sampler.replacement or sampler.num_samples != n or source != n:
            raise _refuse(
                f"RandomSampler must draw one permutation of the whole dataset per epoch (replacement=False, "
                f"num_samples=None, over all {n} examples): no bound covers sampling with replacement or over a "
                f"subset. Found replacement={sampler.replacement}, num_samples={sampler.num_samples}, "
                f"{source} examples in its data_source. Use DataLoader(dataset, shuffle=True)."
            )
        sampling = Sampling.RESHUFFLE
        description = "RandomSampler (DataLoader(shuffle=True): new permutation every epoch)"
    elif isinstance(sampler, DistributedSampler):
        raise _refuse(
            "sampler must not be a DistributedSampler: it pads the dataset by repeating examples when the world "
            "size does not divide n, each rank iterates its own shard, and its permutation comes from a seed "
            f"(seed={sampler.seed}, public by default): without set_epoch the same permutation every epoch, with it "
            "a new one per epoch (seed + epoch), neither secret as shuffle_once and reshuffle assume. For "
            "distributed training use make_private(poisson_sampling=True) with sampling='poisson'."
        )
    else:
        raise _refuse(
            f"sampler must be SequentialSampler, RandomSampler or ShuffleOnceSampler. Found {type(sampler).__name__}; "
            "its sampling scheme cannot be verified, so no bound can be applied honestly."
        )
    b = int(batch_sampler.batch_size)
    if batch_sampler.drop_last and n % b:
        raise _refuse(
            f"drop_last=True is accepted only when the batch size divides the dataset size (then nothing is dropped): "
            f"every bound counts a pass as ceil(n/b) batches, and dropping the short last batch changes which "
            f"examples each pass uses. Found batch_size={b}, n={n} (n % b = {n % b}). Use drop_last=False."
        )
    return LoaderFacts(sampling, n, len(loader), b, None, False, description, digest, bool(batch_sampler.drop_last))


FIXES = {
    Sampling.CYCLIC: "DataLoader(shuffle=False)",
    Sampling.SHUFFLE_ONCE: "DataLoader(sampler=ShuffleOnceSampler(dataset)) with make_private(poisson_sampling=False)",
    Sampling.RESHUFFLE: "DataLoader(shuffle=True) with make_private(poisson_sampling=False)",
    Sampling.POISSON: "make_private(poisson_sampling=True)",
    Sampling.RANDOM_ALLOCATION: (
        "DataLoader(dataset, batch_sampler=RandomAllocationSampler(len(dataset), b)) with "
        "make_private(poisson_sampling=False)"
    ),
}


def check_data_loader(loader: Any, sampling: str | Sampling, dataset_size: int | None = None) -> LoaderFacts:
    """Check that ``loader`` (the one actually iterated: the one ``make_private`` returns)
    implements the declared ``sampling``; return its :class:`LoaderFacts`.

    Raises:
      LastIterateConfigurationError: the loader contradicts the declaration
        (message: what was declared, what the loader does, how to fix either).
    """
    sampling = Sampling.parse(sampling)
    facts = describe_data_loader(loader)
    if facts.sampling is not sampling:
        raise _refuse(
            f"sampling was declared {sampling.value!r} but the data loader implements {facts.sampling.value!r} "
            f"({facts.description}). Use {FIXES.get(sampling, 'a loader implementing it')} for "
            f"{sampling.value}, or register the accountant with sampling={facts.sampling.value!r}."
        )
    if dataset_size is not None and facts.dataset_size != dataset_size:
        raise _refuse(
            f"dataset_size must equal len(data_loader.dataset) = {facts.dataset_size}. Found {dataset_size} registered."
        )
    return facts
