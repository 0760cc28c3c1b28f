"""The run monitor of the Opacus adapter: what each noisy step used, observed where it happens.

* the loader bound at ``make_private`` (:class:`LoaderWatch`: its dataset, batch sampler and sampler
  unchanged);
* the DP optimizer's facts and the model's parameters and buffers (:class:`RunMonitor`, through
  ``_observe`` and ``_steps``);
* the batches the bound loader's batch sampler draws (recorded at that object, every iteration) and
  which of them torch's DataLoader iterators handed the loop, matched to noisy steps: a queue per pass
  of the sampler (docs/derivations/opacus-adapter.md#run-monitor);
* the number of per-example clipped gradients the step summed (counted by the step checks);
* the model the run starts from (``_start``): a model an earlier accountant of this library has trained
  (:data:`~lastiter_plugins.adapters.opacus._start.MARKS`) continues that accounting, or is refused;
* data-dependent control: a ``ReduceLROnPlateau`` scheduler on the optimizer.

The derivation (:mod:`lastiter_plugins.adapters._derivation`) compares the record with what is
accounted; this module only observes and matches.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from collections.abc import Sized
from typing import Any, cast

import torch
from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from lastiter_plugins.adapters._derivation import Derivation, DrawnBatch
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._loaders import (
    PERMUTATIONS,
    POISSON_SAMPLERS,
    LoaderFacts,
    ShuffleOnceSampler,
)
from lastiter_plugins.adapters.opacus._observe import ExampleCounter, Observed, observe, raw_facts
from lastiter_plugins.adapters.opacus._registration import Registration
from lastiter_plugins.adapters.opacus._steps import Buffers, StepChecks


class BatchQueue:
    """The batches drawn by one recorded batch sampler and not yet matched to a step, per pass.

    A noisy step takes its batch from the pass that handed the loop a batch last (an evaluation pass run
    to its end before it, a pass that broke off: their batches are never matched): the newest batch of
    that pass delivered to the loop. An iterator of torch's ``DataLoader`` reports each batch it hands the
    loop (``_internals.DELIVERED``, in the order drawn); without one (a ``BatchMemoryManager``, a
    shuffle-once plan), every drawn batch counts as delivered without worker processes, and with workers,
    which draw up to ``num_workers * prefetch_factor`` batches ahead, the step's batch is the oldest of
    the pass that drew last. A batch delivered and used by no step before the step's batch (same pass),
    or in a pass that a step used or that broke off, is handed to the derivation (Poisson refuses it;
    docs/derivations/opacus-adapter.md#run-monitor).
    """

    def __init__(self, loader: Any, facts: LoaderFacts) -> None:
        workers = int(getattr(loader, "num_workers", 0) or 0)
        self.ahead = workers * int(getattr(loader, "prefetch_factor", None) or 2) if workers else 0
        self._pending: dict[int, deque[DrawnBatch]] = {}
        self._delivered: dict[int, int] = {}  # pass -> batches handed to the loop (reported by torch's iterator)
        self._used: set[int] = set()  # passes a step used
        self._ended: set[int] = set()
        self._unused: DrawnBatch | None = None  # a delivered batch of a dropped pass that no step used
        self._last: int | None = None  # the pass that drew last
        self._latest: int | None = None  # the pass that handed the loop a batch last
        self._facts = facts
        self._serial = PERMUTATIONS.serial  # shuffle-once: another permutation started since is named
        if facts.permutation_digest is not None:  # the permutation is the run's, whichever loader draws it
            self._permutation = loader.batch_sampler.sampler.permutation
            bounds = [0]
            for position in range(facts.num_batches):
                size = facts.batch_at(position)
                assert size is not None  # a shuffle-once plan has fixed batch sizes
                bounds.append(bounds[-1] + size)
            self._plan = {start: (k, end) for k, (start, end) in enumerate(itertools.pairwise(bounds))}
            self.starts = frozenset(self._plan)
            PERMUTATIONS.listen(facts.permutation_digest, self)
        else:
            internals.record_batches(loader.batch_sampler, self._drawn)

    def batch_drawn(self, pass_id: int, start: int) -> None:
        """A shuffle-once batch of the bound loader's plan started being drawn (a loader with another batch
        size shows in the gradient counts)."""
        position, end = self._plan[start]
        self._drawn(pass_id, position, self._permutation[start:end])

    def pass_ended(self, pass_id: int) -> None:
        self._ended.add(pass_id)

    def _drawn(self, pass_id: int, position: int, batch: Any) -> None:
        if position == internals.DELIVERED:
            self._delivered[pass_id] = batch
            self._latest = pass_id
            return
        if batch is None:  # (record_batches: the pass has ended)
            self.pass_ended(pass_id)
            return
        if pass_id not in self._pending and self._ended:
            # a new pass: the passes that ended before it (evaluation passes, an epoch run out) hold no batch a
            # step will use; dropping them bounds the memory of loops that iterate without steps (a batch of a
            # used pass delivered and used by no step is kept for the next step's derivation)
            for ended in [p for p in self._pending if p in self._ended]:
                unused = self._unused_of(ended)
                if unused is not None and len(unused) < len(self._pending[ended]):
                    continue  # (workers drew it to its end ahead of the loop, which still receives its batches)
                if unused and ended in self._used and self._unused is None:
                    self._unused = unused[0]
                self._forget(ended)
            self._ended &= self._pending.keys()
        indices = batch if type(batch) is tuple else tuple(batch.tolist() if torch.is_tensor(batch) else batch)
        self._pending.setdefault(pass_id, deque()).append(DrawnBatch(pass_id, position, indices))
        self._last = pass_id
        if not self.ahead:  # (drawn when the loop asks: delivered, reported or not)
            self._latest = pass_id

    def _unused_of(self, pass_id: int) -> list[DrawnBatch] | None:
        """The pending batches of a pass that the loop received (None: not known, workers without reports)."""
        queue = self._pending.get(pass_id, ())
        if pass_id in self._delivered:
            return [b for b in queue if b.position < self._delivered[pass_id]]
        return None if self.ahead else list(queue)

    def _forget(self, pass_id: int) -> None:
        self._pending.pop(pass_id, None)
        self._delivered.pop(pass_id, None)
        self._used.discard(pass_id)

    def other_permutation(self) -> str | None:
        """Shuffle-once: why no batch of the bound permutation was drawn when another permutation of the same
        examples started since the last step (a new ShuffleOnceSampler every epoch), else None."""
        digest, n = self._facts.permutation_digest, self._facts.dataset_size
        other = None if digest is None else PERMUTATIONS.other_since(n, digest, self._serial)
        if other is None:
            return None
        assert digest is not None  # (another permutation is found only against the bound one's digest)
        return (
            f"sampling='shuffle_once' must use one permutation for the whole run (the shuffle-once bound of "
            f"Ye & Shokri 2022, arXiv 2205.13710, Thm 4.2, assumes it). Found a second ShuffleOnceSampler over "
            f"the {n} examples iterated since the previous step, with another permutation (digest {other[:12]} vs "
            f"{digest[:12]}), and no batch of the bound one: building a new sampler or loader every epoch "
            "reshuffles. Build the ShuffleOnceSampler once and iterate the loader make_private returned, or "
            "declare sampling='reshuffle' with DataLoader(shuffle=True)"
        )

    def take(self) -> tuple[DrawnBatch | None, int, DrawnBatch | None]:
        """The batch of the step being taken (None: nothing delivered since the last step), how many
        batches of its pass stay drawn ahead of it, and a batch delivered to the loop before it and used by
        no step (None: none), of its pass or of an earlier pass that a step used or that broke off."""
        pass_id = self._latest if self._latest is not None else self._last
        queue = self._pending.get(pass_id) if pass_id is not None else None
        if not queue or pass_id is None:
            return None, 0, None
        self._serial = PERMUTATIONS.serial
        delivered = self._unused_of(pass_id)
        unused = None
        if delivered is None:  # workers, deliveries not reported: the oldest drawn
            batch = queue.popleft()
        elif not delivered:
            return None, len(queue), None
        else:
            batch = delivered[-1]
            unused = delivered[0] if len(delivered) > 1 else None
            for _ in delivered:
                queue.popleft()  # (delivered batches are the oldest of the pass)
        self._used.add(pass_id)
        for other in [p for p in self._pending if p != pass_id]:
            left = self._unused_of(other)
            if left and unused is None and not (other in self._ended and other not in self._used):
                unused = left[0]  # a pass that a step used, or that broke off, left a delivered batch unused
            if other < pass_id:
                self._forget(other)  # passes that ended or broke off: their batches are not used
            elif left:
                for _ in left:
                    self._pending[other].popleft()  # (reported once)
        if unused is None:
            unused, self._unused = self._unused, None
        return batch, len(queue), unused


class RunMonitor:
    """Per accountant binding (``make_private`` or ``bind_data_loader``): what every noisy step used,
    observed where it happens, and the run's derivation.

    * the loader bound (:class:`LoaderWatch`) and the batches its sampler draws (:class:`BatchQueue`);
    * the step's optimizer, SGD and trained parameters, and the writes to the model between steps
      (:class:`~lastiter_plugins.adapters.opacus._steps.StepChecks`, created at the first step);
    * the optimizer facts in the core's terms (:func:`~lastiter_plugins.adapters.opacus._observe.observe`);
    * the examples each step summed, against the batch it drew (the derivation).

    ``plan``: set when ``make_private_with_epsilon`` called ``make_private`` (target_epsilon, target_delta,
    epochs); ``module``: a weak reference to the private module (None without one).
    """

    def __init__(
        self, loader: Any, facts: LoaderFacts, derivation: Derivation | None, module: Any, plan: Any = None
    ) -> None:
        self.facts, self.plan = facts, plan
        self.module = None if module is None else weakref.ref(module)
        self.buffers = Buffers(module)  # the module's buffers at binding, with their values
        self.checks: StepChecks | None = None
        #: the last step's optimizer facts (``_observe.raw_facts``) and what ``observe`` made of them
        self._raw: tuple | None = None
        self._observed: Observed | None = None
        self.queue = BatchQueue(loader, facts)
        self.watch = LoaderWatch(loader, facts)
        self.derivation = derivation or Derivation(
            facts.sampling, facts.dataset_size, facts.num_batches, facts.sample_rate
        )

    def remove(self) -> None:
        if self.checks is not None:
            self.checks.remove()
            self.checks = None

    def observe_optimizer(self, optim: Any, reg: Registration, step: int) -> Observed:
        """The DP optimizer of step ``step``: the one bound at the first step, with the same SGD and trained
        parameters and nothing between this check and the update; its facts in the core's terms."""
        if self.checks is None:
            module = self.module() if self.module is not None else None
            self.checks = StepChecks(optim, module, self.buffers, reg)
        self.checks.verify_optimizer(optim, step)
        raw = raw_facts(optim, reg)
        if raw is None or raw != self._raw:  # validated in full when a value it reads differs from the last step's
            self._observed = observe(optim, reg, self.facts)
            self._raw = raw
        assert self._observed is not None  # observed in full at the first step (no earlier raw facts to match)
        return self._observed

    def observe_examples(self, optim: Any, counter: ExampleCounter | None) -> str | None:
        """The loader bound, the examples the step summed and the batch it drew: None, or the reason to refuse."""
        change = self.watch.changed()
        if change is not None:
            return change
        assert self.checks is not None  # created by observe_optimizer, earlier in the same step
        gradients = self.checks.verify_examples(optim, self.watch, counter)
        return self.check_step(gradients, (optim, optim.original_optimizer))

    def check_step(self, gradients: int, optimizers: Any) -> str | None:
        """The batch the step drew, against the declaration: None, or the reason to refuse."""
        plateaus = internals.plateau_schedulers(optimizers)
        if plateaus:
            return (
                "the learning rate must not follow a rule that reads the training losses: a ReduceLROnPlateau "
                "scheduler holds this optimizer. The rule reads losses of intermediate models on the private data "
                "and could change the step size on a neighbouring dataset, whether or not it fired in this run, so "
                "no bound covers the run. Remove the scheduler (a schedule fixed in advance is refused too: "
                "register the constant learning rate you use)"
            )
        batch, ahead, unused = self.queue.take()
        if batch is None:
            other = self.queue.other_permutation()
            if other is not None:
                return other
        if batch is not None and self.queue.ahead and ahead > self.queue.ahead:
            return (
                "every noisy step must use one batch of the loader. Found "
                f"{ahead + 1} batches drawn and not yet used at step {self.derivation.steps + 1}, more than the "
                f"loader's workers fetch ahead ({self.queue.ahead}): the loop feeds several batches to one step"
            )
        return self.derivation.check_step(batch, gradients, unused)


