"""Everything the Opacus adapter reads from Opacus' (or torch's) private state, in one place; it patches
nothing (every patch of torch and Opacus is :mod:`~lastiter_plugins.adapters.opacus._patches`).

The rest of the adapter uses only public Opacus and torch API. What is read here, and why:

* the locals of a running ``PrivacyEngine.make_private`` / ``make_private_with_epsilon`` frame (matched by
  code object): Opacus gives an accountant only the sample rate, and the loader, optimizer and module are
  needed to verify the declaration;
* ``DPOptimizer._is_last_step_skipped``: whether the step being taken also sums the clipped gradients of
  steps skipped with ``signal_skip_step``;
* ``Tensor._version`` (torch): bumped by every in-place write to a parameter, it shows writes made outside
  the DP optimizer's step;
* ``Optimizer._optimizer_step_pre_hooks`` / ``_optimizer_step_post_hooks`` and the global hooks of
  ``torch.optim.optimizer`` (torch): a step pre-hook, or a post-hook running before the adapter's own, could
  write to the parameters between the accountant's check and its record of their versions, unseen;
* ``GradSampleModule.GRAD_SAMPLERS[nn.Linear]``: whether Opacus' own grad sampler (rank one on 2-D inputs)
  computes the final Linear's per-example gradients on the GLM route;
* ``PrivacyEngine.dataset`` (set by ``make_private``): whether an engine has already handed its accountant's
  hook to an optimizer;
* ``make_private``'s default ``criterion`` object: whether the user passed a loss module;
* ``_module`` of Opacus' GradSampleModule and of the hooks object of ``make_private(wrap_model=False)``: the
  user's model they hold.

It also holds everything that differs between the tested Opacus versions. Opacus 1.6 has an accountant
registry (``opacus.accountants.register_accountant``; ``PrivacyEngine(accountant=name)`` and
``make_private_with_epsilon`` create any registered name). Opacus 1.5 has none: its ``create_accountant``
knows only ``rdp``, ``gdp`` and ``prv``. There :func:`register_accountant` keeps the adapter's own registry,
:func:`create_accountant` reads it, the accountant is assigned to the engine (``engine.accountant = ...``),
and :func:`refuse_host_calibration` refuses ``make_private_with_epsilon`` (whose calibration would create the
accountant by name) with :class:`lastiter_plugins.UnsupportedHostError`. (Opacus 1.5's
``IAccountant.state_dict`` stores the ``mechanism`` method, not its value; the accountant writes and reads
both of Opacus' keys itself, so that needs no switch.)

:func:`require_tested_opacus` refuses an Opacus version these reads were not tested with
(:data:`TESTED_OPACUS`).
"""

from __future__ import annotations

import operator
import sys
from types import FrameType
from typing import Any

import opacus
import opacus.accountants
import torch.optim.optimizer as torch_optimizer
from opacus.grad_sample import AbstractGradSampleModule, GradSampleModule
from opacus.grad_sample.linear import compute_linear_grad_sample
from opacus.privacy_engine import PrivacyEngine

import lastiter_plugins as lp

#: Opacus minor versions whose internals this module was tested against.
TESTED_OPACUS = ("1.5", "1.6")

#: Whether Opacus has an accountant registry (1.6: ``register_accountant``); 1.5 has none.
HAS_ACCOUNTANT_REGISTRY = hasattr(opacus.accountants, "register_accountant")

#: Opacus 1.5: the adapter's own registry of accountant classes by name (Opacus' names stay Opacus').
_ADAPTER_ACCOUNTANTS: dict[str, type] = {}
_OPACUS_15_NAMES = ("rdp", "gdp", "prv")

try:  # Opacus 1.6: make_private(wrap_model=False) returns a hooks object holding the user's model
    from opacus.grad_sample.gsm_base import AbstractGradSampleHooks

    _HOOKS: tuple[type, ...] = (AbstractGradSampleHooks,)
except ImportError:  # pragma: no cover - Opacus 1.5 always wraps
    _HOOKS = ()


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


def opacus_linear_grad_sampler() -> bool:
    """Whether the grad sampler Opacus uses for ``torch.nn.Linear`` is its own (``compute_linear_grad_sample``:
    dloss/du outer the input row, per example)."""
    import torch

    return GradSampleModule.GRAD_SAMPLERS.get(torch.nn.Linear) is compute_linear_grad_sample


def unwrap(module: Any) -> Any:
    """The user's model inside Opacus' GradSampleModule (its ``_module``), the hooks object of
    ``make_private(wrap_model=False)`` (its ``_module``: the model itself, which the loop calls) and (DP)DDP
    wrappers."""
    for _ in range(4):
        if isinstance(module, (AbstractGradSampleModule, *_HOOKS)):
            module = getattr(module, "_module")  # noqa: B009  (Opacus' wrappers hold the model there)
        elif type(module).__name__ in ("DistributedDataParallel", "DifferentiallyPrivateDistributedDataParallel"):
            module = module.module
        else:
            break
    return module
