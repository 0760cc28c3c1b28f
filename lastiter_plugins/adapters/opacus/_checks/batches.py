"""The batch each noisy step used, drawn by the bound loader's sampler, against the declared scheme (every
row): the batches the sampler draws are recorded at that object (:func:`_patches.record_batches`) and matched
to the noisy steps by a queue per pass; the derivation
(:mod:`lastiter_plugins.adapters._derivation`, shared by the hosts) compares the record with what is accounted
(docs/derivations/opacus-adapter.md#run-monitor)."""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from typing import Any

import torch
from torch.utils.data import BatchSampler, RandomSampler

import lastiter_plugins as lp
from lastiter_plugins.adapters._derivation import Derivation, DrawnBatch
from lastiter_plugins.adapters.opacus import _patches as patches
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._loaders import PERMUTATIONS, LoaderFacts
from lastiter_plugins.adapters.opacus._rows import Fingerprint, fingerprint
from lastiter_plugins.host import Departure

#: batches a loop may fetch ahead of its step (a one- or two-batch prefetcher) across the end of a pass
_PREFETCHED = 2


Sampling = lp.Sampling
_EPOCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)


class BatchQueue:
    """The batches drawn by one recorded batch sampler and not yet matched to a step, per pass.

    A noisy step takes its batch from the pass that handed the loop a batch last (an evaluation pass run
    to its end before it, a pass that broke off: their batches are never matched): the newest batch of
    that pass delivered to the loop. An iterator of torch's ``DataLoader`` reports each batch it hands the
    loop (``_patches.DELIVERED``, in the order drawn); without one (a ``BatchMemoryManager``, a
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
        self._rows: dict[tuple[int, int], Fingerprint | None] = {}  # (pass, position) -> the rows delivered
        self._matched: tuple[Fingerprint, ...] = ()  # the rows of the batches the last steps used
        self._used: set[int] = set()  # passes a step used
        self._ended: set[int] = set()
        self._unused: DrawnBatch | None = None  # a delivered batch of a dropped pass that no step used
        self._last: int | None = None  # the pass that drew last
        self._latest: int | None = None  # the pass that handed the loop a batch last
        self._facts = facts
        #: the step's batch was found by its rows after an older delivered batch no step used (None: not so)
        self.passed_over: DrawnBatch | None = None
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
            patches.record_batches(loader.batch_sampler, self._drawn)
            if facts.sampling in (Sampling.CYCLIC, Sampling.RESHUFFLE):
                self._bound = weakref.ref(loader.batch_sampler)
                self._dataset = weakref.ref(loader.dataset)
                patches.adopt_samplers(self.adopt)
        #: told of each adopted batch sampler (the sampling generator check watches its passes too)
        self.on_adopt: list[Any] = []

    def adopt(self, batch_sampler: Any) -> bool:
        """Record a batch sampler built after binding that draws as the bound one does over the same dataset
        (a new ``DataLoader`` built every epoch, a DataModule's ``train_dataloader()``): a ``BatchSampler`` of
        the bound batch size and ``drop_last`` over a sampler of the bound one's class (``SequentialSampler``,
        or ``RandomSampler`` without replacement over all of it) whose ``data_source`` is the bound dataset."""
        bound, dataset = self._bound(), self._dataset()
        if bound is None or dataset is None or type(batch_sampler) is not BatchSampler:
            return False
        sampler = batch_sampler.sampler
        same = (
            type(sampler) is type(bound.sampler)
            and getattr(sampler, "data_source", None) is dataset
            and batch_sampler.batch_size == bound.batch_size
            and batch_sampler.drop_last == bound.drop_last
        )
        if not same or (type(sampler) is RandomSampler and (sampler.replacement or sampler._num_samples is not None)):
            return False
        patches.record_batches(batch_sampler, self._drawn)
        for told in self.on_adopt:
            told(batch_sampler)
        return True

    def batch_drawn(self, pass_id: int, start: int) -> None:
        """A shuffle-once batch of the bound loader's plan started being drawn (a loader with another batch
        size shows in the gradient counts)."""
        position, end = self._plan[start]
        self._drawn(pass_id, position, self._permutation[start:end])

    def pass_ended(self, pass_id: int) -> None:
        self._ended.add(pass_id)

    def _drawn(self, pass_id: int, position: int, batch: Any) -> None:
        if position == patches.DELIVERED:
            count, data = batch
            self._delivered[pass_id] = count
            self._rows[(pass_id, count - 1)] = fingerprint(data)
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
                if unused and ended in self._used and len(unused) <= _PREFETCHED:
                    continue  # (a loop that fetches ahead: its last batches are trained after the next pass starts)
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
        for key in [k for k in self._rows if k[0] == pass_id]:
            del self._rows[key]

    def _find(self, rows: tuple[Fingerprint | None, ...]) -> tuple[int, int] | None:
        """The delivered batch no step used whose rows one of the step's forwards received: (pass, index among
        that pass' delivered unused batches); None when the rows match none of them, or more than one (rows
        equal at every value sampled)."""
        found = []
        for pass_id in sorted(self._pending):
            delivered = self._unused_of(pass_id)
            for k, drawn in enumerate(delivered or ()):
                if self._rows.get((pass_id, drawn.position)) in rows:
                    found.append((pass_id, k))
        return found[0] if len(found) == 1 else None

    def delivered(self, rows: Fingerprint | None) -> bool:
        """Whether these rows are those of a batch delivered to the loop and not yet used by a step."""
        return rows is not None and any(rows == r for r in self._rows.values())

    def reused(self, rows: tuple[Fingerprint | None, ...]) -> bool:
        """Whether one of the last steps used a batch with these rows and no delivered batch has them (the loop
        trains one batch twice)."""
        return any(r is not None and r in self._matched for r in rows) and self._find(rows) is None

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

    def take(self, rows: tuple[Fingerprint | None, ...] = ()) -> tuple[DrawnBatch | None, int, DrawnBatch | None]:
        """The batch of the step being taken (None: nothing delivered since the last step), how many
        batches of its pass stay drawn ahead of it, and a batch delivered to the loop before it and used by
        no step (None: none), of its pass or of an earlier pass that a step used or that broke off.

        ``rows``: the fingerprints of the rows the step's forwards received. The delivered batch holding them
        is the step's (a loop that fetches ahead, or trains a materialised pass in order: the batches after
        it stay for the next steps); without a match, the newest delivered batch of the pass that delivered
        last."""
        found = self._find(rows)
        pass_id = found[0] if found is not None else self._latest if self._latest is not None else self._last
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
            k = found[1] if found is not None else len(delivered) - 1
            batch = delivered[k]
            unused = delivered[0] if k > 0 else None
            # (a batch trained with delivered batches unused both before and after it: the pass is reordered)
            self.passed_over = unused if found is not None and k < len(delivered) - 1 else None
            for _ in range(k + 1):
                queue.popleft()  # (delivered batches are the oldest of the pass)
        self._used.add(pass_id)
        key = self._rows.pop((pass_id, batch.position), None)
        if key is not None:
            self._matched = (*self._matched[-_PREFETCHED:], key)
        for other in [p for p in self._pending if p != pass_id]:
            left = self._unused_of(other)
            if other > pass_id and found is not None:
                continue  # (fetched ahead: a later pass' batches wait for the next steps)
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


class DrawnBatches(Check):
    """One batch drawn by the bound loader per noisy step, with one clipped gradient per example, and the
    scheme's passes (:class:`~lastiter_plugins.adapters._derivation.Derivation`)."""

    def __init__(self, loader: Any, facts: LoaderFacts, derivation: Derivation | None) -> None:
        self.queue = BatchQueue(loader, facts)
        self.last: DrawnBatch | None = None  # the batch of the step checked last
        self.derivation = derivation or Derivation(
            facts.sampling, facts.dataset_size, facts.num_batches, facts.sample_rate
        )

    def at_step(self, step: Step) -> Departure | None:
        assert step.gradients is not None  # counted by the examples check, earlier in the same step
        problem = self.check(step.gradients, step.rows)
        if problem is not None:
            raise _Changed(f"{problem} (step {step.number}).")
        step.batch = self.last
        return None

    def check(self, gradients: int, rows: tuple[Fingerprint | None, ...] = ()) -> str | None:
        """The batch the step drew (``rows``: the fingerprints of what its forwards received), against the
        declaration: None, or the reason to refuse."""
        again = self.queue.reused(rows)
        batch, ahead, unused = self.queue.take(rows)
        self.last = batch
        over = self.queue.passed_over
        if batch is not None and over is not None and self.derivation.sampling in _EPOCH_SCHEMES:
            return (
                f"sampling={self.derivation.sampling.value} assumes each pass' batches are trained in the order "
                f"drawn, each once. Found step {self.derivation.steps + 1} trained on batch {batch.position + 1} of "
                f"its pass while batch {over.position + 1}, delivered to the loop before it, was used by no step: "
                "the loop reorders the batches it received (a materialised pass trained in another order) or "
                "skips one. Train the batches in the order the loader yields them"
            )
        if batch is None and again:
            return (
                "every noisy step must use its own batch of the loader, each batch once per pass. Found step "
                f"{self.derivation.steps + 1} trained on the rows of the batch an earlier step used, with no new "
                "batch delivered since: the loop trains each batch more than once (a second optimizer step on the "
                "same batch). Take one optimizer step per batch"
            )
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
