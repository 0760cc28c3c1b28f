"""The update: plain SGD at the registered, constant learning rate (gates the last-iterate rows).

Every last-iterate row analyses one map, x <- x - lr * (noisy clipped mean) with lr constant
(``needs_sgd_update``); the every-iterate rows (composition) cover any use of the noisy sums, since whatever
the optimizer computes from them is post-processing. So an optimizer other than plain SGD (Adam, AdamW,
momentum, Nesterov, weight decay not declared as the l2 term), parameter groups with different rates, or a
learning rate that changes between steps (any schedule fixed in advance) is the departure ``update="any"``
from the first step it affects; a constant rate other than the registered one is ``learning_rate=None``
(the rows needing the registered rate leave, those needing none stay).
"""

from __future__ import annotations

from typing import Any

import torch

from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._declaration import Registration
from lastiter_plugins.adapters.opacus._record import MISSING, plain
from lastiter_plugins.host import Departure

_NEUTRAL = (("momentum", 0), ("nesterov", False), ("maximize", False))


def _qualified(cls: type) -> str:
    return (
        f"{cls.__module__}.{cls.__qualname__}".replace("torch.optim.sgd.", "torch.optim.")
        .replace("torch.optim.adam.", "torch.optim.")
        .replace("torch.optim.adamw.", "torch.optim.")
    )


def not_plain_sgd(base: Any, reg: Registration) -> str | None:
    """Why the torch optimizer's update is not plain SGD as the rows analyse it (None: it is), in words."""
    if type(base) is not torch.optim.SGD:
        return f"the optimizer is {_qualified(type(base))}, not plain torch.optim.SGD"
    derived = reg.weight_decays  # set only by the GLM route, which folds them into its derived constants
    everywhere = reg.weight_decay_everywhere  # l2_outside_clip declared by hand: the declared strong convexity
    groups = base.param_groups
    if derived is not None and everywhere is None and len(groups) != len(derived):
        return (
            f"the optimizer has {len(groups)} parameter groups, not the {len(derived)} whose weight_decay the GLM "
            "constants were derived for"
        )
    for i, group in enumerate(groups):
        for key, neutral in _NEUTRAL:
            value = plain(group.get(key, neutral))
            if value is not MISSING and value != neutral:
                return f"SGD with {key}={value} in param_groups[{i}]"
        decay = everywhere if everywhere is not None else derived[i] if derived is not None else 0
        value = plain(group.get("weight_decay", 0))
        if value != decay:
            what = (
                "the declared strong_convexity (l2_outside_clip)" if everywhere is not None
                else "the value the GLM constants were derived for" if derived is not None
                else "declared (declare it with l2_outside_clip=True and strong_convexity, or fold it into the loss)"
            )  # fmt: skip
            return f"SGD with weight_decay={value} in param_groups[{i}], not {decay} ({what})"
    rates = {float(plain(group["lr"])) for group in groups}
    if len(rates) > 1:
        return f"parameter groups with different learning rates ({', '.join(f'{r:g}' for r in sorted(rates))})"
    return None


class PlainSgd(Check):
    """The update of every step, from the torch optimizer the DP optimizer wraps: its class, its parameter
    groups and their learning rates, compared with the registration and with the previous step."""

    gates = "the last-iterate rows (update='any'), and those needing the registered rate (learning_rate=None)"

    def __init__(self) -> None:
        self.rates: tuple[float, ...] | None = None  # the learning rates of the previous step
        self.update_left = False
        self.rate_left = False

    def at_step(self, step: Step) -> Departure | None:
        if self.update_left or (step.unchanged and self.rates is not None):
            return None  # (the values read are the previous step's: the same conclusion)
        base, reg = step.optim.original_optimizer, step.registration
        rates = tuple(float(plain(group["lr"])) for group in base.param_groups)
        previous, self.rates = self.rates, rates
        why = not_plain_sgd(base, reg)
        if why is None and previous is not None and rates != previous:
            shown = ", ".join(f"{a:g} -> {b:g}" for a, b in zip(previous, rates, strict=False))
            why = f"the learning rate changed at step {step.number} ({shown}): a learning-rate schedule"
        if why is not None:
            self.update_left = True
            return Departure(step.number, why, {"update": "any", "learning_rate": None})
        if not self.rate_left and reg.learning_rate is not None and rates[0] != reg.learning_rate:
            self.rate_left = True
            return Departure(
                step.number,
                f"lr={rates[0]:g} in the optimizer, not the registered learning_rate={reg.learning_rate:g}",
                {"learning_rate": None},
            )
        return None
