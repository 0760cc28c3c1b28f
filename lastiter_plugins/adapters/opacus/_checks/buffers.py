"""The module's buffers keep their values (every row: a buffer updated by a forward pass, a running
statistic of the private inputs, is released with the model without noise and mixes a batch's examples)."""

from __future__ import annotations

import weakref

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.adapters.opacus._errors import LastIteratePipelineChangedError as _Changed
from lastiter_plugins.host import Departure

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


class FrozenBuffers(Check):
    """The module's tracked buffers when the run was bound, with copies of their values (by value: torch's
    batch norm updates its running statistics in place without bumping their version counters)."""

    def __init__(self, module: torch.nn.Module | None) -> None:
        self._module = None if module is None else weakref.ref(module)
        self.recorded = [(name, owner, key, b, b.detach().clone()) for name, owner, key, b in tracked_buffers(module)]

    def tensors(self) -> list[torch.Tensor]:
        return [b for _, _, _, b, _ in self.recorded]

    def rebase(self) -> None:
        """Take the buffers as they are now as the run's (a checkpoint's, checked against its digest)."""
        self.__init__(self._module() if self._module is not None else None)  # type: ignore[misc]

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

    def at_step(self, step: Step) -> Departure | None:
        self.verify(step.number - 1, release=False)
        return None

    def verify(self, steps: int, *, release: bool) -> None:
        changed = self.changed(anywhere=release)
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
