r"""The iterate between steps: every step starts where the previous one ended, projected onto the declared ball
when the bounded-domain rows are used (exactly one ``ProjectionCallback``, of diameter at most the declared
one), and the final model is the last step's, inside the ball. A weight moved between steps or after fit by
anything else makes the model another than the one the steps made: refused (no row describes it)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import tensorflow as tf

from lastiter_plugins.host import Departure

from .._errors import AccountingError
from .._observe import Ball, StepFacts
from .._projection import ProjectionCallback
from ._check import VOID, Check, Start, Verdict

_TOLERANCE = 1e-5  # float32 rounding of the projection, relative to the ball's size


class ProjectionCheck(Check):
    def start(self, start: Start) -> Iterable[Departure]:
        self.diameter = start.assumptions.diameter
        self.projection = check_projection(start.fit.callbacks, self.diameter)
        self.tolerance = 0.0  # float32 rounding of the projection; 0 without one
        if self.projection is not None:
            self.projection._set_center()
            self.tolerance = _TOLERANCE * (self.projection.radius + _center_norm(self.projection))
        return ()

    @property
    def ball(self) -> Ball | None:
        """The ball every step must start in, for the step probe (None without a projection)."""
        if self.projection is None:
            return None
        return Ball(self.projection.center, self.projection.radius, ProjectionCallback.MARGIN)

    def step(self, k: int, step: StepFacts) -> Verdict:
        if step.moved > self.tolerance:
            projected = " (projected onto the ball)" if self.projection else ""
            return (
                f"step {k} must start where step {k - 1} ended{projected}: "
                f"the weights moved by {step.moved:.3g} between the two steps (a callback or other code "
                "changed them). Only ProjectionCallback may move the weights between steps" + VOID
            )
        if self.projection is not None:
            assert self.diameter is not None  # check_projection refused a projection without it
            radius = self.diameter / 2
            if step.start_distance > radius:
                return (
                    f"every step must start inside the projection ball of radius {radius:g} (diameter "
                    f"{self.diameter:g}): step {k} started at distance {step.start_distance:g} "
                    "from its center (code after ProjectionCallback moved the weights out). Put nothing that "
                    "changes the weights after ProjectionCallback" + VOID
                )
        return None

    def when_read(self, model: Any, steps: int, moved: tuple[float, bool] | None) -> str | None:
        """The model lies in the ball and, once training ended, still holds the weights of the last step."""
        if self.projection is not None:
            assert self.diameter is not None
            radius = self.diameter / 2
            distance = self.projection.distance_from_center()
            if distance > radius:
                return (
                    f"the final model must lie in the projection ball of radius {radius:g}: it is at distance "
                    f"{distance:g} from the center (the weights were changed after the last projection)" + VOID
                )
        if moved is None:
            return None
        distance, others = moved
        far = distance > self.tolerance
        if far or others:
            return (
                "the model's weights must be those of the last counted step: "
                + (f"the trainable weights moved by {distance:.3g}" if far else "")
                + (" and " if others and far else "")
                + ("a non-trainable weight changed" if others else "")
                + " after fit's last step (an assign, another training run, or a callback's on_train_end). "
                "The epsilon describes the model the counted steps produced, not a model changed afterwards" + VOID
            )
        return None


def _center_norm(projection: ProjectionCallback) -> float:
    return math.sqrt(sum(float(tf.reduce_sum(tf.square(tf.cast(c, tf.float64)))) for c in projection.center))


def check_projection(callbacks: Sequence[Any], declared: float | None) -> ProjectionCallback | None:
    projections = [cb for cb in callbacks if isinstance(cb, ProjectionCallback)]
    if declared is None:
        if projections:
            raise AccountingError(
                "diameter must be declared when a ProjectionCallback is used (the bounds must know "
                f"the update projects). Found a ProjectionCallback of diameter {projections[0].diameter:g} "
                "and diameter=None."
            )
        return None
    if len(projections) != 1:
        raise AccountingError(
            f"diameter={declared:g} needs exactly one ProjectionCallback in the same fit call (the "
            "bounded-domain bounds assume every iterate is projected onto one convex set; two "
            f"projections in a row do not project onto their intersection). Found {len(projections)}."
        )
    if projections[0].diameter > declared:
        raise AccountingError(
            f"diameter must be >= the ProjectionCallback's diameter = {projections[0].diameter:g}. "
            f"Found diameter={declared:g}."
        )
    return projections[0]
