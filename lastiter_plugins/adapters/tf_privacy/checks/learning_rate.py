r"""The learning rate: the last-iterate rows analyse one constant step size. A rate that follows a schedule
fixed in advance (a ``LearningRateSchedule``, Keras' legacy ``decay``, a ``LearningRateScheduler`` callback,
which the Keras API makes a function of the epoch) leaves only the every-iterate rows, from the first step that
used another rate. A rate changed by anything else may have been chosen from the private data: refused, unless
the user declared ``metric_source="public"`` (every rule reading a metric reads public data or the released
iterates only: then it is post-processing of the every-iterate release)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import tensorflow as tf

from lastiter_plugins.host import Departure

from .._observe import StepFacts
from ._check import VOID, Check, Start, Verdict, weakening


class LearningRateCheck(Check):
    gates = weakening(update="any", learning_rate=None)

    def start(self, start: Start) -> Iterable[Departure]:
        self.planned = start.optimizer.learning_rate
        self.left = start.optimizer.schedule is not None  # the rows it gates left: nothing more to watch
        schedulers = [cb for cb in start.fit.callbacks if isinstance(cb, tf.keras.callbacks.LearningRateScheduler)]
        self.allowed = "a LearningRateScheduler (a schedule of the epoch)" if schedulers else ""
        if start.metric_source == "public":
            self.allowed = self.allowed or "a rule declared to read public data only (metric_source='public')"
        if start.optimizer.schedule is not None:
            yield Departure(
                step=1,
                fact=f"the learning rate follows {start.optimizer.schedule}, a schedule fixed in advance",
                changes=self.gates,
            )

    def step(self, k: int, facts: StepFacts) -> Verdict:
        if self.left or _same_rate(facts.learning_rate, self.planned):
            return None
        self.left = True
        if self.allowed:
            return Departure(
                step=k,
                fact=f"the learning rate changed from {self.planned:g} to {facts.learning_rate:g} ({self.allowed})",
                changes=self.gates,
            )
        return (
            f"the learning rate must stay constant or follow a schedule fixed in advance: step {k} used "
            f"{facts.learning_rate!r} after starting with {self.planned!r}, changed by code that fit's callbacks do "
            "not show to be a schedule (no LearningRateScheduler), which may have chosen it from the private data. "
            "Give the optimizer a tf.keras.optimizers.schedules.LearningRateSchedule or use a LearningRateScheduler "
            "(then only the every-iterate rows stay), or declare metric_source='public' if the rule reads only "
            "data outside the private set or the released iterates" + VOID
        )


def _same_rate(found: float, planned: float) -> bool:
    """The learning-rate variable holds float32(eta)."""
    return found in (planned, float(np.float32(planned)))
