"""The rows a batch holds, fingerprinted: what lets the run monitor tell which delivered batch a step's forward
pass received (docs/derivations/opacus-adapter.md#run-monitor, *Matching steps to deliveries*).

A fingerprint is the shape of the first tensor of a batch (depth first through tuples, lists, dicts and
dataclasses: a forward call's first tensor argument, a delivered ``(inputs, labels)``'s inputs) and 16 of its
values, evenly spaced, as float64 on the CPU: equal for the delivered tensor and for the same rows moved to
another device or dtype; another batch of the same shape differs in some of those values unless its rows are
equal there (then the step's batch is matched by the order rule alone, as without fingerprints).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import torch

#: values of a tensor a fingerprint holds
_VALUES = 16

Fingerprint = tuple[tuple[int, ...], tuple[float, ...]]


def children(value: Any) -> Iterable[Any] | None:
    """The items of a container a batch may nest in (a dict's values, a list's or tuple's items, a dataclass
    instance's fields, in order); None for anything else."""
    if isinstance(value, Mapping):
        return value.values()
    if isinstance(value, (list, tuple)):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (getattr(value, field.name) for field in dataclasses.fields(value))
    return None


def first_tensor(value: Any, depth: int = 0) -> torch.Tensor | None:
    """The first tensor of ``value``, depth first (tuples, lists, dicts, dataclasses; 4 levels at most)."""
    if isinstance(value, torch.Tensor):
        return value
    if depth >= 4:
        return None
    items = children(value)
    if items is None:
        return None
    for item in items:
        found = first_tensor(item, depth + 1)
        if found is not None:
            return found
    return None


def fingerprint(value: Any) -> Fingerprint | None:
    """The fingerprint of ``value``'s first tensor (None: no tensor, or a tensor without rows)."""
    tensor = first_tensor(value)
    if tensor is None or tensor.dim() == 0:
        return None
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return tuple(tensor.shape), ()
    where = torch.linspace(0, flat.numel() - 1, steps=min(_VALUES, flat.numel())).long().to(flat.device)
    values = flat[where].to("cpu", torch.float64).tolist()
    return tuple(tensor.shape), tuple(values)
