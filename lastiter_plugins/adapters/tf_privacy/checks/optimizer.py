r"""The optimizer's update: the last-iterate rows analyse plain SGD (``x - eta * noisy clipped mean``); Adam,
Adagrad, momentum, Nesterov and Keras' own clipping of the noised gradient compute the update from the noisy
sums otherwise, which only the every-iterate rows cover (everything computed from the noisy sums is
post-processing of their release). Microbatches of more than one example are refused (another mechanism)."""

from __future__ import annotations

import math
from collections.abc import Iterable

from lastiter_plugins.host import Departure

from .._settings import check_microbatches
from ._check import Check, Start, weakening


class OptimizerCheck(Check):
    gates = weakening(update="any")

    def start(self, start: Start) -> Iterable[Departure]:
        settings = start.optimizer
        check_microbatches(settings, start.fit.rows_per_step, start.fit.rows_named)
        facts = []
        if settings.base != "SGD":
            facts.append(
                f"the optimizer is {settings.optimizer_class}: {settings.base}'s update uses the noisy gradients "
                "otherwise than plain SGD"
            )
        if settings.momentum != 0.0:
            shown = "a tensor or callable" if math.isnan(settings.momentum) else f"{settings.momentum:g}"
            facts.append(f"{settings.optimizer_class} has momentum {shown}")
        if settings.nesterov:
            facts.append(f"{settings.optimizer_class} uses Nesterov momentum")
        for name, value in settings.keras_clipping:
            facts.append(f"Keras clips the noised gradient ({name}={value:g})")
        if facts:
            yield Departure(step=1, fact="; ".join(facts), changes=self.gates)
