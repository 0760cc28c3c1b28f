"""Everything the Opacus adapter reads from Opacus' (or torch's) private state, in one place.

The rest of the adapter uses only public Opacus and torch API. What is read here,
and why:

* the locals of a running ``PrivacyEngine.make_private`` / ``make_private_with_epsilon``
  frame (matched by code object): Opacus gives an accountant only the sample rate,
  and the loader, optimizer and module are needed to verify the declaration;
* ``DPOptimizer._is_last_step_skipped``: whether the step being taken also sums the
  clipped gradients of steps skipped with ``signal_skip_step``;
* a scan of the live objects for the ``BatchSplittingSampler`` of a
  ``BatchMemoryManager`` (Opacus offers no way to ask an optimizer who splits its batches);
* ``Tensor._version`` (torch): bumped by every in-place write to a parameter, it
  shows writes made outside the DP optimizer's step;
* ``Optimizer._optimizer_step_pre_hooks`` / ``_optimizer_step_post_hooks`` and the
  global hooks of ``torch.optim.optimizer`` (torch): a step pre-hook, or a post-hook
  running before the adapter's own, could write to the parameters between the
  accountant's check and its record of their versions, unseen;
* ``GradSampleModule.GRAD_SAMPLERS[nn.Linear]``: whether Opacus' own grad sampler (rank one on 2-D
  inputs) computes the final Linear's per-example gradients on the GLM route;
* ``PrivacyEngine.dataset`` (set by ``make_private``): whether an engine has already
  handed its accountant's hook to an optimizer;
* ``make_private``'s default ``criterion`` object: whether the user passed a loss module;
* the frames above the step hook: whether torch's ``GradScaler.step`` takes the step (mixed
  precision with loss scaling);
* the class of the bound loader's batch sampler, swapped for a subclass that records each batch it
  yields (:func:`record_batches`): a DataLoader's ``batch_sampler`` cannot be reassigned after
  construction, and Opacus' ``BatchMemoryManager`` iterates that very object, so the record is made at
  the object itself;
* torch's ``_BaseDataLoaderIter.__next__``, wrapped once (with the plateau hook below) to tell a recorded
  sampler's listeners that the loop received a batch of a pass (:data:`DELIVERED`): with worker processes a
  loader draws batches ahead of the loop, and only a delivered batch can have been skipped by it. Torch
  delivers an iterator's batches in the order its sampler drew them (``in_order=True``, the default); an
  iterator with ``_in_order`` False reports nothing (its deliveries stay unknown);
* torch's ``ReduceLROnPlateau.__init__``, wrapped (once the version check has passed) to remember
  every instance (:func:`plateau_schedulers`): a scheduler holds a reference to its optimizer, not the reverse, and a
  rule that reads training losses must be found whether it fires or not
  (docs/derivations/opacus-adapter.md#run-monitor).

It also holds everything that differs between the tested Opacus versions. Opacus 1.6
has an accountant registry (``opacus.accountants.register_accountant``;
``PrivacyEngine(accountant=name)`` and ``make_private_with_epsilon`` create any
registered name). Opacus 1.5 has none: its ``create_accountant`` knows only ``rdp``,
``gdp`` and ``prv``. There :func:`register_accountant` keeps the adapter's own
registry, :func:`create_accountant` reads it, the accountant is assigned to the
engine (``engine.accountant = ...``), and :func:`refuse_host_calibration` refuses
``make_private_with_epsilon`` (whose calibration would create the accountant by name)
with :class:`lastiter_plugins.UnsupportedHostError`. (Opacus 1.5's
``IAccountant.state_dict`` stores the ``mechanism`` method, not its value; the
accountant writes and reads both of Opacus' keys itself, so that needs no switch.)

:func:`require_tested_opacus` refuses an Opacus version these reads were not
tested with (:data:`TESTED_OPACUS`).
"""

from __future__ import annotations

import functools
import gc
import itertools
import operator
import sys
import weakref
from collections.abc import Callable
from types import FrameType, GeneratorType
from typing import Any

import opacus
import opacus.accountants
import torch.amp.grad_scaler as torch_grad_scaler
import torch.optim.lr_scheduler as torch_lr_scheduler
import torch.optim.optimizer as torch_optimizer
import torch.utils.data.dataloader as torch_data_loader
from opacus.grad_sample import GradSampleModule
from opacus.grad_sample.linear import compute_linear_grad_sample
from opacus.privacy_engine import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchSplittingSampler

