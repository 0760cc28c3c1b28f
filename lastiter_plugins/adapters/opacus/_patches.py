"""Every patch the Opacus adapter makes to torch and Opacus, held by one object (:data:`PATCHES`).

A run monitor needs to see a few things that neither torch nor Opacus reports to an accountant. Each is
observed by wrapping one function of a host class, in this module only:

=================================================  =====================================================
patched function                                    what it reports, to whom
=================================================  =====================================================
``torch.utils.data.BatchSampler.__iter__``,         the batches a recorded batch sampler yields, per pass
Opacus' ``UniformWithReplacementSampler.__iter__``  (:func:`record_batches`: the run's batch queue);
``DistributedUniformWithReplacementSampler``, and   other samplers pass through untouched unless a run
this package's ``RandomAllocationSampler``          adopts them (:func:`adopt_samplers`); that a pass
                                                    starts, before it draws (:func:`record_pass_starts`)
``torch.utils.data.dataloader.                      that the loop received a batch of a recorded pass
_BaseDataLoaderIter.__next__``                      (:data:`DELIVERED`): workers draw ahead of the loop
``torch.optim.lr_scheduler.ReduceLROnPlateau.step``  that a rule read a metric for an optimizer
                                                    (:func:`metric_reads`)
``torch.amp.grad_scaler.GradScaler._maybe_opt_step``  that torch's GradScaler takes an optimizer's step
                                                    (:func:`stepped_by_grad_scaler`)
``opacus.utils.batch_memory_manager.                the BatchSplittingSampler splitting a batch sampler's
BatchSplittingSampler.__iter__``                    batches for an optimizer (:func:`splits`)
``opacus.utils.fast_gradient_clipping_utils.        ghost clipping: that a step's gradient came from the
DPTensorFastGradientClipping.backward`` and         two-pass backward of a loss the criterion make_private
``DPLossFastGradientClipping.__call__``             returned produced (:func:`listen_ghost_backward`)
=================================================  =====================================================

The patches are installed when the first run starts (``make_private`` or ``bind_data_loader``: a run holds
them, :meth:`HostPatches.hold`) and removed when the last run holding them ends (its monitor is garbage
collected), so the user's other code runs on the hosts' own functions. A patch whose function was patched
again by someone else after ours stays in place, passing every call through, and is not reinstalled twice.
They are installed only for the host versions they were written for (:data:`TESTED_TORCH`, and the Opacus
versions of ``_internals.TESTED_OPACUS``): otherwise :class:`lastiter_plugins.UnsupportedHostError`.
No patch keeps the objects it sees alive (weak references only).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import weakref
from collections.abc import Callable
from types import GeneratorType
from typing import Any

import torch
import torch.amp.grad_scaler as torch_grad_scaler
import torch.optim.lr_scheduler as torch_lr_scheduler
import torch.utils.data.dataloader as torch_data_loader
from opacus.utils.batch_memory_manager import BatchSplittingSampler
from opacus.utils.uniform_sampler import DistributedUniformWithReplacementSampler, UniformWithReplacementSampler
from torch.utils.data import BatchSampler

import lastiter_plugins as lp
from lastiter_plugins.adapters.opacus import _internals as internals
from lastiter_plugins.adapters.opacus._allocation_sampler import RandomAllocationSampler

#: torch minor versions the patched functions were read in: from Opacus 1.5's oldest torch to the tested one
#: (torch 2.13; every patched function keeps its name, owner and role over this range). A newer torch is refused.
TESTED_TORCH = ("2.0", "2.13")

#: numbers the passes (iterations) of every recorded sampler, in the order they start
PASS_IDS = itertools.count(1)
#: the position a listener is told with batch None: the pass has ended (the sampler is exhausted)
PASS_ENDED = -1
#: the position a listener is told, with the number of the pass' batches the loop has received so far (in the
#: order drawn) instead of a batch: an iterator of torch's DataLoader handed the loop the pass' next batch
DELIVERED = -2

#: recorded batch sampler -> the callbacks told of its passes and batches
_BATCH_LISTENERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: the callbacks asked, for a batch sampler not recorded when it starts a pass, whether to record it
_ADOPTERS: list[Callable[[Any], bool]] = []
#: recorded batch sampler -> the callbacks told ``(pass_id)`` when a pass starts, before it draws anything
_PASS_LISTENERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: the iterator of a recorded sampler's pass -> (the sampler, [its pass number, the batches delivered])
_PASSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: optimizer -> how many times a ReduceLROnPlateau holding it read a metric
_METRIC_READS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: the optimizers whose step torch's GradScaler is taking right now
_SCALED: list[Any] = []
#: optimizer -> the BatchSplittingSamplers that iterated for it
_SPLITTERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: DP optimizer -> the callback told ``(phase, tensor)`` around each ghost-clipping backward for it
_GHOST_LISTENERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: the loss tensors a ghost-clipping criterion returned (not those made from them by arithmetic)
_FROM_CRITERION: weakref.WeakSet = weakref.WeakSet()


def _minor(version: str) -> tuple[int, int]:
    major, minor = [*version.split("+")[0].split("."), "0"][:2]
    return int(major), int("".join(c for c in minor if c.isdigit()) or 0)


def require_tested_torch(version: str | None = None) -> None:
    """Raise UnsupportedHostError unless torch ``version`` (default: the installed one) lies in
    :data:`TESTED_TORCH`."""
    version = str(torch.__version__) if version is None else version
    low, high = (_minor(v) for v in TESTED_TORCH)
    if not low <= _minor(version) <= high:
        raise lp.UnsupportedHostError(
            f"torch version must be between {TESTED_TORCH[0]} and {TESTED_TORCH[1]}.x for the last-iterate adapter: "
            "it observes a run by wrapping torch functions (the batch sampler's iterator, the DataLoader iterator's "
            "next, ReduceLROnPlateau.step, GradScaler's optimizer step) whose names and roles newer releases may "
            f"change. Found torch {version}. Install a torch release in that range."
        )


# ---------------------------------------------------------------- the wrappers


def _reporting_iter(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """A sampler's ``__iter__`` that reports every batch of a recorded sampler to its listeners."""

    def passes(sampler: Any, numbered: list[int]) -> Any:
        pass_id = next(PASS_IDS)
        numbered += [pass_id, 0]
        for started in list(_PASS_LISTENERS.get(sampler, ())):  # before the pass draws anything
            started(pass_id)
        for position, batch in enumerate(original(sampler)):
            for listener in list(_BATCH_LISTENERS.get(sampler, ())):
                listener(pass_id, position, batch)
            yield batch
        for listener in list(_BATCH_LISTENERS.get(sampler, ())):
            listener(pass_id, PASS_ENDED, None)

    @functools.wraps(original)
    def __iter__(self: Any) -> Any:
        if self not in _BATCH_LISTENERS and self not in _PASS_LISTENERS and not _adopted(self):
            return original(self)
        numbered: list[int] = []  # the pass number and the batches delivered, once the pass has started
        iterator = passes(self, numbered)
        _PASSES[iterator] = (weakref.ref(self), numbered)
        return iterator

    return __iter__


