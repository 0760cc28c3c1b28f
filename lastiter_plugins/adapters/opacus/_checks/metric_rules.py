"""Rules that read a metric: a ``ReduceLROnPlateau`` holding the DP optimizer (or the torch optimizer it
wraps) whose ``step(metric)`` ran.

Such a rule changes the step size as a function of the metric it reads. Read from the private data (a
training or validation loss computed on it without noise), it makes the run's later steps depend on the data
outside the noisy sums, which no row covers, whether the rule fired or not: every row breaks and the run is
refused. Declared read from data outside the private set, or from the released iterates alone
(``register(metric_source="public")``), it is a learning-rate rule like any other: post-processing for the
every-iterate rows, the departure ``update="any"`` for the last-iterate ones. (Early stopping on a metric
cannot be observed: the same declaration is yours to keep; docs/opacus.md.)
"""

from __future__ import annotations

from typing import Any

from lastiter_plugins.adapters.opacus import _patches as patches
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._declaration import PUBLIC
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.host import Departure


class MetricRules(Check):
    gates = "every row; with metric_source='public', the last-iterate rows (update='any')"

    def __init__(self, optim: Any) -> None:
        self._optimizers = (optim, optim.original_optimizer)
        self._reads = patches.metric_reads(self._optimizers)  # (reads before the run are not its own)
        self.left = False

    def at_step(self, step: Step) -> Departure | None:
        if self.left or patches.metric_reads(self._optimizers) == self._reads:
            return None
        if step.registration.metric_source != PUBLIC:
            raise _Changed(
                "the learning rate must not follow a rule that reads an un-noised metric of the private data: a "
                "ReduceLROnPlateau holding this optimizer read a metric (scheduler.step(metric)) before step "
                f"{step.number}. A metric computed on the private data changes later steps as a function of that "
                "data outside the noisy sums, on a neighbouring dataset too whether or not the rule fired here, so "
                "no row covers the run. Compute the metric on data outside the private set (or from the released "
                "iterates alone) and register with metric_source='public', or use a schedule fixed in advance."
            )
        self.left = True
        return Departure(
            step.number,
            "a ReduceLROnPlateau read a metric declared computed outside the private data (metric_source='public')",
            {"update": "any", "learning_rate": None},
        )