import lastiter_plugins as lp

#: Opacus minor versions whose internals this module was tested against.
TESTED_OPACUS = ("1.5", "1.6")

#: Whether Opacus has an accountant registry (1.6: ``register_accountant``); 1.5 has none.
HAS_ACCOUNTANT_REGISTRY = hasattr(opacus.accountants, "register_accountant")

#: Opacus 1.5: the adapter's own registry of accountant classes by name (Opacus' names stay Opacus').
_ADAPTER_ACCOUNTANTS: dict[str, type] = {}
_OPACUS_15_NAMES = ("rdp", "gdp", "prv")


def opacus_version() -> str:
    return str(getattr(opacus, "__version__", "unknown"))


def require_tested_opacus(version: str | None = None) -> None:
    """Raise UnsupportedHostError unless ``version`` (default: the installed Opacus) is tested."""
    version = opacus_version() if version is None else version
    minor = ".".join(version.split(".")[:2])
    if minor not in TESTED_OPACUS:
        raise lp.UnsupportedHostError(
            f"opacus version must be one of {', '.join(v + '.x' for v in TESTED_OPACUS)} for the last-iterate "
            f"adapter: it reads Opacus internals (make_private's arguments, the skip-step flag) that other versions "
            f"may change. Found opacus {version}. Install a tested version (pip install 'opacus>=1.5,<1.7')."
        )
    remember_plateau_schedulers()  # (patches torch only for a tested Opacus)
    remember_grad_scalers()


def register_accountant(name: str, cls: type, *, force: bool) -> None:
    """Register ``cls`` under ``name``: with Opacus' registry (1.6), else the adapter's (1.5).

    Raises ValueError (Opacus' message) when ``name`` is taken and ``force`` is False.
    """
    if HAS_ACCOUNTANT_REGISTRY:
        opacus.accountants.register_accountant(name, cls, force=force)
        return
    if not force and (name in _OPACUS_15_NAMES or name in _ADAPTER_ACCOUNTANTS):
        raise ValueError(f"Accountant for mechanism {name} is already registered")
    _ADAPTER_ACCOUNTANTS[name] = cls


def create_accountant(name: str) -> Any:
    """A new accountant of the class registered under ``name`` (Opacus' registry on 1.6, the adapter's on 1.5)."""
    if HAS_ACCOUNTANT_REGISTRY:
        return opacus.accountants.create_accountant(name)
    if name in _ADAPTER_ACCOUNTANTS:
        return _ADAPTER_ACCOUNTANTS[name]()
    return opacus.accountants.create_accountant(name)


def engine_made_private(engine: Any) -> bool:
    """Whether ``engine.make_private`` has run (it sets ``engine.dataset`` from the data loader, and
    has then given the optimizer the hook of the accountant the engine held at that time)."""
    return getattr(engine, "dataset", None) is not None


def refuse_host_calibration(name: str) -> None:
    """On Opacus 1.5, raise UnsupportedHostError when called (through the accountant's ``mechanism()``)
    by ``PrivacyEngine.make_private_with_epsilon``: its calibration creates a fresh accountant with
    ``create_accountant(self.accountant.mechanism())``, which in 1.5 knows only rdp, gdp and prv
    (it would fail with "Unexpected accounting mechanism", or, for a name forced over Opacus' own,
    calibrate with Opacus' accountant instead of this one). Nothing on Opacus 1.6."""
    if HAS_ACCOUNTANT_REGISTRY:
        return
    frame = sys._getframe(2)  # 0: here, 1: mechanism(), 2: its caller
    try:
        called_by_calibration = frame is not None and frame.f_code is PrivacyEngine.make_private_with_epsilon.__code__
    finally:
        del frame
    if called_by_calibration:
        raise lp.UnsupportedHostError(
            f"PrivacyEngine.make_private_with_epsilon must create the accountant by name to calibrate, which "
            f"needs Opacus' accountant registry (Opacus >= 1.6). Found opacus {opacus_version()}, whose "
            f"create_accountant knows only {', '.join(_OPACUS_15_NAMES)}, with last-iterate accountant {name!r}. "
            "Calibrate with lastiter_plugins.calibrate_noise(...) and call make_private(noise_multiplier=...), "
            "or install opacus 1.6."
        )


