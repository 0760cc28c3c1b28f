"""``gradient_norms_within_clip=True`` declared by hand: clipping left every per-example gradient of the step
unchanged (gates the rows that need clipping never active; under per-layer clipping, also every row that
needs the plain SGD update, which active per-layer clipping is not)."""

from __future__ import annotations

import math
from typing import Any

import torch

from lastiter_plugins.adapters.opacus._checks.base import Check, Step
from lastiter_plugins.glm import OPACUS_CLIP_EPSILON
from lastiter_plugins.host import Departure


def _norms(samples: list[torch.Tensor]) -> list[torch.Tensor]:
    return [g.reshape(len(g), -1).norm(2, dim=-1) for g in samples]


class DeclaredWithinClip(Check):
    """Opacus' factor min(1, C / (norm + 1e-6)) was 1 for every example of the step: every norm <= C - 1e-6
    (docs/derivations/glm.md), with the norms Opacus computes (flat: the norms of each parameter's per-example
    gradients, stacked, then their norm; per layer: each parameter's against its own C_i; ghost: the module's
    per-example norms of the first pass). A necessary check at the points the run visited; the declaration
    is over the whole domain."""

    gates = "the rows that need clipping never active (gradient_norms_within_clip=False)"

    def __init__(self, module: Any) -> None:
        self._module = module  # the private module (ghost: its per-example norms), or None
        self.left = False

    def at_step(self, step: Step) -> Departure | None:
        if self.left:
            return None
        found = self.largest(step.optim, step.observed.clipping)
        if found is None:
            return None
        norm, clip = found
        self.left = True
        changes: dict[str, Any] = {"gradient_norms_within_clip": False}
        if step.observed.clipping == "per_layer":
            changes["update"] = "any"  # active per-layer clipping is not the gradient step the rows analyse
        return Departure(
            step.number,
            f"a per-example gradient norm of {norm:.6g} exceeds max_grad_norm - {OPACUS_CLIP_EPSILON:g} with "
            f"max_grad_norm={clip:g}: clipping was active, though gradient_norms_within_clip=True was declared",
            changes,
        )

    def largest(self, optim: Any, clipping: str) -> tuple[float, float] | None:
        """(the largest norm, its clip norm) when a norm makes clipping active, else None."""
        if clipping == "ghost":
            norms = getattr(self._module, "per_sample_gradient_norms", None) if self._module is not None else None
            if norms is None:  # (not readable, e.g. make_private(wrap_model=False): not checked, so not kept)
                return math.inf, float(optim.max_grad_norm)
            pairs = [(norms, float(optim.max_grad_norm))] if len(norms) else []
        else:
            samples = optim.grad_samples
            if not samples or len(samples[0]) == 0:  # no trainable parameter, or an empty (Poisson) batch
                return None
            per_param = _norms(samples)
            if clipping == "per_layer":
                pairs = list(zip(per_param, (float(c) for c in optim.max_grad_norms), strict=True))
            else:
                stacked = torch.stack([n.to(per_param[0].device) for n in per_param], dim=1).norm(2, dim=1)
                pairs = [(stacked, float(optim.max_grad_norm))]
        for norms, clip in pairs:
            if bool((clip / (norms + OPACUS_CLIP_EPSILON) < 1.0).any()):
                return float(norms.max()), clip
        return None
