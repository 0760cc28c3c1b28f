"""Projection onto an l2 ball after every optimizer step (the bounded-domain bounds' domain)."""

from __future__ import annotations

import itertools
import math
import numbers
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from opacus.optimizers import DPOptimizer

from lastiter_plugins.adapters.opacus._internals import versions

#: Orders the writes to parameters seen by the adapter's step post-hooks (the latest one holds the
#: versions): ``next(STAMPS)``.
STAMPS = itertools.count(1)


class Projection:
    r"""Joint projection of the trainable parameters onto an l2 ball.

    After every step of the optimizer it is attached to, the vector of all
    trainable parameters x is replaced by ``center + (x - center) * min(1, r / |x - center|)``
    with radius r = diameter / 2: the Euclidean projection onto a ball of the given
    diameter (a closed convex set), as the bounded-domain bounds assume.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, diameter: float, center: Sequence[torch.Tensor] | None):
        self.diameter = float(diameter)
        self.params = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
        if not self.params:
            raise ValueError("the optimizer must have at least one trainable parameter to project. Found none.")
        if center is None:
            self.center = [torch.zeros_like(p) for p in self.params]
        else:
            center = list(center)
            if len(center) != len(self.params) or any(
                c.shape != p.shape for c, p in zip(center, self.params, strict=False)
            ):
                raise ValueError(
                    "center must hold one tensor per trainable parameter, with the same shapes. "
                    f"Found {len(center)} tensors for {len(self.params)} parameters."
                )
            self.center = [
                c.detach().clone().to(device=p.device, dtype=p.dtype) for c, p in zip(center, self.params, strict=False)
            ]
        # next(STAMPS) of the last apply, with the parameters' versions before and after it
        self.stamp = 0
        self.before: tuple[int, ...] = ()
        self.versions: tuple[int, ...] = ()
        self._handle = optimizer.register_step_post_hook(lambda *_: self.apply())
        self._optimizer = weakref.ref(optimizer)

    def distance(self) -> float:
        """|x - center| of the current parameters, in float64."""
        pairs = zip(self.params, self.center, strict=True)
        squares = [torch.sum((p.detach() - c).double() ** 2).to("cpu") for p, c in pairs]
        return math.sqrt(float(sum(squares)))

    @torch.no_grad()
    def apply(self) -> None:
        """Project the parameters in place (a no-op inside the ball).

        The norm is computed in float64, and the shrink factor keeps a relative margin
        of max(1e-6, 2 eps(dtype)) (like TF Privacy's projection) so that rounding the
        result to the parameters' dtype cannot leave it outside the ball; the result is
        checked and shrunk again if rounding still did.
        """
        radius = self.diameter / 2.0
        eps = max(torch.finfo(p.dtype).eps if p.is_floating_point() else 0.0 for p in self.params)
        margin = max(1e-6, 2.0 * eps)
        before = versions(self.params)
        try:
            for _ in range(8):
                norm = self.distance()
                if norm <= radius:
                    return
                scale = radius * (1.0 - margin) / norm
                for p, c in zip(self.params, self.center, strict=True):
                    p.copy_(c + (p - c) * scale)
                margin *= 4.0
            norm = self.distance()
            if norm > radius:
                raise RuntimeError(
                    f"the projection must leave the parameters within radius {radius:g}; rounding to their dtype "
                    f"leaves them at distance {norm:.9g}. Use float32 or float64 parameters."
                )
        finally:
            self.stamp, self.before, self.versions = next(STAMPS), before, versions(self.params)

    def covers(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether it projects exactly the trainable parameters of ``optimizer``."""
        current = {id(p) for group in optimizer.param_groups for p in group["params"] if p.requires_grad}
        return self._optimizer() is optimizer and current == {id(p) for p in self.params}

    def remove(self) -> None:
        """Detach the projection from its optimizer."""
        self._handle.remove()
        optimizer = self._optimizer()
        if optimizer is not None and PROJECTIONS.get(optimizer) is self:
            del PROJECTIONS[optimizer]


PROJECTIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def base_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    return optimizer.original_optimizer if isinstance(optimizer, DPOptimizer) else optimizer


def attach_projection(
    optimizer: torch.optim.Optimizer, diameter: float, center: Sequence[torch.Tensor] | None = None
) -> Projection:
    r"""Project all trainable parameters jointly onto the l2 ball of ``diameter``
    (centred at ``center``, default the origin) after every optimizer step, and
    once now (so the starting point lies in the domain too).

    Works on the torch optimizer or on the DPOptimizer wrapping it (the hook goes on
    the wrapped ``torch.optim`` optimizer, which performs the step). Attaching again
    replaces the previous projection. The accountant checks, at every step, that a
    projection of diameter <= the declared one covers exactly the parameters of the
    optimizer it accounts for, and that the parameters are inside its ball.
    """
    if isinstance(diameter, bool) or not isinstance(diameter, numbers.Real) or not (0 < diameter < math.inf):
        raise ValueError(f"diameter must be a finite number > 0. Found {diameter!r}.")
    base = base_optimizer(optimizer)
    previous = PROJECTIONS.get(base)
    projection = Projection(base, diameter, center)
    if previous is not None:
        previous.remove()
    PROJECTIONS[base] = projection
    projection.apply()
    return projection