def engine_locals(method: str, depth: int = 12) -> dict[str, Any] | None:
    """Locals of the innermost running ``PrivacyEngine.<method>`` frame, or None.

    Matched by code object identity, so only Opacus' own method matches. Only
    reads; no frame is kept.
    """
    target = getattr(PrivacyEngine, method).__code__
    frame: FrameType | None = sys._getframe(1)
    try:
        for _ in range(depth):
            if frame is None:
                return None
            if frame.f_code is target:
                return dict(frame.f_locals)
            frame = frame.f_back
        return None
    finally:
        del frame


#: ``make_private``'s default ``criterion`` (a loss module created once, when Opacus was imported): a
#: ``criterion`` that is this object was not given by the user.
DEFAULT_CRITERION = PrivacyEngine.make_private.__kwdefaults__.get("criterion")

#: ``version(tensor)``: its version counter (each in-place write bumps it).
version = operator.attrgetter("_version")


def last_step_skipped(optim: Any) -> bool:
    """Whether ``optim`` skipped its last step (``signal_skip_step``: set by a skipped step, cleared
    after the real one's hook)."""
    return bool(getattr(optim, "_is_last_step_skipped", False))


def versions(tensors: Any) -> tuple[int, ...]:
    """Version counters of ``tensors``."""
    return tuple(map(version, tensors))


def step_pre_hooks(optimizer: Any) -> int:
    """How many step pre-hooks run when ``optimizer.step()`` is called (global ones, then its own:
    ``torch.optim.Optimizer.profile_hook_step``), between Opacus' step hook and the update."""
    return len(torch_optimizer._global_optimizer_pre_hooks) + len(getattr(optimizer, "_optimizer_step_pre_hooks", {}))


def foreign_step(optimizer: Any) -> Any:
    """An instance attribute ``step`` of ``optimizer`` that is not torch's LR-scheduler wrapper of
    the class's own ``step`` (``torch.optim.lr_scheduler``: it only marks the call), else None. Such
    an override runs between Opacus' step hook and the update, like a step pre-hook."""
    override = vars(optimizer).get("step")
    if override is None:
        return None
    own = getattr(type(optimizer).step, "__wrapped__", type(optimizer).step)  # (torch wraps step in profile_hook_step)
    if getattr(override, "_wrapped_by_lr_sched", False) and getattr(override, "__wrapped__", None) in (
        type(optimizer).step,
        own,
    ):
        return None
    return override


def run_first(optimizer: Any, handle: Any) -> None:
    """Move the step post-hook of ``handle`` in front of the others registered on ``optimizer``:
    it runs right after the update (the global post-hooks run after all of these)."""
    optimizer._optimizer_step_post_hooks.move_to_end(handle.id, last=False)


def first_step_post_hook_id(optimizer: Any) -> int | None:
    """The handle id of the post-hook that runs first after ``optimizer``'s update (None without any)."""
    return next(iter(optimizer._optimizer_step_post_hooks), None)


_GRAD_SCALER_STEP = torch_grad_scaler.GradScaler._maybe_opt_step.__code__
#: the live GradScalers (``torch.amp``, also ``torch.cuda.amp``'s subclass): those created, and any seen taking a
#: step (a subclass whose ``__init__`` skips torch's). While there is none, no step is a scaler's.
_SCALERS: weakref.WeakSet = weakref.WeakSet()


def _remembering(function: Any) -> Any:
    @functools.wraps(function)
    def remember(self: Any, *args: Any, **kwargs: Any) -> Any:
        _SCALERS.add(self)
        return function(self, *args, **kwargs)

    remember._lastiter_remembers = True  # type: ignore[attr-defined]
    return remember


def remember_grad_scalers() -> None:
    """Wrap ``GradScaler.__init__`` and ``_maybe_opt_step`` once (after the version check), and find the
    instances created before."""
    cls = torch_grad_scaler.GradScaler
    if getattr(cls._maybe_opt_step, "_lastiter_remembers", False):
        return
    cls.__init__ = _remembering(cls.__init__)  # type: ignore[method-assign]
    cls._maybe_opt_step = _remembering(cls._maybe_opt_step)  # type: ignore[method-assign]
    _SCALERS.update(obj for obj in gc.get_objects() if issubclass(type(obj), cls))


