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
  shows writes made outside the DP optimizer's step.

:func:`require_tested_opacus` refuses an Opacus version these reads were not
tested with (:data:`TESTED_OPACUS`).
"""

from __future__ import annotations

import gc
import sys
import weakref
from typing import Any

import opacus
from opacus.privacy_engine import PrivacyEngine
from opacus.utils.batch_memory_manager import BatchSplittingSampler

import lastiter_plugins as lp

#: Opacus minor versions whose internals this module was tested against.
TESTED_OPACUS = ("1.5", "1.6")


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


def engine_locals(method: str, depth: int = 12) -> dict[str, Any] | None:
    """Locals of the innermost running ``PrivacyEngine.<method>`` frame, or None.

    Matched by code object identity, so only Opacus' own method matches. Only
    reads; no frame is kept.
    """
    target = getattr(PrivacyEngine, method).__code__
    frame = sys._getframe(1)
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


def last_step_skipped(optim: Any) -> bool:
    """Whether ``optim`` skipped its last step (set by a skipped step, cleared after the real one's hook)."""
    return bool(getattr(optim, "_is_last_step_skipped", False))


def versions(params: Any) -> tuple[int, ...]:
    """Version counters of ``params`` (each in-place write bumps its tensor's counter)."""
    return tuple([p._version for p in params])


def same_versions(params: Any, expected: tuple[int, ...]) -> bool:
    """``versions(params) == expected``, without building the tuple (called at every step:
    a plain loop is the cheapest with the cold caches of a training step)."""
    if len(params) != len(expected):
        return False
    i = 0
    for p in params:
        if p._version != expected[i]:
            return False
        i += 1  # noqa: SIM113 (a counter: enumerate costs more here)
    return True


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
