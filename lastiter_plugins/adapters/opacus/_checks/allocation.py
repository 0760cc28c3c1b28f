"""Random allocation: the batches the steps used are the sampler's allocations, epoch by epoch (every row):
whole epochs of t batches in the order drawn, starting where the accounted epochs start, each example in at
most k batches of an epoch (exactly k in a completed one), a fresh allocation every epoch
(:class:`lastiter_plugins.adapters._allocation.AllocationRecord`, shared by the hosts). The batch queue
(``batches``) matched the step to its batch, checked before this one."""

from __future__ import annotations

from lastiter_plugins.adapters._allocation import AllocationRecord
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts
from lastiter_plugins.host import Departure


class DrawnAllocation(Check):
    """Each step's batch, against the random allocation the loader's ``RandomAllocationSampler`` draws."""

    def __init__(self, facts: LoaderFacts) -> None:
        self.record = AllocationRecord(facts.dataset_size, facts.num_batches, facts.allocations_per_epoch)

    def at_step(self, step: Step) -> Departure | None:
        assert step.batch is not None  # the batches check refuses a step without one, earlier in the same step
        problem = self.record.check(step.number, step.batch)
        if problem is not None:
            raise _Changed(f"{problem} (step {step.number}).")
        return None
