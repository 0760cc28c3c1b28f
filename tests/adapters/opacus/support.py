"""Helpers the Opacus adapter tests share: ``from .support import dataset, engine``.

Imported after each test module's ``pytest.importorskip("opacus")``. The two-process worker
(opacus_ddp_worker.py) runs as a script and keeps its own copy of the engine.
"""

from __future__ import annotations

import opacus.accountants
import torch
from opacus import PrivacyEngine
from torch.utils.data import TensorDataset

from lastiter_plugins.adapters import opacus as lo

#: Opacus >= 1.6 creates accountants by name (PrivacyEngine(accountant=name)); 1.5 has no registry
OPACUS_REGISTRY = hasattr(opacus.accountants, "register_accountant")


def engine(name: str) -> PrivacyEngine:
    """PrivacyEngine(accountant=name); Opacus 1.5 has no accountant registry: attach the accountant instead."""
    if OPACUS_REGISTRY:
        return PrivacyEngine(accountant=name)
    created = PrivacyEngine()
    lo.attach(created, name)
    return created


def dataset(n: int, features: int = 3) -> TensorDataset:
    """``n`` examples (seed 0): standard normal features scaled to norm 1, labels 0 or 1 with probability 1/2."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=gen)
    x = x / x.norm(dim=1, keepdim=True)
    return TensorDataset(x, (torch.rand(n, generator=gen) < 0.5).float())


def left(accountant) -> dict[str, tuple[int, dict]]:
    """The accountant's departures: fact -> (the step it left from, the pipeline fields it weakened), the
    update as its value ("any")."""
    return {d.fact: (d.step, {k: getattr(v, "value", v) for k, v in d.changes.items()}) for d in accountant.departures}
