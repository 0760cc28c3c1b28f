"""A declared diameter: every step projects all trainable parameters onto a ball of that diameter (gates the
rows that need a diameter: without it, they leave ``best``)."""

from __future__ import annotations

from typing import Any

from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._projection import PROJECTIONS
from lastiter_plugins.host import Departure


class DeclaredProjection(Check):
    """With ``diameter`` declared: a projection covering exactly the optimizer's trainable parameters, of
    diameter <= the declared one, and the parameters inside its ball after every step."""

    gates = "the rows that need a diameter (diameter=None)"

    def __init__(self, optim: Any, diameter: float) -> None:
        self.base = optim.original_optimizer
        self.diameter = diameter
        self.left = False

    def at_step(self, step: Step) -> Departure | None:
        if self.left:
            return None
        why = self.broken(step.number - 1)
        if why is None:
            return None
        self.left = True
        return Departure(max(step.number - 1, 1), why, {"diameter": None})

    def broken(self, steps: int) -> str | None:
        """Why the declared domain did not hold after step ``steps`` (None: it held)."""
        projection = PROJECTIONS.get(self.base)
        if projection is None or not projection.covers(self.base):
            return (
                f"no projection onto a ball of the declared diameter {self.diameter:g} covers exactly the "
                "optimizer's trainable parameters (lastiter_plugins.adapters.opacus.attach_projection)"
            )
        if projection.diameter > self.diameter:
            return f"the projection's diameter {projection.diameter:g} exceeds the declared diameter {self.diameter:g}"
        distance = projection.distance()
        if distance > projection.diameter / 2.0:
            return (
                f"the parameters lay at distance {distance:.6g} from the projection's centre after step {steps}, "
                f"outside its ball (radius {projection.diameter / 2.0:g}): something moved them after the projection"
            )
        return None