# ---------------------------------------------------------------- the bound loader

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
    if isinstance(bs, BatchSampler) and internals.host_class(bs) is BatchSampler:
        sampler = cast(Sized, bs.sampler)  # the samplers describe_data_loader accepts have a length
        return dataset, len(dataset), bs, bs.batch_size, bs.drop_last, sampler, len(sampler), _sampler_state(sampler)
    if isinstance(bs, POISSON_SAMPLERS):
        size = bs.total_size if isinstance(bs, DistributedUniformWithReplacementSampler) else bs.num_samples
        return dataset, len(dataset), bs, None, None, None, size, bs.sample_rate
    return dataset, len(dataset), bs, None, None, None, None, None


class LoaderWatch:
    """The loader bound at ``make_private``, re-read at every step: the same dataset of the
    same size, the same batch sampler and sampler with the same parameters (which permutation a
    shuffle-once step used is the batch queue's: :class:`BatchQueue`)."""

    __slots__ = ("_loader", "_signature", "_types", "batch_sampler", "facts")

    def __init__(self, loader: DataLoader, facts: LoaderFacts) -> None:
        self.facts = facts
        self._loader = weakref.ref(loader)
        self._signature = _signature(loader)
        # (the classes choose _signature's branches)
        self._types = (internals.host_class(loader.batch_sampler), type(self._signature[5]))
        self.batch_sampler = weakref.ref(loader.batch_sampler)

    def changed(self) -> str | None:
        """None while the loader is unchanged, else what changed (for the error message)."""
        loader = self._loader()
        if loader is None:
            return (
                "the data loader bound at make_private no longer exists (the loop iterates another loader). "
                "Iterate the loader make_private returned"
            )
        now = _signature(loader)
        kinds = (internals.host_class(loader.batch_sampler), type(now[5]))
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
