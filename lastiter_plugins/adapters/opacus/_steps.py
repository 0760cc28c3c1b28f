"""The checks of every optimizer step that read the step's data: the optimizer that takes it,
the examples whose clipped gradients it sums, and the model it starts from.

Each method of :class:`StepChecks` checks one row of docs/opacus.md's table *Verified at
every step* and raises :class:`LastIteratePipelineChangedError` naming what changed, the
value found and the fix.
"""

from __future__ import annotations

import hashlib
import operator
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._observe import ExampleCounter, trainable
from lastiter_plugins.adapters.opacus._projection import PROJECTIONS, STAMPS
from lastiter_plugins.adapters.opacus._registration import LastIteratePipelineChangedError, Registration
from lastiter_plugins.glm import OPACUS_CLIP_EPSILON

if TYPE_CHECKING:
    from lastiter_plugins.adapters.opacus._monitor import LoaderWatch

_Changed = LastIteratePipelineChangedError
_ONE_EACH = (
    "each example of the loader batch must contribute exactly one clipped gradient to a step (the "
    "sensitivity of the clipped sum is one clipping norm per example, as every bound assumes)"
)
#: What the step post-hook records when another post-hook runs before it (which could have written
#: to the parameters before the record): the next step and every epsilon refuse with it.
NOT_FIRST = (
    "the accountant's step post-hook must run first after the update, to record the parameters the update "
    "leaves. Found another post-hook moved in front of it. Do not reorder the optimizer's hooks."
)
#: Buffers whose value does not depend on the data (docs/opacus.md): they may change during training.
#: BatchNorm's ``num_batches_tracked`` counts the training forward calls.
DATA_INDEPENDENT_BUFFERS: tuple[tuple[type, str], ...] = ((_BatchNorm, "num_batches_tracked"),)


def tracked_buffers(module: torch.nn.Module | None) -> list[tuple[str, torch.nn.Module, str, torch.Tensor]]:
    """The module's buffers that must not change during training, all but :data:`DATA_INDEPENDENT_BUFFERS`:
    (name in the user's model, owning module, its key there, tensor)."""
    if module is None:
        return []
    return [
        (f"{prefix}.{key}".removeprefix("_module.").lstrip("."), owner, key, buffer)  # (GradSampleModule's prefix)
        for prefix, owner in module.named_modules()
        for key, buffer in owner.named_buffers(recurse=False)
        if not any(isinstance(owner, kind) and key == free for kind, free in DATA_INDEPENDENT_BUFFERS)
    ]


class Buffers:
    """The module's tracked buffers when recorded, with copies of their values (by value: torch's batch
    norm updates its running statistics in place without bumping their version counters)."""

    def __init__(self, module: torch.nn.Module | None) -> None:
        self._module = None if module is None else weakref.ref(module)
        self.recorded = [(name, owner, key, b, b.detach().clone()) for name, owner, key, b in tracked_buffers(module)]

    def tensors(self) -> list[torch.Tensor]:
        return [b for _, _, _, b, _ in self.recorded]

    def changed(self, *, anywhere: bool) -> list[str]:
        """The names of the recorded buffers whose value changed or that were replaced; with ``anywhere``,
        also buffers added to or removed from any submodule since (a walk of the whole module: done
        when an epsilon is read, not at every step)."""
        found = [
            name
            for name, owner, key, b, copy in self.recorded
            if owner._buffers.get(key) is not b or not torch.equal(b, copy)
        ]
        if anywhere and self._module is not None and self._module() is not None:
            now = {name for name, *_ in tracked_buffers(self._module())}
            found += sorted(now ^ {name for name, *_ in self.recorded})
        return found


