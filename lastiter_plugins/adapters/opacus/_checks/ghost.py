"""Ghost clipping (``make_private(grad_sample_mode="ghost")``): the step's gradient is the two-pass backward of
the criterion ``make_private`` returned (every row).

In ghost mode Opacus' optimizer does not clip: the criterion's ``backward`` computes the per-example gradient
norms in a first pass, then back-propagates the per-example losses scaled by min(1, C / norm) in a second; the
optimizer only adds noise to what the second pass left in ``p.grad``. A plain ``loss.backward()`` (the user's
criterion, not the returned one) noises the unclipped sum, whose sensitivity no row bounds. So every step is
refused unless, since the previous step, the trained parameters' gradients were accumulated only inside
backward calls of the returned criterion for this optimizer (reported by the patch of
``DPTensorFastGradientClipping.backward``; accumulations seen by a post-accumulate-grad hook on each trained
parameter). The examples check counts the per-example losses of those calls (their rows) as the step's
clipped gradients.
"""

from __future__ import annotations

from typing import Any

from lastiter_plugins.adapters.opacus import _patches as patches
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._record import trainable
from lastiter_plugins.host import Departure

_TWO_PASS = (
    "with ghost clipping (grad_sample_mode='ghost') every step's gradient must come from the criterion "
    "make_private returned (model, optimizer, criterion, loader = engine.make_private(...)): its backward clips "
    "each example's gradient in two passes, while Opacus' optimizer adds noise without clipping, so a plain "
    "loss.backward() noises the unclipped sum"
)


class GhostBackward(Check):
    """What the returned criterion's backward calls did for one DP optimizer since the last step."""

    def __init__(self, optim: Any) -> None:
        self.passes = 0  # complete two-pass backward calls since the last step
        self.rows = 0  # their per-example losses
        self._inside = False
        self._outside = 0  # gradient accumulations into a trained parameter outside those calls
        self._combined = 0  # backward calls of a loss made from the criterion's by arithmetic
        patches.listen_ghost_backward(optim, self._backward)
        me = _Weak(self)
        self._handles = [p.register_post_accumulate_grad_hook(me) for p in trainable(optim)]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _backward(self, phase: str, tensor: Any) -> None:
        self._inside = phase == "start"
        if phase == "start" and not patches.from_criterion(tensor):
            self._combined += 1
        if phase == "end":
            self.passes += 1
            self.rows += int(tensor.loss_per_sample.shape[0]) if tensor.loss_per_sample.dim() else 1

    def accumulated(self) -> None:
        if not self._inside:
            self._outside += 1

    def at_step(self, step: Step) -> Departure | None:
        passes, outside = self.passes, self._outside
        if passes == 0:
            raise _Changed(
                f"{_TWO_PASS}. Found step {step.number} with no backward of that criterion since the previous step "
                "(a loss computed with another criterion, or torch.autograd.backward). Compute the loss with the "
                "criterion make_private returned and call .backward() on it."
            )
        if self._combined:
            raise _Changed(
                f"{_TWO_PASS}. Found a backward (before step {step.number}) of a loss made from the criterion's by "
                "arithmetic (loss + other, loss * w): Opacus adds a batch-level term to every per-example loss, "
                "and its gradient enters the sum weighted by the sum of the clip coefficients, not clipped per "
                "example. Call .backward() on the criterion's own loss."
            )
        if outside:
            raise _Changed(
                f"{_TWO_PASS}. Found {outside} gradient accumulation(s) into the trained parameters outside its "
                f"backward since the previous step (step {step.number}): a second loss back-propagated with "
                "loss.backward(), or a gradient added by hand, enters the noisy sum unclipped. Back-propagate "
                "every loss through the returned criterion only."
            )
        return None

    def reset(self) -> None:
        """The step was accounted: start counting the next one's backward calls."""
        self.passes = self.rows = self._outside = self._combined = 0


class _Weak:
    """A post-accumulate-grad hook holding the check weakly (the parameters outlive a run)."""

    __slots__ = ("_ref",)

    def __init__(self, check: GhostBackward) -> None:
        import weakref

        self._ref = weakref.ref(check)

    def __call__(self, param: Any) -> None:
        check = self._ref()
        if check is not None:
            check.accumulated()
