"""The optimizer taking the step is the one bound at the first step, and nothing runs between the checks
and the update (every row: a write there would go unseen, and a GradScaler's step reads the un-noised sum)."""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from typing import Any

import torch

from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus import _patches as patches
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._record import trainable
from lastiter_plugins.host import Departure


def parameter_names(module: torch.nn.Module | None, params: list) -> list[str]:
    """The names of ``params`` in the user's model (a tensor of no module bound: its shape)."""
    names = {} if module is None else {id(p): n.removeprefix("_module.") for n, p in module.named_parameters()}
    return [names.get(id(p), f"a tensor of shape {tuple(p.shape)}") for p in params]


class BoundOptimizer(Check):
    """The DP optimizer bound at the first step, the torch optimizer it wraps and the parameters it trains;
    no step pre-hook or ``step`` override on the wrapped optimizer; the step not taken by torch's GradScaler."""

    def __init__(self, optim: Any, module: torch.nn.Module | None) -> None:
        self._optim: Callable[[], Any] = weakref.ref(optim)  # Any: the is-check must not narrow optim to None
        self._module = None if module is None else weakref.ref(module)
        self.base = optim.original_optimizer
        self.params = trainable(optim)

    def at_step(self, step: Step) -> Departure | None:
        self.verify(step.optim, step.number)
        return None

    def verify(self, optim: Any, number: int) -> None:
        """Refuse unless ``optim`` is the bound optimizer with nothing between this check and the update."""
        if self._optim() is not optim:
            raise _Changed(
                "the optimizer stepping this accountant must stay the DP optimizer it was bound to. "
                "Found another optimizer. Use one PrivacyEngine per model and optimizer."
            )
        if optim.original_optimizer is not self.base:
            raise _Changed(
                f"the optimizer the DP optimizer wraps must stay the one of the first step (step {number}). Found "
                f"another {type(optim.original_optimizer).__name__}. Use one PrivacyEngine per model and optimizer."
            )
        current = trainable(optim)
        if len(current) != len(self.params) or not all(map(operator.is_, current, self.params)):
            module = self._module() if self._module is not None else None
            frozen = parameter_names(module, [p for p in self.params if not p.requires_grad])
            raise _Changed(
                f"the parameters the DP optimizer trains must stay the same for the whole run (step {number}). "
                f"Found {len(current)} trainable parameter tensors instead of {len(self.params)} "
                + (f"({', '.join(frozen)} frozen: requires_grad=False after make_private)" if frozen else
                   "(a parameter was added, removed, frozen or unfrozen)")
                + ". Decide what to train before make_private."
            )  # fmt: skip
        pre_hooks = internals.step_pre_hooks(self.base)
        if pre_hooks:
            raise _Changed(
                f"the optimizer must run no step pre-hook: {pre_hooks} found on "
                f"{type(self.base).__name__} (register_step_pre_hook, or torch.optim.optimizer."
                f"register_optimizer_step_pre_hook), before step {number}. A pre-hook runs after the "
                "accountant checked the step and before the update, where a write to the parameters or the "
                "gradients would go unseen. Remove it; do its work before optimizer.step()."
            )
        override = internals.foreign_step(self.base)
        if override is not None:
            raise _Changed(
                f"the optimizer's step must be its class's own (or torch's LR-scheduler wrapper of it). Found "
                f"{getattr(override, '__qualname__', type(override).__name__)!r} set on the "
                f"{type(self.base).__name__} object, before step {number}: it runs after the accountant checked "
                "the step and before the update, where a write to the parameters would go unseen. Remove it."
            )
        if patches.stepped_by_grad_scaler(optim):
            raise _Changed(
                f"the optimizer step must not be taken by torch's GradScaler (mixed precision with loss scaling; "
                f"step {number}): its overflow test reads the un-noised gradient sum before Opacus adds noise and "
                "carries the decision into later steps (the steps it skips, and the scale, depend on the private "
                "data), and Opacus clips the per-example gradients of the scaled loss. Found scaler.step(optimizer). "
                "Train in float32, or under torch.autocast(dtype=torch.bfloat16) without a GradScaler (on the "
                "declared route; model='glm' needs float32 scores)."
            )
