"""The certified linear route (``register(model="glm")``): at every step, the run is still the linear model the
loss assumptions were derived for (gates the rows needing those assumptions).

The route (:mod:`lastiter_plugins.adapters.opacus._glm`) derives smoothness, strong convexity and whether
clipping keeps a gradient step from the model at ``make_private`` (a model that is not such a GLM is refused
there: the user named the route), then watches every training forward and step (``_glm_watch.Watch``). A fact
it watches that breaks (features not from the clip, another loss, a scaled loss, a feature norm above A, ...)
is a departure from that step on: the derived assumptions are dropped (and, with the weight decay the
constants had folded in, the update is no longer plain SGD on the declared loss: ``update="any"``). The
clipped sum's sensitivity is Opacus' and the every-iterate rows stay.
"""

from __future__ import annotations

from typing import Any

from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._glm import GlmRoute
from lastiter_plugins.adapters.opacus._glm_watch import GlmBroken
from lastiter_plugins.host import Departure

#: the assumptions the route derives, each to its weak value
DERIVED: dict[str, Any] = {
    "smoothness": None,
    "strong_convexity": 0.0,
    "clipped_loss_convex_smooth": False,
    "gradient_norms_within_clip": False,
}


class LinearRoute(Check):
    gates = "the rows needing the derived loss assumptions (and, with weight decay, the plain SGD update)"

    def __init__(self, route: GlmRoute) -> None:
        self.route = route
        self.left = False

    def at_step(self, step: Step) -> Departure | None:
        if self.left:
            return None
        route, optim = self.route, step.optim
        route.derive_at_step(optim)  # (bound by bind_data_loader: derived at the first step, or refused)
        watch = route.watch
        assert watch is not None  # hooked where the constants were derived (make_private, or derive_at_step)
        try:
            watch.check_configuration(optim)
            watch.check_examples(optim)
        except GlmBroken as broken:
            self.left = True
            changes = dict(DERIVED)
            derivation = route.derivation
            if derivation is not None and any(derivation.weight_decays):
                changes["update"] = "any"
            return Departure(step.number, f"model='glm': {broken}", changes)
        return None
