r"""``ProjectionCallback``: the projection onto an l2 ball that the bounded-domain bounds assume."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from . import _observe as observe
from ._errors import AccountingError


class ProjectionCallback(tf.keras.callbacks.Callback):
    r"""Project all trainable weights of the model jointly onto the l2 ball of
    diameter ``diameter`` around ``center`` (default: the origin), before the
    first step and after every optimizer step.

    This is the projection :math:`\Pi` onto a closed convex set of diameter D
    that the bounded-domain bounds assume (kong-ribero-bounded,
    altschuler-talwar, liang-bounded), and the device that makes a declaration
    ``gradient_norms_within_clip=True`` checkable: on a ball of radius R the gradient norms are
    bounded whenever they grow at most linearly. The weights are scaled to
    radius ``R*(1 - 1e-6)`` when they leave the ball, so that float32 rounding
    never leaves them outside the radius R = D/2. :class:`LastIterateCallback`
    checks, inside every compiled step, that the step starts in the ball and
    from the projection of the previous step's end (so other code moving the
    weights between steps voids the epsilon).

    Args:
      diameter: D > 0.
      center: the ball's center, a sequence of arrays shaped like
        ``model.trainable_variables`` (None: the origin). It must not depend on
        the private data.

    Raises:
      AccountingError: at the start of training if ``steps_per_execution`` is
        not 1 (the callback would run only every N steps) or the center does not
        match the weights.
    """

    MARGIN = 1.0 - 1e-6

    def __init__(self, diameter: float, center: Sequence[Any] | None = None) -> None:
        super().__init__()
        value = observe.finite_positive(diameter)
        if value is None:
            raise ValueError(f"diameter must be a finite number > 0. Found {diameter!r}.")
        self.diameter = value
        self.radius = value / 2.0
        self._center_values = None if center is None else [np.asarray(c) for c in center]
        self._center: list[tf.Tensor] | None = None

    @property
    def center(self) -> list[tf.Tensor]:
        """The center, one tensor per trainable variable (set at the start of training)."""
        if self._center is None:
            self._set_center()
        assert self._center is not None  # _set_center set it (or raised)
        return self._center

    def _set_center(self) -> None:
        weights = self.model.trainable_variables
        if self._center_values is None:
            self._center = [tf.zeros_like(v) for v in weights]
            return
        shapes = [tuple(v.shape) for v in weights]
        given = [c.shape for c in self._center_values]
        if len(given) != len(shapes) or any(s != g for s, g in zip(shapes, given, strict=True)):
            raise AccountingError(f"center must match the shapes of model.trainable_variables {shapes}. Found {given}.")
        self._center = [tf.constant(c, dtype=v.dtype) for c, v in zip(self._center_values, weights, strict=True)]

    def on_train_begin(self, logs: dict | None = None) -> None:
        facts = observe.running_fit(self.model)
        if facts is not None and facts.steps_per_execution != 1:
            raise AccountingError(
                "steps_per_execution must be 1 with ProjectionCallback: Keras calls batch callbacks once "
                "per execution, so the weights would be projected only every N steps. "
                f"Found steps_per_execution={facts.steps_per_execution or 'tuned at run time'}."
            )
        self._set_center()
        self.project()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.project()

    def distance_from_center(self) -> float:
        """The l2 distance of the weights (all trainable variables together) from the center."""
        total = sum(
            float(tf.reduce_sum(tf.square(tf.cast(v, tf.float64) - tf.cast(c, tf.float64))))
            for v, c in zip(self.model.trainable_variables, self.center, strict=True)
        )
        return math.sqrt(total)

    def project(self) -> None:
        """Project the weights onto the ball now (a no-op inside it)."""
        distance = self.distance_from_center()
        if distance <= self.radius:
            return
        scale = self.radius * self.MARGIN / distance
        for v, c in zip(self.model.trainable_variables, self.center, strict=True):
            v.assign(c + (v - c) * tf.cast(scale, v.dtype))