def digest(tensors: Any) -> str:
    """SHA-256 of the tensors' dtypes, shapes and bytes, in order (what a checkpoint's weights must match)."""
    h = hashlib.sha256()
    for t in tensors:
        t = t.detach()
        h.update(f"{t.dtype}{tuple(t.shape)};".encode())
        h.update(t.to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


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


class StepChecks:
    """Per-step checks for one DP optimizer, its private module and its parameters and buffers.

    Registers a step post-hook on the wrapped torch optimizer, run first after the update,
    that records the version counters of the parameters after each accounted step, so that
    the next step (and ``get_epsilon``) sees any write made outside it (by user code, another
    optimizer or a later post-hook; the projection's own writes are told apart by ``STAMPS``).
    The module's buffers are copied when the run is bound (``make_private``) and must keep
    their values: a buffer updated by a forward pass (a running statistic) is refused.
    """

    def __init__(self, optim: Any, module: torch.nn.Module | None, buffers: Buffers, reg: Registration) -> None:
        self._optim: Callable[[], Any] = weakref.ref(optim)  # Any: the is-check must not narrow optim to None
        self._module = None if module is None else weakref.ref(module)
        self.reg = reg
        self.base = optim.original_optimizer
        self.params = trainable(optim)
        ids = {id(p) for p in self.params}
        self.others = [] if module is None else [p for p in module.parameters() if id(p) not in ids]
        self.buffers = buffers  # recorded when the run was bound
        self.record = _VersionRecord(tuple(self.params), tuple(self.others))
        self._handle = self.base.register_step_post_hook(self.record)
        internals.run_first(self.base, self._handle)
        self.record.handle_id = self._handle.id
        self.splitter = internals.SplitterFinder()

    def remove(self) -> None:
        self._handle.remove()

    def _names(self, params: list) -> list[str]:
        """The names of ``params`` in the user's model (a tensor of no module bound: its shape)."""
        module = self._module() if self._module is not None else None
        names = {} if module is None else {id(p): n.removeprefix("_module.") for n, p in module.named_parameters()}
        return [names.get(id(p), f"a tensor of shape {tuple(p.shape)}") for p in params]

    def mark_pending(self) -> None:
        """The step being accounted: the post-hook records the versions it leaves."""
        self.record.pending = True

    def rebase(self) -> None:
        """Take the model as it is now as the run's (after a checkpoint's weights were loaded and
        checked against the accountant's digest)."""
        self.record.after = None
        self.buffers = Buffers(self._module() if self._module is not None else None)

    # -- the DP optimizer
    def verify_optimizer(self, optim: Any, step: int) -> None:
        """The DP optimizer bound at the first step, the SGD it wraps and the parameters it trains; nothing
        runs between this check and the update (so nothing can write there unseen)."""
        if self._optim() is not optim:
            raise _Changed(
                "the optimizer stepping this accountant must stay the DP optimizer it was bound to. "
                "Found another optimizer. Use one PrivacyEngine per model and optimizer."
            )
        if optim.original_optimizer is not self.base:
            raise _Changed(
                f"the optimizer the DP optimizer wraps must stay the one of the first step (step {step}). Found "
                f"another {type(optim.original_optimizer).__name__}. Use one PrivacyEngine per model and optimizer."
            )
        current = trainable(optim)
        if len(current) != len(self.params) or not all(map(operator.is_, current, self.params)):
            frozen = self._names([p for p in self.params if not p.requires_grad])
            raise _Changed(
                f"the parameters the DP optimizer trains must stay the same for the whole run (step {step}). "
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
                f"register_optimizer_step_pre_hook), before step {step}. A pre-hook runs after the "
                "accountant checked the step and before the update, where a write to the parameters or the "
                "gradients would go unseen. Remove it; do its work before optimizer.step()."
            )
        override = internals.foreign_step(self.base)
        if override is not None:
            raise _Changed(
                f"the optimizer's step must be its class's own (or torch's LR-scheduler wrapper of it). Found "
                f"{getattr(override, '__qualname__', type(override).__name__)!r} set on the "
                f"{type(self.base).__name__} object, before step {step}: it runs after the accountant checked "
                "the step and before the update, where a write to the parameters would go unseen. Remove it."
            )
        if internals.first_step_post_hook_id(self.base) != self.record.handle_id:
            raise _Changed(f"{NOT_FIRST} (Before step {step}.)")
        if internals.stepped_by_grad_scaler():
            raise _Changed(
                f"the optimizer step must not be taken by torch's GradScaler (mixed precision with loss scaling; "
                f"step {step}): Opacus clips the per-example gradients of the scaled loss, so a step moves by "
                "lr x scale (a step size that changes with the scale), and the steps the scaler skips make the "
                "number of steps depend on the data. Found scaler.step(optimizer). Train in float32, or under "
                "torch.autocast(dtype=torch.bfloat16) without a GradScaler (on the declared route; model='glm' needs "
                "float32 scores)."
            )

    # -- the examples of the step
    def verify_examples(self, optim: Any, watch: LoaderWatch, counter: ExampleCounter | None) -> int:
        """One backward pass, and as many examples entering the private module in training forward passes
        as clipped gradients. Returns the per-example clipped gradients the step sums (with skipped steps:
        theirs too), which the run monitor compares with the batch the step drew."""
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
        if counter is not None and counter.unknown is not None:
            raise _Changed(
                f"{_ONE_EACH}, so the accountant counts the examples entering the private module. Found a training "
                f"forward call since the last step whose examples cannot be counted (arguments: {counter.unknown}; "
                "no tensor with a batch dimension). Pass the batch as a tensor, or a tuple, list, dict or "
                "dataclass of tensors whose first tensor has one row per example."
            )
        if internals.last_step_skipped(optim):
            total = self._skipped_total(optim, watch, counter, count)
        else:
            total = count
            if counter is not None and counter.count != count:
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

    # -- the declared gradient norms
    def verify_within_clip(self, optim: Any, step: int) -> None:
        """With ``gradient_norms_within_clip=True`` declared: clipping left every per-example gradient of the
        step unchanged, i.e. Opacus' factor min(1, C / (norm + 1e-6)) was 1 (every norm <= C - 1e-6,
        docs/derivations/glm.md). The norms are Opacus' own (``clip_and_accumulate``: the norms of each
        parameter's per-example gradients, stacked, then their norm). A necessary check at the points the run
        visited; the declaration is over the whole domain."""
        samples = optim.grad_samples
        if not samples or len(samples[0]) == 0:  # no trainable parameter, or an empty (Poisson) batch
            return
        per_param = [g.reshape(len(g), -1).norm(2, dim=-1) for g in samples]
        norms = torch.stack([n.to(per_param[0].device) for n in per_param], dim=1).norm(2, dim=1)
        clip = optim.max_grad_norm
        if bool((clip / (norms + OPACUS_CLIP_EPSILON) < 1.0).any()):
            largest = float(norms.max())
            raise _Changed(
                f"gradient_norms_within_clip=True was declared for accountant {self.reg.name!r}: every per-example "
                "gradient norm is <= max_grad_norm on the whole domain, so clipping never changes a gradient and "
                "the update is a gradient step (the bounds rely on it). Found a per-example gradient norm of "
                f"{largest:.6g} at step {step}, with max_grad_norm={clip:g} (Opacus scales a gradient by "
                f"min(1, max_grad_norm / (norm + {OPACUS_CLIP_EPSILON:g})): the identity only for norms <= "
                f"max_grad_norm - {OPACUS_CLIP_EPSILON:g}): clipping was active. Drop the declaration (register "
                "without gradient_norms_within_clip: the bounds then allow for clipping), or raise max_grad_norm "
                "above every per-example gradient norm on the whole domain."
            )

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

    # -- the model
    def verify_model(self, steps: int, *, release: bool = False) -> None:
        """Nothing but the accounted steps (and the projection right after them) wrote to the model's
        parameters since the last step, no buffer changed since binding (``release``: when an epsilon is
        read, also no buffer added anywhere); with a declared diameter, the parameters lie in the ball."""
        after = self.record.after
        if isinstance(after, str):  # the post-hook found itself not first: the step's record is not to be trusted
            raise _Changed(after)
        projection = PROJECTIONS.get(self.base)
        if after is not None:
            stamp, expected, others = after
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
        self._verify_buffers(steps, release)
        self._verify_projection(projection, steps)

    def _verify_buffers(self, steps: int, release: bool) -> None:
        changed = self.buffers.changed(anywhere=release)
        if changed:
            raise _Changed(
                f"the model's buffers must not change during training (step {steps + 1}): a buffer updated by a "
                "forward pass (a running statistic of the private inputs, as a BatchNorm in training mode or a "
                "custom centering layer keeps) is released with the model without noise and mixes the examples "
                f"of a batch. Found {', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''} changed, "
                "replaced or added since make_private. Put such layers in eval mode (model.eval() on frozen "
                "BatchNorms) or remove them; only data-independent buffers (BatchNorm's num_batches_tracked) may "
                "change."
            )

    def _verify_projection(self, projection: Any, steps: int) -> None:
        diameter = self.reg.assumptions.diameter
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
