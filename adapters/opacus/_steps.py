"""The checks of every optimizer step that read the step's data: the loader it came from,
the examples whose clipped gradients it sums, and the parameters it starts from."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._fast_step import NOT_FIRST, compile_version_record
from lastiter_plugins.adapters.opacus._loaders import LoaderFacts, LoaderWatch
from lastiter_plugins.adapters.opacus._observe import ExampleCounter, trainable
from lastiter_plugins.adapters.opacus._projection import PROJECTIONS
from lastiter_plugins.adapters.opacus._registration import LastIteratePipelineChangedError, Registration

_Changed = LastIteratePipelineChangedError
_ONE_EACH = (
    "each example of the loader batch must contribute exactly one clipped gradient to a step (the "
    "sensitivity of the clipped sum is one clipping norm per example, as every bound assumes)"
)


class StepChecks:
    """Per-step checks for one DP optimizer, its private module and its parameters.

    Registers a step post-hook on the wrapped torch optimizer, run first after the update,
    that records the version counters of the parameters after each accounted step, so that
    the next step (and ``get_epsilon``) sees any write made outside it (by user code, another
    optimizer or a later post-hook; the projection's own writes are told apart by ``STAMPS``).
    """

    __slots__ = ("_diameter", "_handle", "_hook", "_optim", "base", "others", "params", "record", "reg",
                 "splitter")  # fmt: skip

    def __init__(self, optim: Any, module: torch.nn.Module | None, reg: Registration) -> None:
        self._optim = weakref.ref(optim)
        self.reg = reg
        self.base = optim.original_optimizer
        self.params = trainable(optim)
        ids = {id(p) for p in self.params}
        self.others = [] if module is None else [p for p in module.parameters() if id(p) not in ids]
        # [pending, after, hook id]: pending is set by an accounted step, and the post-hook then records
        # after = (next(STAMPS), versions of params, versions of others). A list the hook holds (read at every step)
        self.record: list = [False, None, None]  # (and the post-hook's handle id)
        self._diameter = reg.assumptions.diameter  # (frozen)
        self.splitter = internals.SplitterFinder()
        self._hook = compile_version_record(self.record, tuple(self.params), tuple(self.others))
        self._handle = self.base.register_step_post_hook(self._hook)
        internals.run_first(self.base, self._handle)
        self.record[2] = self._handle.id

    def remove(self) -> None:
        self._handle.remove()

    @property
    def after(self) -> tuple[int, tuple[int, ...], tuple[int, ...]] | None:
        """(next(STAMPS), versions of params, versions of others) after the last accounted step."""
        return self.record[1]

    def mark_pending(self) -> None:
        """The step being accounted: the post-hook records the versions it leaves."""
        self.record[0] = True

    def forget_parameters(self) -> None:
        self.record[1] = None

    # -- the checks
    def verify(
        self,
        optim: Any,
        facts: LoaderFacts,
        watch: LoaderWatch,
        counter: ExampleCounter | None,
        steps: int,
    ) -> None:
        """Check one step (the hook runs after Opacus clipped and noised it, before the update)."""
        if self._optim() is not optim:
            raise _Changed(
                "the optimizer stepping this accountant must stay the DP optimizer it was bound to. "
                "Found another optimizer. Use one PrivacyEngine per model and optimizer."
            )
        current = trainable(optim)
        if len(current) != len(self.params) or any(a is not b for a, b in zip(current, self.params, strict=True)):
            raise _Changed(
                f"the parameters the DP optimizer trains must stay the same for the whole run (step {steps + 1}). "
                f"Found {len(current)} trainable parameter tensors instead of {len(self.params)} (a parameter was "
                "added, removed, frozen or unfrozen). Decide what to train before make_private."
            )
        if optim.original_optimizer is not self.base:
            raise _Changed(
                f"the optimizer the DP optimizer wraps must stay the one of the first step (step {steps + 1}). Found "
                f"another {type(optim.original_optimizer).__name__}. Use one PrivacyEngine per model and optimizer."
            )
        self._verify_step_hooks(steps)
        if not watch.unchanged():
            change = watch.changed()
            if change is not None:
                raise _Changed(f"{change} (step {steps + 1}).")
        # the examples whose clipped gradients the step sums (inline: this runs at every step)
        samples = getattr(self.params[0], "grad_sample", None)  # Opacus' per-example gradients of a parameter
        if samples is None:
            passes = count = 0
        elif isinstance(samples, list):  # one tensor per backward pass
            passes, count = len(samples), sum(int(g.shape[0]) for g in samples)
        else:
            passes, count = 1, int(samples.shape[0])
        if passes > 1:
            raise _Changed(
                f"{_ONE_EACH}. Found {passes} backward passes before this optimizer step (Opacus accumulated "
                f"{passes} sets of per-example gradients, {count} in all): several backward passes over the same "
                "batch (e.g. two augmented views) give each example several clipped gradients, and over several "
                "batches they are not the batch the accountant counts. Call backward() once per step; for a "
                "larger batch use DataLoader(batch_size=...) with BatchMemoryManager."
            )
        if internals.last_step_skipped(optim):
            total = self._skipped_total(optim, watch, counter, count)
        else:
            total = count
            if counter is not None and not counter.unknown and counter.count != count:
                raise _Changed(
                    f"{_ONE_EACH}. Found {counter.count} examples entering the private module in training forward "
                    f"passes since the last step, and per-example gradients of {count} in this step: "
                    + (
                        "more examples were fed than were clipped (several forward passes, e.g. augmented views, "
                        "summed into one per-example gradient, or a training-mode forward without backward: wrap "
                        "evaluation in torch.no_grad() or model.eval())."
                        if counter.count > count
                        else "the forward bypassed the module make_private returned: call that module itself."
                    )
                )
        planned = facts.batch_at(steps % facts.num_batches)
        if planned is not None and total != planned:
            raise _Changed(
                f"{_ONE_EACH}, and a step must use one whole batch of the loader bound at make_private: step "
                f"{steps + 1} is batch {steps % facts.num_batches + 1} of {facts.num_batches} of an epoch, which "
                f"holds {planned} examples (n = {facts.dataset_size}, batch_size = {facts.batch_size}). Found "
                f"{total} per-example gradients. More: examples repeated or added (a collate_fn or loss producing "
                "several rows per example); fewer: a cut batch, another loader, or a loop that broke out of an "
                "epoch. Feed each loader batch once, whole, to the private module."
            )
        if planned is None and total > facts.dataset_size:
            raise _Changed(
                f"{_ONE_EACH}. Found {total} per-example gradients in one step for a dataset of "
                f"{facts.dataset_size} examples."
            )
        self.verify_parameters(steps)

    def _verify_step_hooks(self, steps: int) -> None:
        """Nothing runs between this check and the record of the parameters after the update but the update."""
        pre_hooks = internals.step_pre_hooks(self.base)
        if pre_hooks:
            raise _Changed(
                f"the optimizer must run no step pre-hook: {pre_hooks} found on "
                f"{type(self.base).__name__} (register_step_pre_hook, or torch.optim.optimizer."
                f"register_optimizer_step_pre_hook), before step {steps + 1}. A pre-hook runs after the "
                "accountant checked the step and before the update, where a write to the parameters or the "
                "gradients would go unseen. Remove it; do its work before optimizer.step()."
            )
        override = internals.foreign_step(self.base)
        if override is not None:
            raise _Changed(
                f"the optimizer's step must be its class's own (or torch's LR-scheduler wrapper of it). Found "
                f"{getattr(override, '__qualname__', type(override).__name__)!r} set on the "
                f"{type(self.base).__name__} object, before step {steps + 1}: it runs after the accountant checked "
                "the step and before the update, where a write to the parameters would go unseen. Remove it."
            )
        if internals.first_step_post_hook(self.base) is not self._hook:
            raise _Changed(f"{NOT_FIRST} (Before step {steps + 1}.)")

    def _skipped_total(self, optim: Any, watch: LoaderWatch, counter: ExampleCounter | None, count: int) -> int:
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
        if counter.unknown:
            raise _Changed(
                f"{problem} A training forward call since the last step had no tensor argument with a "
                "batch dimension, so the examples cannot be counted. Pass the batch as tensors."
            )
        if counter.count < count:
            raise _Changed(
                f"{problem} This step holds per-sample gradients of {count} examples and only "
                f"{counter.count} entered the module make_private returned since the last step. Call the "
                "private module itself, not the module it wraps."
            )
        if not self.splitter.splits(optim, watch.batch_sampler()):
            raise _Changed(
                f"{problem} Found skipped steps and no BatchMemoryManager splitting the batches of the "
                "make_private loader for this optimizer. Use BatchMemoryManager(data_loader=..., "
                "optimizer=...) to split a batch, or call backward() once per loader batch."
            )
        return counter.count

    def verify_parameters(self, steps: int) -> None:
        """Nothing but the accounted steps (and the projection right after them) wrote to the
        model's parameters since the last step; with a declared diameter, they lie in the ball."""
        after = self.after
        if isinstance(after, str):  # the post-hook found itself not first: the step's record is not to be trusted
            raise _Changed(after)
        # (PROJECTIONS.data: the dict under the WeakKeyDictionary; empty means no projection at all,
        # and bool(PROJECTIONS) would call Python code at every step)
        projection = PROJECTIONS.get(self.base) if PROJECTIONS.data else None
        if after is not None:
            stamp, expected, others = after
            if (
                projection is not None
                and projection.stamp > stamp
                and projection.before == expected
                and len(projection.params) == len(self.params)
                and all(a is b for a, b in zip(projection.params, self.params, strict=True))
            ):
                expected = projection.versions
            if not internals.same_versions(self.params, expected) or (
                others and not internals.same_versions(self.others, others)
            ):
                raise _Changed(
                    f"the model's parameters must change only through the accounted DP steps. Found an in-place "
                    f"write to them after step {steps} (another optimizer's step, a write by user code or a hook, "
                    "load_state_dict): the released model is no longer the output of the accounted run. Train "
                    "every parameter with the DP optimizer only, and do not edit them between steps."
                )
        diameter = self._diameter
        if diameter is None:
            return
        if projection is None or not projection.covers(self.base):
            raise _Changed(
                f"diameter={diameter:g} was declared for accountant {self.reg.name!r}, so every step must project all "
                "trainable parameters onto a ball of that diameter. Found no projection covering exactly the "
                "parameters of this optimizer. Call lastiter_plugins.adapters.opacus.attach_projection(optimizer, "
                "diameter) before training, or register without a diameter."
            )
        if projection.diameter > diameter:
            raise _Changed(
                f"the projection's diameter must be <= the declared diameter {diameter:g}. "
                f"Found {projection.diameter:g}."
            )
        distance = projection.distance()
        if distance > projection.diameter / 2.0:
            raise _Changed(
                f"the parameters must lie in the projection ball (radius {projection.diameter / 2.0:g}) after every "
                f"step. Found them at distance {distance:.6g} from its centre after step {steps}: something moved "
                "them after the projection. Do not edit the parameters between steps."
            )
