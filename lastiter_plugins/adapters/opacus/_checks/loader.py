"""The loader bound at ``make_private`` is the one the run iterates, unchanged (every row: the accountant's
n, batch plan and sampling scheme describe it): its dataset and size, its batch sampler and sampler with
their parameters (which permutation a shuffle-once step used is the batch queue's)."""

from __future__ import annotations

import weakref
from collections.abc import Sized
from typing import Any, cast

from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from lastiter_plugins.adapters.opacus._allocation_sampler import RandomAllocationSampler
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._loaders import POISSON_SAMPLERS, LoaderFacts, ShuffleOnceSampler
from lastiter_plugins.host import Departure

_FIELDS = (
    "dataset",
    "len(dataset)",
    "batch_sampler",
    "batch_size",
    "drop_last",
    "sampler",
    "len(sampler)",
    "sampler state",
)


def _sampler_state(sampler: Any) -> Any:
    if type(sampler) is RandomSampler:
        return sampler.replacement, sampler.num_samples, len(sampler.data_source)
    if isinstance(sampler, ShuffleOnceSampler):
        return sampler._permutation
    return None


def _signature(loader: DataLoader) -> tuple:
    """What the facts of a loader depend on, in the order of ``_FIELDS``."""
    dataset, bs = cast(Sized, loader.dataset), loader.batch_sampler  # map-style (describe_data_loader)
    if type(bs) is BatchSampler:
        sampler = cast(Sized, bs.sampler)  # the samplers describe_data_loader accepts have a length
        return dataset, len(dataset), bs, bs.batch_size, bs.drop_last, sampler, len(sampler), _sampler_state(sampler)
    if isinstance(bs, POISSON_SAMPLERS):
        size = bs.total_size if isinstance(bs, DistributedUniformWithReplacementSampler) else bs.num_samples
        return dataset, len(dataset), bs, None, None, None, size, bs.sample_rate
    if type(bs) is RandomAllocationSampler:
        return (
            dataset,
            len(dataset),
            bs,
            bs.batch_size,
            None,
            None,
            len(bs),
            (bs.dataset_size, bs.allocations_per_epoch),
        )
    return dataset, len(dataset), bs, None, None, None, None, None


class BoundLoader(Check):
    """The loader bound at ``make_private``, re-read at every step: the same dataset of the
    same size, the same batch sampler and sampler with the same parameters (which permutation a
    shuffle-once step used is the batch queue's: :class:`BatchQueue`)."""

    __slots__ = ("_loader", "_signature", "_types", "batch_sampler", "facts")

    def __init__(self, loader: DataLoader, facts: LoaderFacts) -> None:
        self.facts = facts
        self._loader = weakref.ref(loader)
        self._signature = _signature(loader)
        # (the classes choose _signature's branches)
        self._types = (type(loader.batch_sampler), type(self._signature[5]))
        self.batch_sampler = weakref.ref(loader.batch_sampler)

    def at_step(self, step: Step) -> Departure | None:
        change = self.changed()
        if change is not None:
            raise _Changed(f"{change} (step {step.number}).")
        return None

    def changed(self) -> str | None:
        """None while the loader is unchanged, else what changed (for the error message)."""
        loader = self._loader()
        if loader is None:
            return (
                "the data loader bound at make_private no longer exists (the loop iterates another loader). "
                "Iterate the loader make_private returned"
            )
        now = _signature(loader)
        kinds = (type(loader.batch_sampler), type(now[5]))
        if kinds != self._types:
            return (
                "the data loader's batch sampler or sampler changed class after make_private ("
                f"{self._types[0].__name__}, {self._types[1].__name__} -> {kinds[0].__name__}, {kinds[1].__name__}): "
                "its sampling scheme is no longer the one verified. Build a new loader, engine and accountant"
            )
        if now != self._signature:
            diffs = [
                f"{field}: {_show(a)} -> {_show(b)}"
                for field, a, b in zip(_FIELDS, self._signature, now, strict=True)
                if not (a is b or (_plain(a) and a == b))
            ]
            return (
                f"the data loader changed after make_private ({'; '.join(diffs)}): the accountant's n, batch plan "
                "and sampling scheme no longer describe the data a step uses. Build a new loader, engine and "
                "accountant for new data"
            )
        return None


def _plain(value: Any) -> bool:
    return isinstance(value, (int, float, bool, str, tuple, type(None)))


def _show(value: Any) -> str:
    if _plain(value) and not (isinstance(value, tuple) and len(value) > 4):
        return repr(value)
    return f"{type(value).__name__} object" if not isinstance(value, tuple) else f"a tuple of {len(value)}"