def stepped_by_grad_scaler(depth: int = 12) -> bool:
    """Whether torch's ``GradScaler.step`` (``torch.amp``, also ``torch.cuda.amp``) is taking the
    optimizer step that calls this (a frame of its ``_maybe_opt_step`` up the stack; looked for only
    while a GradScaler exists, :data:`_SCALERS`). Only reads."""
    if not _SCALERS:
        return False
    frame: FrameType | None = sys._getframe(1)
    try:
        for _ in range(depth):
            if frame is None:
                return False
            if frame.f_code is _GRAD_SCALER_STEP:
                return True
            frame = frame.f_back
        return False
    finally:
        del frame


class SplitterFinder:
    """Finds (once, by scanning the live objects) and remembers the ``BatchSplittingSampler``
    that splits the batches of ``batch_sampler`` for ``optim``."""

    def __init__(self) -> None:
        self._found: Any = None

    def splits(self, optim: Any, batch_sampler: Any) -> bool:
        if batch_sampler is None:
            return False

        def match(obj: Any) -> bool:
            return type(obj) is BatchSplittingSampler and obj.optimizer is optim and obj.sampler is batch_sampler

        found = self._found() if self._found is not None else None
        if found is not None and match(found):
            return True
        for obj in gc.get_objects():
            if match(obj):
                self._found = weakref.ref(obj)
                return True
        return False


# ---------------------------------------------------------------- the batches a sampler draws

#: recording subclass -> the host class it records for
_RECORDING_CLASSES: dict[type, type] = {}
#: recorded batch sampler -> the callbacks told of its passes and batches
_LISTENERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: numbers the passes (iterations) of every recorded sampler, in the order they start
PASS_IDS = itertools.count(1)
#: the iterator of a recorded sampler's pass -> (the sampler, [its pass number once started])
_PASSES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: the position a listener is told with batch None: the pass has ended (the sampler is exhausted)
PASS_ENDED = -1
#: the position a listener is told, with the number of the pass' batches the loop has received so far (in the
#: order drawn) instead of a batch: an iterator of torch's DataLoader handed the loop the pass' next batch
DELIVERED = -2


def host_class(obj: Any) -> type:
    """The class ``obj`` had before :func:`record_batches` swapped it for its recording subclass."""
    cls = type(obj)
    return _RECORDING_CLASSES.get(cls, cls)


def _unrecorded(cls: type[object], state: dict[str, Any]) -> Any:
    """A copy of a recorded sampler, of its host class (what pickling and copying a recorded sampler give)."""
    obj = cls.__new__(cls)
    obj.__dict__.update(state)
    return obj


def _recording_class(base: type[Any]) -> type:
    for recording, host in _RECORDING_CLASSES.items():
        if host is base:
            return recording

    def passes(self: Any, numbered: list[int]) -> Any:
        pass_id = next(PASS_IDS)
        numbered += [pass_id, 0]
        for position, batch in enumerate(base.__iter__(self)):
            for listener in list(_LISTENERS.get(self, ())):
                listener(pass_id, position, batch)
            yield batch
        for listener in list(_LISTENERS.get(self, ())):
            listener(pass_id, PASS_ENDED, None)

    def __iter__(self: Any) -> Any:
        numbered: list[int] = []  # the pass number and the batches delivered, once the pass has started
        iterator = passes(self, numbered)
        _PASSES[iterator] = (weakref.ref(self), numbered)
        return iterator

    def __reduce_ex__(self: Any, protocol: Any) -> Any:
        # pickled or copied as the host class: the recording belongs to this process' accountants
        return _unrecorded, (base, dict(vars(self)))

    namespace = {"__iter__": __iter__, "__reduce_ex__": __reduce_ex__, "__module__": base.__module__}
    recording = type(base.__name__, (base,), namespace)
    recording.__qualname__ = base.__qualname__
    _RECORDING_CLASSES[recording] = base
    return recording


