r"""The certified linear model (``model="glm"``): the loss assumptions derived from the model and its compiled
loss (:mod:`.._glm`) hold while every step runs the model they were derived for (the feature clip, the Dense
layer and the loss once each, on the clip's output, labels in range, the loss' values differentiated as they
are). A step that does not leaves the loss assumptions unproven from that step on: the rows that need them
leave ``best`` (a departure); clipping still bounds each example's gradient, so the rows that need no loss
assumption stay."""

from __future__ import annotations

from lastiter_plugins.host import Departure

from .. import _glm
from .._observe import StepFacts
from ._check import Check, Start, Verdict, weakening


class LinearModelCheck(Check):
    gates = weakening(
        smoothness=None, strong_convexity=0.0, gradient_norms_within_clip=False, clipped_loss_convex_smooth=False
    )

    def __init__(self, structure: _glm.Structure) -> None:
        self.structure = structure
        self.probe: _glm.Probe | None = None
        self.left = False
        self.rows_read: _glm.observe.StepRecord | None = None

    def install(self, start: Start) -> None:
        self.probe = _glm.Probe(start.model, self.structure, capacity=start.fit.steps_per_epoch)

    def read(self, steps: int) -> str | None:
        if self.probe is None or self.left:
            return None
        self.rows_read = self.probe.read()
        if self.rows_read.steps != steps:
            return f"the linear-model checks recorded {self.rows_read.steps} steps and the step checks {steps}"
        return None

    def step(self, k: int, facts: StepFacts) -> Verdict:
        if self.probe is None or self.left or self.rows_read is None:
            return None
        problem = self.probe.problem(k, self.rows_read.row(k))
        if problem is None:
            return None
        self.left = True
        return Departure(step=k, fact=f"the certified linear model did not run: {problem}", changes=self.gates)

    def remove(self) -> None:
        if self.probe is not None:
            self.probe.remove()
