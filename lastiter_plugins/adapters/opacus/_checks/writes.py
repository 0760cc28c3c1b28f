"""The model's parameters change only through the accounted steps (every row: a write outside them is not
the output of the accounted run). A step post-hook, first after the update, records the parameters' version
counters; the next step (and every epsilon) compares them."""

from __future__ import annotations

from typing import Any

import torch

from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._projection import PROJECTIONS, STAMPS
from lastiter_plugins.adapters.opacus._record import trainable
from lastiter_plugins.host import Departure

#: What the step post-hook records when another post-hook runs before it (which could have written
#: to the parameters before the record): the next step and every epsilon refuse with it.
NOT_FIRST = (
    "the accountant's step post-hook must run first after the update, to record the parameters the update "
    "leaves. Found another post-hook moved in front of it. Do not reorder the optimizer's hooks."
)


class _VersionRecord:
    """The step post-hook, run first after the update: after an accounted step (``pending``, set by
    the step) it records ``after = (next(STAMPS), versions of the trained parameters, versions of the
    module's other parameters)``, or :data:`NOT_FIRST` when another post-hook ran before it."""

    __slots__ = ("__weakref__", "after", "handle_id", "others", "params", "pending")

    def __init__(self, params: tuple, others: tuple) -> None:
        self.params, self.others = params, others
        self.pending = False
        self.after: Any = None
        self.handle_id: int | None = None

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if not self.pending:
            return
        self.pending = False
        if internals.first_step_post_hook_id(optimizer) != self.handle_id:
            self.after = NOT_FIRST
        else:
            self.after = (next(STAMPS), internals.versions(self.params), internals.versions(self.others))


class AccountedWrites(Check):
    """Nothing but the accounted steps (and the projection right after them) wrote to the module's
    parameters since the last step (the trained ones and the others); the post-hook runs first."""

    def __init__(self, optim: Any, module: torch.nn.Module | None) -> None:
        self.base = optim.original_optimizer
        self.params = trainable(optim)
        ids = {id(p) for p in self.params}
        self.others = [] if module is None else [p for p in module.parameters() if id(p) not in ids]
        self.record = _VersionRecord(tuple(self.params), tuple(self.others))
        self._handle = self.base.register_step_post_hook(self.record)
        internals.run_first(self.base, self._handle)
        self.record.handle_id = self._handle.id

    def remove(self) -> None:
        self._handle.remove()

    def rebase(self) -> None:
        """Take the parameters as they are now as the run's (a checkpoint's weights, checked)."""
        self.record.after = None

    def at_step(self, step: Step) -> Departure | None:
        if internals.first_step_post_hook_id(self.base) != self.record.handle_id:
            raise _Changed(f"{NOT_FIRST} (Before step {step.number}.)")
        self.verify(step.number - 1)
        self.record.pending = True  # the step being accounted: the post-hook records the versions it leaves
        return None

    def verify(self, steps: int) -> None:
        """No write since step ``steps`` but its update and its projection (also when an epsilon is read)."""
        after = self.record.after
        if isinstance(after, str):  # the post-hook found itself not first: the step's record is not to be trusted
            raise _Changed(after)
        if after is None:
            return
        stamp, expected, others = after
        projection = PROJECTIONS.get(self.base)
        if (
            projection is not None
            and projection.stamp > stamp
            and projection.before == expected
            and len(projection.params) == len(self.params)
            and all(a is b for a, b in zip(projection.params, self.params, strict=True))
        ):
            expected = projection.versions  # the projection's own write, right after the step
        if internals.versions(self.params) != expected or internals.versions(self.others) != others:
            raise _Changed(
                f"the model's parameters must change only through the accounted DP steps. Found an in-place "
                f"write to them after step {steps} (another optimizer's step, a write by user code or a hook, "
                "load_state_dict): the released model is no longer the output of the accounted run. Train "
                "every parameter with the DP optimizer only, and do not edit them between steps."
            )
