r"""Random allocation (a :class:`RandomAllocationDataset` as fit's x): every step trained on the batch the pipeline
delivered for it, in order, and those batches are random allocation's (whole epochs, each example at most k
times an epoch and exactly k in a complete one, a fresh allocation every epoch: ``AllocationRecord``). A step's
rows are its examples with loss weight 1 and padding with weight 0: every weight is 0 or 1, they sum to the
delivered examples, the loss entry of every padding row is 0, and no regularization loss is added to the
entries (Keras adds it to every entry, a padding row's too, which would then add a clipped gradient to the
sum; docs/derivations/keras-adapter.md#keras-random-allocation). Each is a precondition of every row:
refused."""

from __future__ import annotations

import math
from collections.abc import Iterable

from lastiter_plugins.adapters._allocation import AllocationRecord
from lastiter_plugins.host import Departure

from .._allocation_input import RandomAllocationDataset
from .._errors import AccountingError
from .._observe import StepFacts
from ._check import VOID, Check, Start, Verdict


class AllocationCheck(Check):
    pipeline: RandomAllocationDataset | None = None
    batches_cut = 0  # the steps checked whose batch had more than max_batch_size examples (cut to it)

    def start(self, start: Start) -> Iterable[Departure]:
        self.pipeline = start.fit.allocation
        if self.pipeline is not None:
            p = self.pipeline
            self.first = p.deliveries  # batches delivered before fit (iterated by hand) are not this run's
            self.record = AllocationRecord(p.dataset_size, p.steps_per_epoch, p.allocations_per_epoch)
            if start.model.losses:  # known before the first step (losses added inside call: checked every step)
                raise AccountingError(_regularized(f"the model has {len(start.model.losses)}") + ".")
        return ()

    def step(self, k: int, facts: StepFacts) -> Verdict:
        p = self.pipeline
        if p is None:
            return None
        delivered = p.delivery(self.first + k - 1)
        if delivered is None:
            return (
                f"every step must train on a batch the RandomAllocationDataset delivered: step {k} ran after "
                f"{p.deliveries - self.first} deliveries in this fit (a second input, train_on_batch, or the dataset "
                "iterated elsewhere during fit)" + VOID
            )
        drawn, kept = delivered
        self.batches_cut += len(kept) < len(drawn.indices)
        problem = self.record.check(k, drawn)  # the allocation as drawn; a cut keeps a subset (fixed-length-batches)
        if problem is not None:
            return problem + VOID
        if len(kept) != min(len(drawn.indices), p.max_batch_size) or not set(kept) <= set(drawn.indices):
            return f"step {k}'s batch must be its drawn examples, cut to at most {p.max_batch_size}" + VOID
        if facts.weight_off_binary > 0 or facts.weight_sum != len(kept):
            return (
                f"step {k} must train on the batch the RandomAllocationDataset delivered for it: "
                f"{len(kept)} examples of loss weight 1, padding of weight 0. It was fed weights summing "
                f"to {facts.weight_sum:g} (a weight {facts.weight_off_binary:g} away from both 0 and 1 at most): the "
                "dataset's elements were changed or reordered before the step" + VOID
            )
        if facts.regularizers > 0:
            return _regularized(f"step {k}'s loss has {facts.regularizers:g}") + VOID
        if math.isinf(facts.padding_loss):
            return (
                f"the loss entry of every padding row (weight 0) must be 0: step {k} had a padding row whose loss is "
                "not finite (inf or nan, which weight 0 does not cancel: its gradient spreads to every weight). The "
                "padding rows are all-zero inputs with label 0: make the model and the loss finite there (an "
                "epsilon in a normalization by the input's norm, say)" + VOID
            )
        if facts.padding_loss != 0:
            found = (
                "a loss vector that does not match the rows"
                if facts.padding_loss < 0
                else (f"an entry of {facts.padding_loss:g}")
            )
            return (
                f"the loss entry of every padding row (weight 0) must be 0: step {k} had {found}. A custom "
                "train_step or compute_loss that ignores the sample weights trains on the padding" + VOID
            )
        return None


def _regularized(found: str) -> str:
    return (
        f"the loss must add no regularization loss with a RandomAllocationDataset: {found} (model.losses: a "
        "kernel_regularizer, an activity_regularizer, add_loss), which Keras adds to every entry of the loss vector, "
        "the padding rows' too: each would add a clipped gradient to the step's sum, and their number depends on the "
        "allocation. Remove the regularizer (or account the run with fit's arrays and sampling='reshuffle')"
    )
