"""The run monitor of the Opacus adapter: what each noisy step used, observed where it happens.

* the batches the bound loader's batch sampler draws (recorded at that object, every iteration),
  matched to noisy steps: a queue per pass of the sampler (docs/derivations/opacus-adapter.md#run-monitor);
* the number of per-example clipped gradients the step summed (counted by the step checks);
* the model the run starts from: a model an earlier accountant of this library has trained
  (:data:`MARKS`) continues that accounting, or is refused;
* data-dependent control: a ``ReduceLROnPlateau`` scheduler on the optimizer.

The derivation (:mod:`lastiter_plugins.adapters._derivation`) compares the record with what is
accounted; this module only observes and matches.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque
from typing import Any

import torch

from lastiter_plugins.adapters._derivation import Derivation, DrawnBatch
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._loaders import PERMUTATIONS, LoaderFacts

#: user model (unwrapped) -> the accountant that accounts for its training (weakly keyed: a model
#: garbage-collected takes its mark along; weights copied with load_state_dict carry none)
MARKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class BatchQueue:
    """The batches drawn by one recorded batch sampler and not yet matched to a step, per pass.

    A noisy step takes its batch from the pass that drew last (a new pass, an evaluation pass run to
    its end before it, a pass that broke off: their batches are never matched). Without worker
    processes a loader draws a batch exactly when the loop asks for it, so the step's batch is the
    newest of that pass and any older one was drawn and not used; with workers the loader draws up to
    ``num_workers * prefetch_factor`` batches ahead, so the step's batch is the oldest of that pass.
    """

    def __init__(self, loader: Any, facts: LoaderFacts) -> None:
        workers = int(getattr(loader, "num_workers", 0) or 0)
        self.ahead = workers * int(getattr(loader, "prefetch_factor", None) or 2) if workers else 0
        self._pending: dict[int, deque[DrawnBatch]] = {}
        self._ended: set[int] = set()
        self._last: int | None = None
        if facts.permutation_digest is not None:  # the permutation is the run's, whichever loader draws it
            self._permutation = loader.batch_sampler.sampler.permutation
            bounds = [0]
            for position in range(facts.num_batches):
                bounds.append(bounds[-1] + facts.batch_at(position))
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
        if batch is None:  # (record_batches: the pass has ended)
            self.pass_ended(pass_id)
            return
        if pass_id not in self._pending and self._ended:
            # a new pass: the passes that ended before it (evaluation passes, an epoch run out) hold no batch a
            # step will use; dropping them bounds the memory of loops that iterate without steps
            for ended in [p for p in self._pending if p in self._ended]:
                del self._pending[ended]
            self._ended.clear()
        indices = batch if type(batch) is tuple else tuple(batch.tolist() if torch.is_tensor(batch) else batch)
        self._pending.setdefault(pass_id, deque()).append(DrawnBatch(pass_id, position, indices))
        self._last = pass_id

    def take(self) -> tuple[DrawnBatch | None, int]:
        """The batch of the step being taken (None: nothing drawn since the last step) and how many
        batches of its pass stay drawn ahead of it."""
        queue = self._pending.get(self._last) if self._last is not None else None
        if not queue:
            return None, 0
        if self.ahead:
            batch = queue.popleft()
        else:
            batch = queue.pop()
            queue.clear()  # drawn before the step's batch and used by no step
        for pass_id in [p for p in self._pending if p < batch.pass_id]:
            del self._pending[pass_id]  # passes that ended or broke off: their batches are not used
        return batch, len(queue)


class RunMonitor:
    """Per accountant binding: the loader's batch queue and the run's derivation."""

    def __init__(self, loader: Any, facts: LoaderFacts, derivation: Derivation | None) -> None:
        self.queue = BatchQueue(loader, facts)
        self.derivation = derivation or Derivation(
            facts.sampling, facts.dataset_size, facts.num_batches, facts.sample_rate
        )

    def check_step(self, gradients: int, optimizers: Any) -> str | None:
        """Observe the step being taken and compare it with the declaration: None, or the reason to refuse."""
        plateaus = internals.plateau_schedulers(optimizers)
        if plateaus:
            return (
                "the learning rate must not follow a rule that reads the training losses: a ReduceLROnPlateau "
                "scheduler holds this optimizer. The rule reads losses of intermediate models on the private data "
                "and could change the step size on a neighbouring dataset, whether or not it fired in this run, so "
                "no bound covers the run. Remove the scheduler (a schedule fixed in advance is refused too: "
                "register the constant learning rate you use)"
            )
        batch, ahead = self.queue.take()
        if batch is not None and self.queue.ahead and ahead > self.queue.ahead:
            return (
                "every noisy step must use one batch of the loader. Found "
                f"{ahead + 1} batches drawn and not yet used at step {self.derivation.steps + 1}, more than the "
                f"loader's workers fetch ahead ({self.queue.ahead}): the loop feeds several batches to one step"
            )
        return self.derivation.check_step(batch, gradients)
