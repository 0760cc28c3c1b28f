"""Per-layer clipping (``make_private(clipping="per_layer")``): each parameter's per-example gradient is
clipped to its own norm C_i, and Opacus noises the sum with std z * sqrt(sum C_i^2), the sensitivity of one
example (the mechanism records both, ``Observed.mechanism``). The every-iterate rows cover it as they cover
flat clipping. The last-iterate rows analyse the update of flat-clipped gradients (a clipped gradient step
of the losses they assume); per-layer clipping that may be active is another map: the departure
``update="any"`` from the first step, unless ``gradient_norms_within_clip=True`` is declared (then no
clipping acts and the update is the gradient step; the within-clip check watches every layer's norm)."""

from __future__ import annotations

from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.host import Departure


class PerLayerClipping(Check):
    gates = "the last-iterate rows (update='any'), unless clipping is declared never active"

    def __init__(self) -> None:
        self.done = False

    def at_step(self, step: Step) -> Departure | None:
        if self.done or step.observed.clipping != "per_layer":
            return None
        self.done = True
        if step.registration.assumptions.gradient_norms_within_clip:
            return None
        return Departure(
            step.number,
            "per-layer clipping (clipping='per_layer') may be active: the update is not the flat-clipped gradient "
            "step the last-iterate rows analyse",
            {"update": "any"},
        )