def _reporting_next(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def __next__(self: Any) -> Any:
        data = original(self)
        passes = getattr(self, "_sampler_iter", None)  # (a recorded pass is a generator; other iterators may not be
        entry = _PASSES.get(passes) if type(passes) is GeneratorType else None  # weakly referable)
        if entry is not None and getattr(self, "_in_order", True):
            sampler, numbered = entry[0](), entry[1]
            if numbered:
                numbered[1] += 1
            for listener in list(_BATCH_LISTENERS.get(sampler, ())) if sampler is not None and numbered else ():
                listener(numbered[0], DELIVERED, (numbered[1], data))
        return data

    return __next__


def _counting_metric_reads(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def step(self: Any, *args: Any, **kwargs: Any) -> Any:
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None:
            with contextlib.suppress(TypeError):  # (not weakly referable: not an optimizer this adapter accounts for)
                _METRIC_READS[optimizer] = _METRIC_READS.get(optimizer, 0) + 1
        return original(self, *args, **kwargs)

    return step


def _marking_scaled_steps(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _maybe_opt_step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        _SCALED.append(optimizer)
        try:
            return original(self, optimizer, *args, **kwargs)
        finally:
            _SCALED.pop()

    return _maybe_opt_step


def _remembering_splitters(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def __iter__(self: Any) -> Any:
        optimizer = getattr(self, "optimizer", None)
        if optimizer is not None:
            _SPLITTERS.setdefault(optimizer, weakref.WeakSet()).add(self)
        return original(self)

    return __iter__


def _reporting_ghost_backward(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def backward(self: Any) -> Any:
        listener = _GHOST_LISTENERS.get(getattr(self, "optimizer", None)) if _GHOST_LISTENERS else None
        target = listener() if listener is not None else None
        if target is None:
            return original(self)
        target("start", self)
        try:
            result = original(self)
        except BaseException:
            target("failed", self)
            raise
        target("end", self)
        return result

    return backward


def _marking_criterion_losses(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        loss = original(self, *args, **kwargs)
        with contextlib.suppress(TypeError):
            _FROM_CRITERION.add(loss)
        return loss

    return __call__


def _ghost_classes() -> tuple[type, type] | None:
    try:  # Opacus >= 1.5
        from opacus.utils.fast_gradient_clipping_utils import (
            DPLossFastGradientClipping,
            DPTensorFastGradientClipping,
        )
    except ImportError:  # pragma: no cover - depends on the Opacus version
        return None
    return DPTensorFastGradientClipping, DPLossFastGradientClipping


# ---------------------------------------------------------------- the object holding them


class _Patch:
    """One function of a host class, wrapped while installed."""

    def __init__(self, owner: type, name: str, wrap: Callable[[Any], Any]) -> None:
        self.owner, self.name, self.wrap = owner, name, wrap
        self.original: Any = None
        self.wrapper: Any = None

    def install(self) -> None:
        if self.wrapper is not None and self.owner.__dict__.get(self.name) is self.wrapper:
            return  # (still in place: patched again by someone else after ours, and not removed)
        self.original = self.owner.__dict__[self.name]
        self.wrapper = self.wrap(self.original)
        self.wrapper._lastiter_patch = True
        setattr(self.owner, self.name, self.wrapper)

    def remove(self) -> None:
        if self.wrapper is not None and self.owner.__dict__.get(self.name) is self.wrapper:
            setattr(self.owner, self.name, self.original)
            self.wrapper = None
        # else: another patch wraps ours; ours stays in its chain and passes every call through

    @property
    def installed(self) -> bool:
        return self.wrapper is not None and self.owner.__dict__.get(self.name) is self.wrapper


class HostPatches:
    """The adapter's patches of torch and Opacus (the table above), installed while a run holds them."""

    def __init__(self) -> None:
        patches = [
            _Patch(BatchSampler, "__iter__", _reporting_iter),
            _Patch(UniformWithReplacementSampler, "__iter__", _reporting_iter),
            _Patch(DistributedUniformWithReplacementSampler, "__iter__", _reporting_iter),
            _Patch(RandomAllocationSampler, "__iter__", _reporting_iter),
            _Patch(torch_data_loader._BaseDataLoaderIter, "__next__", _reporting_next),
            _Patch(torch_lr_scheduler.ReduceLROnPlateau, "step", _counting_metric_reads),
            _Patch(torch_grad_scaler.GradScaler, "_maybe_opt_step", _marking_scaled_steps),
            _Patch(BatchSplittingSampler, "__iter__", _remembering_splitters),
        ]
        ghost = _ghost_classes()
        if ghost is not None:
            patches.append(_Patch(ghost[0], "backward", _reporting_ghost_backward))
            patches.append(_Patch(ghost[1], "__call__", _marking_criterion_losses))
        self.patches = tuple(patches)
        self._holders = 0

    @property
    def installed(self) -> bool:
        return self._holders > 0

    def hold(self, holder: Any) -> None:
        """Install the patches (the first holder), and keep them until ``holder`` is garbage collected."""
        internals.require_tested_opacus()
        require_tested_torch()
        if self._holders == 0:
            for patch in self.patches:
                patch.install()
        self._holders += 1
        weakref.finalize(holder, self._release)

    def _release(self) -> None:
        self._holders -= 1
        if self._holders == 0:
            for patch in self.patches:
                patch.remove()


#: the one object holding every patch
PATCHES = HostPatches()


# ---------------------------------------------------------------- what the patches report


def record_batches(batch_sampler: Any, listener: Callable[[int, int, Any], None]) -> None:
    """Call ``listener(pass_id, position, batch)`` for every batch ``batch_sampler`` yields from now on
    (every iteration: the training loop's, an evaluation pass', a ``BatchMemoryManager``'s; position
    :data:`PASS_ENDED` and batch None when a pass ends; position :data:`DELIVERED` and (the number of batches
    delivered so far, the batch's data) when a ``DataLoader`` iterator over the sampler hands the loop the pass'
    next batch).
    ``listener`` is held weakly (a bound method: weakly through its object). Needs the patches held."""
    listeners = _BATCH_LISTENERS.setdefault(batch_sampler, [])
    ref = weakref.WeakMethod(listener) if hasattr(listener, "__self__") else (lambda: listener)

    def call(pass_id: int, position: int, batch: Any) -> None:
        target = ref()
        if target is None:
            listeners.remove(call)
        else:
            target(pass_id, position, batch)

    listeners.append(call)


def adopt_samplers(adopter: Callable[[Any], bool]) -> None:
    """Ask ``adopter(batch_sampler)`` (a bound method, held weakly through its object) about every batch sampler
    that starts a pass unrecorded: it records the sampler (:func:`record_batches`) and returns True, or returns
    False. Needs the patches held."""
    ref = weakref.WeakMethod(adopter)

    def call(batch_sampler: Any) -> bool:
        target = ref()
        if target is None:
            _ADOPTERS.remove(call)
            return False
        return bool(target(batch_sampler))

    _ADOPTERS.append(call)


def _adopted(batch_sampler: Any) -> bool:
    return any(adopt(batch_sampler) for adopt in list(_ADOPTERS))


def record_pass_starts(batch_sampler: Any, listener: Callable[[int], None]) -> None:
    """Call ``listener(pass_id)`` when a pass of ``batch_sampler`` starts, before it draws its first batch (the
    generator it draws from is then in the state the pass starts from). ``listener``, a bound method, is held
    weakly through its object. Needs the patches held."""
    listeners = _PASS_LISTENERS.setdefault(batch_sampler, [])
    ref = weakref.WeakMethod(listener)

    def call(pass_id: int) -> None:
        target = ref()
        if target is None:
            listeners.remove(call)
        else:
            target(pass_id)

    listeners.append(call)


def metric_reads(optimizers: Any) -> int:
    """How many times a ``ReduceLROnPlateau`` holding one of ``optimizers`` read a metric (``step(metric)``)."""
    if not _METRIC_READS:  # (the common case: no such rule ever read a metric in this process)
        return 0
    return sum(_METRIC_READS.get(o, 0) for o in optimizers)


def stepped_by_grad_scaler(optimizer: Any) -> bool:
    """Whether torch's ``GradScaler`` (``torch.amp``, also ``torch.cuda.amp``) is taking ``optimizer``'s step now."""
    return any(o is optimizer for o in _SCALED)


def splits(optimizer: Any, batch_sampler: Any) -> bool:
    """Whether a ``BatchSplittingSampler`` (Opacus' ``BatchMemoryManager``) over ``batch_sampler`` iterated
    for ``optimizer``."""
    return batch_sampler is not None and any(s.sampler is batch_sampler for s in _SPLITTERS.get(optimizer, ()))


def from_criterion(loss: Any) -> bool:
    """Whether ``loss`` is a loss tensor a ghost-clipping criterion returned (not one made from it by arithmetic)."""
    return loss in _FROM_CRITERION


def listen_ghost_backward(optimizer: Any, listener: Callable[[str, Any], None]) -> None:
    """Tell ``listener(phase, tensor)`` (held weakly, a bound method) of every ghost-clipping backward
    (``DPTensorFastGradientClipping.backward``: the criterion make_private returned) for ``optimizer``:
    phase ``"start"``, then ``"end"`` (or ``"failed"``)."""
    _GHOST_LISTENERS[optimizer] = weakref.WeakMethod(listener)