def record_batches(batch_sampler: Any, listener: Callable[[int, int, Any], None]) -> None:
    """Call ``listener(pass_id, position, batch)`` for every batch ``batch_sampler`` yields from now on
    (every iteration: the training loop's, an evaluation pass', a ``BatchMemoryManager``'s; position
    :data:`PASS_ENDED` and batch None when a pass ends; position :data:`DELIVERED` and the number of batches
    delivered so far when a ``DataLoader`` iterator over the sampler hands the loop the pass' next batch), by swapping
    the object's class for a subclass whose ``__iter__`` reports each batch. ``listener`` is held weakly
    (a bound method: weakly through its object)."""
    report_deliveries()
    cls = type(batch_sampler)
    if cls not in _RECORDING_CLASSES:
        batch_sampler.__class__ = _recording_class(cls)
    listeners = _LISTENERS.setdefault(batch_sampler, [])
    ref = weakref.WeakMethod(listener) if hasattr(listener, "__self__") else (lambda: listener)

    def call(pass_id: int, position: int, batch: Any) -> None:
        target = ref()
        if target is None:
            listeners.remove(call)
        else:
            target(pass_id, position, batch)

    listeners.append(call)


_loader_next = torch_data_loader._BaseDataLoaderIter.__next__


@functools.wraps(_loader_next)
def _reporting_next(self: Any) -> Any:
    data = _loader_next(self)
    passes = getattr(self, "_sampler_iter", None)  # (a recorded pass is a generator; other iterators may not be
    entry = _PASSES.get(passes) if type(passes) is GeneratorType else None  # weakly referable)
    if entry is not None and getattr(self, "_in_order", True):
        sampler, numbered = entry[0](), entry[1]
        if numbered:
            numbered[1] += 1
        for listener in list(_LISTENERS.get(sampler, ())) if sampler is not None and numbered else ():
            listener(numbered[0], DELIVERED, numbered[1])
    return data


def report_deliveries() -> None:
    """Wrap torch's ``_BaseDataLoaderIter.__next__`` once: a batch handed to the loop by an iterator over a
    recorded sampler is reported to its listeners (:data:`DELIVERED`)."""
    if getattr(torch_data_loader._BaseDataLoaderIter.__next__, "_lastiter_reports", False):
        return
    _reporting_next._lastiter_reports = True  # type: ignore[attr-defined]
    torch_data_loader._BaseDataLoaderIter.__next__ = _reporting_next  # type: ignore[method-assign]  # wraps the host's iterator


# ---------------------------------------------------------------- learning-rate rules that read losses

_PLATEAUS: weakref.WeakSet = weakref.WeakSet()
_plateau_init = torch_lr_scheduler.ReduceLROnPlateau.__init__


@functools.wraps(_plateau_init)
def _remembering_init(self: Any, *args: Any, **kwargs: Any) -> None:
    _plateau_init(self, *args, **kwargs)
    _PLATEAUS.add(self)


def remember_plateau_schedulers() -> None:
    """Wrap ``ReduceLROnPlateau.__init__`` once (after the version check: :func:`require_tested_opacus`), and
    find the instances created before."""
    if getattr(torch_lr_scheduler.ReduceLROnPlateau.__init__, "_lastiter_remembers", False):
        return
    _remembering_init._lastiter_remembers = True  # type: ignore[attr-defined]
    torch_lr_scheduler.ReduceLROnPlateau.__init__ = _remembering_init  # type: ignore[method-assign]  # wraps the host's constructor
    _PLATEAUS.update(obj for obj in gc.get_objects() if issubclass(type(obj), torch_lr_scheduler.ReduceLROnPlateau))


def plateau_schedulers(optimizers: Any) -> list[Any]:
    """The live ``ReduceLROnPlateau`` schedulers (and subclasses) that hold one of ``optimizers``."""
    if not _PLATEAUS:  # (the common case: no such scheduler alive, nothing to walk)
        return []
    return [s for s in list(_PLATEAUS) if any(getattr(s, "optimizer", None) is o for o in optimizers)]


def opacus_linear_grad_sampler() -> bool:
    """Whether the grad sampler Opacus uses for ``torch.nn.Linear`` is its own (``compute_linear_grad_sample``:
    dloss/du outer the input row, per example)."""
    import torch

    return GradSampleModule.GRAD_SAMPLERS.get(torch.nn.Linear) is compute_linear_grad_sample
