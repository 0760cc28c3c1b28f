"""Each example of the step's batch contributes exactly one clipped gradient (every row: the sensitivity of
the clipped sum is one clip norm per example): one backward pass per step (or Opacus' BatchMemoryManager
splitting one batch), and as many examples entering the private module in training forward passes as
per-example clipped gradients (counted by a forward pre-hook on the module the loop calls)."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.utils.rnn import PackedSequence

from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus import _patches as patches
from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.adapters.opacus._rows import Fingerprint, children, fingerprint
from lastiter_plugins.host import Departure

if TYPE_CHECKING:
    from lastiter_plugins.adapters.opacus._checks.ghost import GhostBackward

_ONE_EACH = (
    "each example of the loader batch must contribute exactly one clipped gradient to a step (the "
    "sensitivity of the clipped sum is one clipping norm per example, as every bound assumes)"
)


def batch_size_of(value: Any, dim: int, depth: int = 0) -> int | None:
    """Examples in a forward call's (nested) arguments: the size along ``dim`` of the first tensor
    found (depth first: tuples, lists, dicts, dataclasses), or a ``PackedSequence``'s number of
    sequences; None when there is no such tensor. The first tensor is taken as the batch, so that
    further arguments (a public table, a mask of another shape) do not count as examples."""
    if isinstance(value, torch.Tensor):
        return int(value.shape[dim]) if value.dim() > dim else None
    if depth >= 4:
        return None
    if isinstance(value, PackedSequence):  # its data holds every time step of every sequence
        return int(value.batch_sizes[0]) if value.batch_sizes.numel() else None
    items = children(value)
    if items is None:
        return None
    for item in items:
        size = batch_size_of(item, dim, depth + 1)
        if size is not None:
            return size
    return None


def _argument_types(args: Any, kwargs: Any) -> str:
    names = [type(a).__name__ for a in args] + [f"{k}={type(v).__name__}" for k, v in kwargs.items()]
    return ", ".join(names) or "no arguments"


class ExampleCounter:
    """Counts the examples entering the private module in forward passes that record
    per-sample gradients (training mode, gradients enabled) since the last real step.

    A forward pre-hook that only reads the arguments (:func:`batch_size_of`). A call whose
    examples cannot be counted (no tensor with a batch dimension: a custom batch object)
    sets ``unknown`` to the argument types, for the step's refusal.
    """

    __slots__ = ("_dim", "_handle", "_module", "count", "forwards", "unknown")

    def __init__(self, module: torch.nn.Module) -> None:
        self.count = 0
        #: the training forwards since the last step (the first 8): the rows each received, and how many
        self.forwards: list[tuple[Fingerprint | None, int]] = []
        self.unknown: str | None = None
        self._dim = 0 if getattr(module, "batch_first", True) else 1
        self._module = weakref.ref(module)
        self._handle = module.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        if not (module.training and torch.is_grad_enabled()):  # Opacus records no per-sample gradients then
            return
        first = args[0] if args else None  # (the usual call: the first tensor is the first argument)
        size = batch_size_of(first if type(first) is torch.Tensor else (args, kwargs), self._dim)
        if size is None:
            self.unknown = _argument_types(args, kwargs)
        else:
            if len(self.forwards) < 8:
                self.forwards.append((fingerprint(first if type(first) is torch.Tensor else (args, kwargs)), size))
            self.count += size

    def reset(self) -> None:
        self.count = 0
        self.forwards = []
        self.unknown = None

    def watches(self, module: Any) -> bool:
        return self._module is not None and self._module() is module

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()

    def __getstate__(self) -> dict[str, Any]:
        # pickling or copying the model (torch.save(model)) carries a detached counter
        return {"count": 0, "forwards": [], "unknown": None, "_dim": self._dim, "_module": None, "_handle": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


class OneGradientPerExample(Check):
    """Counts the per-example clipped gradients the step sums (Opacus' ``p.grad_sample``; with ghost clipping,
    the rows of the per-example losses of the two-pass backward) against the examples that entered the
    module, and sets ``step.gradients`` for the batch check."""

    def __init__(self, module: torch.nn.Module | None, batch_sampler: Any, ghost: GhostBackward | None) -> None:
        self.counter = None if module is None else ExampleCounter(module)
        self._batch_sampler = weakref.ref(batch_sampler)
        self._ghost = ghost
        self._first: Any = None  # the first trained parameter (its grad_sample holds the step's count)

    def remove(self) -> None:
        if self.counter is not None:
            self.counter.remove()

    def at_step(self, step: Step) -> Departure | None:
        if self.counter is not None:
            step.rows = tuple(rows for rows, _ in self.counter.forwards)
        step.gradients = self.verify_examples(step.optim, self.counter, step.run.batches.queue.delivered)
        if self.counter is not None:
            self.counter.reset()
        return None

    def _per_example(self, optim: Any) -> tuple[int, int]:
        """(backward passes, per-example clipped gradients) of the step."""
        if self._ghost is not None:  # (each pass' gradients are summed by a skipped step or by this one)
            passes = self._ghost.passes
            return (min(passes, 1) if internals.last_step_skipped(optim) else passes), self._ghost.rows
        if self._first is None:  # (the trained parameters stay the first step's: the optimizer check refuses else)
            self._first = optim.params[0] if optim.params else False
        samples = getattr(self._first, "grad_sample", None) if self._first is not False else None
        if samples is None:
            return 0, 0
        if isinstance(samples, list):  # one tensor per backward pass
            return len(samples), sum(int(g.shape[0]) for g in samples)
        return 1, int(samples.shape[0])

    def verify_examples(
        self, optim: Any, counter: ExampleCounter | None, delivered: Callable[[Fingerprint | None], bool] | None = None
    ) -> int:
        """One backward pass, and as many examples entering the private module in training forward passes
        as clipped gradients. Returns the per-example clipped gradients the step sums (with skipped steps:
        theirs too), which the run monitor compares with the batch the step drew."""
        passes, count = self._per_example(optim)
        if passes > 1:
            raise _Changed(
                f"{_ONE_EACH}. Found {passes} backward passes before this optimizer step (Opacus accumulated "
                f"{passes} sets of per-example gradients, {count} in all): several backward passes over the same "
                "batch (e.g. two augmented views) give each example several clipped gradients, and over several "
                "batches they are not the batch the accountant counts. Call backward() once per step; for a "
                "larger batch use DataLoader(batch_size=...) with BatchMemoryManager."
            )
        if counter is not None and counter.unknown is not None:
            raise _Changed(
                f"{_ONE_EACH}, so the accountant counts the examples entering the private module. Found a training "
                f"forward call since the last step whose examples cannot be counted (arguments: {counter.unknown}; "
                "no tensor with a batch dimension). Pass the batch as a tensor, or a tuple, list, dict or "
                "dataclass of tensors whose first tensor has one row per example."
            )
        if internals.last_step_skipped(optim):
            total = self._skipped_total(optim, counter, count)
        else:
            total = count
            if counter is not None and counter.count != count:
                extra = _not_delivered(counter, delivered) if counter.count > count else None
                if extra is not None:
                    raise _Changed(extra)
                raise _Changed(
                    f"{_ONE_EACH}. Found {counter.count} examples entering the private module in training forward "
                    f"passes since the last step, and per-example gradients of {count} in this step: "
                    + (
                        "more examples were fed than were clipped (several forward passes, e.g. augmented views, "
                        "summed into one per-example gradient, or a training-mode forward without backward: wrap "
                        "evaluation in torch.no_grad() or model.eval()). (A forward call's examples are the rows of "
                        "its first tensor argument.)"
                        if counter.count > count
                        else "the forward bypassed the module make_private returned: call that module itself."
                    )
                )
        return total

    def _skipped_total(self, optim: Any, counter: ExampleCounter | None, count: int) -> int:
        """Examples summed by a real step that follows steps skipped with ``signal_skip_step``."""
        problem = (
            "signal_skip_step(True) makes Opacus sum the clipped gradients of several optimizer.step() calls into one "
            "noisy step; this is accepted only for Opacus' BatchMemoryManager splitting one batch of the make_private "
            "loader (summing several loader batches is not a step any bound covers)."
        )
        if counter is None:
            raise _Changed(
                f"{problem} The accountant cannot count the examples of this step: it was not given the "
                "private module. Create the optimizer with PrivacyEngine.make_private, or call "
                "engine.accountant.bind_data_loader(data_loader, module=model) before training."
            )
        if counter.count < count:
            raise _Changed(
                f"{problem} This step holds per-sample gradients of {count} examples and only "
                f"{counter.count} entered the module make_private returned since the last step. Call the "
                "private module itself, not the module it wraps."
            )
        if not patches.splits(optim, self._batch_sampler()):
            raise _Changed(
                f"{problem} Found skipped steps and no BatchMemoryManager splitting the batches of the "
                "make_private loader for this optimizer. Use BatchMemoryManager(data_loader=..., "
                "optimizer=...) to split a batch, or call backward() once per loader batch."
            )
        return counter.count


def _not_delivered(counter: ExampleCounter, delivered: Callable[[Fingerprint | None], bool] | None) -> str | None:
    """The refusal naming the forwards whose rows are no delivered batch, when the step's batch is among the
    forwards (a public table passed through the module in training mode), else None."""
    if delivered is None or len(counter.forwards) < 2:
        return None
    known = [delivered(rows) for rows, _ in counter.forwards]
    if not any(known) or all(known):
        return None
    shapes = {rows[0] for (rows, _), ok in zip(counter.forwards, known, strict=True) if ok and rows is not None}
    if any(rows is None or rows[0] in shapes for (rows, _), ok in zip(counter.forwards, known, strict=True) if not ok):
        return None  # (rows shaped like the batch: a view of it, e.g. an augmentation, as the general message says)
    extra = sum(size for (_, size), ok in zip(counter.forwards, known, strict=True) if not ok)
    return (
        f"{_ONE_EACH}. Found the private module called in training mode on {extra} rows that are no batch of the "
        "loader, besides the step's batch, since the last step: Opacus records every row a training forward "
        "receives, so a public table or reference set passed through the module is counted (and, if its loss is "
        "back-propagated, clipped and summed) as examples of the batch. Pass such rows under torch.no_grad() or "
        "with module.eval(), or through a copy of the model that make_private did not wrap."
    )
