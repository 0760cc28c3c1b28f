r"""Looking a row up and checking it against a pipeline: :func:`get_spec`, :func:`applicability`, :func:`require`,
and the RDP curves of a row whose preconditions hold (:func:`rdp_curve`, :func:`estimate_curve`).
"""

from __future__ import annotations

import numpy as np

from lastiter_plugins.config import LossAssumptions, TrainingConfig
from lastiter_plugins.errors import NotApplicableError
from lastiter_plugins.registry.spec import Applicability, BoundSpec, Kind, Unmet
from lastiter_plugins.registry.table import BOUND_IDS, BOUNDS, DOCS


def get_spec(bound: str) -> BoundSpec:
    """The table row of a bound id (``best`` has none)."""
    try:
        return BOUNDS[bound]
    except (KeyError, TypeError):
        raise ValueError(f"bound must be one of {', '.join(BOUND_IDS)}. Found {bound!r}.") from None


def applicability(spec: BoundSpec, cfg: TrainingConfig, a: LossAssumptions) -> Applicability:
    """Check every precondition of ``spec`` for the declared pipeline."""
    unmet: list[Unmet] = []
    reasons: list[str] = []
    where = f"{spec.id} ({spec.reference})"
    relation = spec.relation_for(cfg.sampling)
    if relation is None:
        covered = ", ".join(s.value for s in spec.covers)
        schemes = covered if len(spec.covers) == 1 else "one of " + covered
        unmet.append(Unmet(f"sampling must be {schemes}", cfg.sampling.value))
        reasons.append(f"sampling must be one of {covered} for {where}. Found {cfg.sampling.value}.")
    elif relation is not cfg.relation:
        unmet.append(Unmet(f"relation must be {relation.value} with sampling={cfg.sampling.value}", cfg.relation.value))
        reasons.append(
            f"relation must be {relation.value} for {where} with sampling={cfg.sampling.value}. "
            f"Found {cfg.relation.value}."
        )
    for condition in spec.conditions:
        failed = condition(cfg, a)
        if failed is not None:
            unmet.append(Unmet(*failed))
            reasons.append(unmet[-1].message(where))
    shown_relation = next(iter(spec.relations)) if len(spec.relations) == 1 else relation
    return Applicability(spec.id, not unmet, tuple(reasons), shown_relation, spec.reference, tuple(unmet))


def require(spec: BoundSpec, cfg: TrainingConfig, a: LossAssumptions) -> None:
    """Raise NotApplicableError (naming every failed condition and the theorem) unless ``spec`` applies."""
    check = applicability(spec, cfg, a)
    if not check.applies:
        raise NotApplicableError(f"{check.reason} See {DOCS}.")


def estimate_curve(spec: BoundSpec, cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    """What the lower estimate of ``spec``'s epsilon evaluates: its ``estimate_curve`` (at or below its
    curve), or its curve."""
    if spec.estimate_curve is None:
        return rdp_curve(spec, cfg, a, orders)
    return _checked(spec, spec.estimate_curve(cfg, a, orders))


def rdp_curve(spec: BoundSpec, cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    """RDP of ``spec`` at ``orders`` for a pipeline whose applicability the caller has checked.

    Raises:
      NotApplicableError: ``spec`` is a PLD bound (a privacy profile without a Renyi curve).
    """
    if spec.compute is None:
        what = (
            "a privacy loss distribution"
            if spec.kind is Kind.PLD
            else "a privacy profile whose rarest schedules are given delta = 1 (negligible for delta, not for a "
            "Renyi divergence)"
        )
        raise NotApplicableError(
            f"{spec.id} is {what} ({spec.reference}): it has an (epsilon, delta) profile "
            f"but no Renyi-DP curve. Ask for its epsilon, or for the RDP of composition. See {DOCS}."
        )
    return _checked(spec, spec.compute(cfg, a, orders))


def _checked(spec: BoundSpec, values: np.ndarray) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    if np.isnan(values).any() or (values < 0).any():  # a defect of ours, never a user's error
        raise RuntimeError(f"internal error: {spec.id} produced an invalid RDP value: {values}")
    return values
