r"""The public keyword API: ``rdp``, ``epsilon``, ``calibrate_noise``,
``applicable_bounds`` (and ``account``, which returns a labelled result).

The keyword functions build a validated :class:`TrainingConfig` and
:class:`LossAssumptions` and call the object-level functions
(:func:`compute_rdp`, :func:`compute_epsilon`) that the adapters use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from lastiter_plugins import registry
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, refuse_renamed
from lastiter_plugins.conversion import rdp_to_epsilon, validate_delta, validate_orders
from lastiter_plugins.errors import NotApplicableError

_TRAINING_KEYS = (
    "dataset_size",
    "batch_size",
    "noise_multiplier",
    "learning_rate",
    "clip_norm",
    "sampling",
    "relation",
)
_ASSUMPTION_KEYS = ("smoothness", "weak_convexity", "strong_convexity", "diameter", "gradient_norms_within_clip")
PARAMETERS: tuple[str, ...] = (*_TRAINING_KEYS, "steps", "epochs", *_ASSUMPTION_KEYS)


def build(**params: Any) -> tuple[TrainingConfig, LossAssumptions]:
    """Validated (TrainingConfig, LossAssumptions) from the keyword parameters.

    Give exactly one of ``steps`` and ``epochs`` (E epochs = E * ceil(n/b) steps).
    """
    refuse_renamed(params)
    unknown = sorted(set(params) - set(PARAMETERS))
    if unknown:
        raise ValueError(f"unknown parameter {unknown[0]!r}; known parameters: {', '.join(PARAMETERS)}.")
    missing = [k for k in ("dataset_size", "batch_size", "noise_multiplier", "sampling") if params.get(k) is None]
    if missing:
        raise ValueError(f"{missing[0]} is required. Found none.")
    steps, epochs = params.get("steps"), params.get("epochs")
    if (steps is None) == (epochs is None):
        raise ValueError(f"exactly one of steps and epochs must be given. Found steps={steps!r}, epochs={epochs!r}.")
    training = {k: params[k] for k in _TRAINING_KEYS if params.get(k) is not None}
    assumptions = LossAssumptions(**{k: params[k] for k in _ASSUMPTION_KEYS if k in params})
    if steps is not None:
        config = TrainingConfig(steps=steps, **training)
    else:
        config = TrainingConfig.from_epochs(epochs=epochs, **training)
    return config, assumptions


@dataclasses.dataclass(frozen=True)
class EpsilonResult:
    """An (epsilon, delta) guarantee with everything needed to read it honestly."""

    bound: str
    epsilon: float
    delta: float
    order: float
    relation: Relation
    sampling: Sampling
    winner: str  # the bound attaining the minimum at the optimal order (== bound unless bound == "best")
    reference: str
    steps: int

    @property
    def protects(self) -> str:
        """What the guarantee covers: the final model only, or every iterate (composition)."""
        return "every iterate" if self.winner == "composition" else "the final model only"

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (non-finite numbers become None)."""
        return {
            "bound": self.bound,
            "winner": self.winner,
            "epsilon": _finite_or_none(self.epsilon),
            "delta": self.delta,
            "order": self.order,
            "relation": self.relation.value,
            "sampling": self.sampling.value,
            "steps": self.steps,
            "protects": self.protects,
            "reference": self.reference,
        }

    def __str__(self) -> str:
        via = f" via {self.winner}" if self.winner != self.bound else ""
        return (
            f"({self.epsilon:.4g}, {self.delta:g})-DP for {self.protects} "
            f"[{self.bound}{via}; {self.relation.value} neighbours; sampling {self.sampling.value}; "
            f"{self.steps} steps; order {self.order:g}]"
        )


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _best_rdp(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Per-order minimum over every applicable bound with the declared relation (BOUNDS.md 5)."""
    names, curves, reasons = [], [], []
    for spec in registry.BOUNDS.values():
        check = registry.applicability(spec, cfg, a)
        if check.applies:
            names.append(spec.id)
            curves.append(registry.evaluate(spec, cfg, a, orders))
        else:
            reasons.append(check.reason)
    if not curves:
        raise NotApplicableError(
            f"no bound applies to sampling={cfg.sampling.value} with relation={cfg.relation.value} "
            f"(best, BOUNDS.md section 5): {reasons[-1]}"
        )
    stack = np.vstack(curves)
    return stack.min(axis=0), names, stack.argmin(axis=0)


def compute_rdp(bound: str, config: TrainingConfig, assumptions: LossAssumptions, orders=None) -> np.ndarray:
    """RDP (nats) of ``bound`` at each order for a validated configuration."""
    orders = validate_orders(orders)
    if bound == registry.BEST:
        return _best_rdp(config, assumptions, orders)[0]
    return registry.compute(registry.get_spec(bound), config, assumptions, orders)


def compute_epsilon(
    bound: str, config: TrainingConfig, assumptions: LossAssumptions, delta: float, orders=None
) -> EpsilonResult:
    """(epsilon, delta) of ``bound`` for a validated configuration, labelled."""
    delta = validate_delta(delta)
    orders = validate_orders(orders)
    if bound == registry.BEST:
        curve, names, winners = _best_rdp(config, assumptions, orders)
        eps, order = rdp_to_epsilon(orders, curve, delta)
        winner = names[int(winners[int(np.flatnonzero(orders == order)[0])])]
    else:
        curve = compute_rdp(bound, config, assumptions, orders)
        eps, order = rdp_to_epsilon(orders, curve, delta)
        winner = bound
    return EpsilonResult(
        bound=bound,
        epsilon=eps,
        delta=delta,
        order=order,
        relation=config.relation,
        sampling=config.sampling,
        winner=winner,
        reference=registry.BOUNDS[winner].reference,
        steps=config.steps,
    )


def rdp(bound: str, orders: Sequence[float] | np.ndarray, **params: Any) -> np.ndarray:
    """Renyi-DP epsilon (nats) of ``bound`` at each order.

    Args:
      bound: a bound id (see ``BOUND_IDS``), ``composition`` or ``best``.
      orders: Renyi orders, each > 1.
      **params: the training configuration and loss assumptions (see README).

    Raises:
      NotApplicableError: a precondition of the bound fails (the message names it
        and the theorem).
      ValueError: an invalid value.
    """
    config, assumptions = build(**params)
    return compute_rdp(bound, config, assumptions, validate_orders(orders))


def account(bound: str, delta: float, orders=None, **params: Any) -> EpsilonResult:
    """Like :func:`epsilon`, returning an :class:`EpsilonResult` (relation, sampling, winner, ...)."""
    config, assumptions = build(**params)
    return compute_epsilon(bound, config, assumptions, delta, orders)


def epsilon(bound: str, delta: float, orders=None, **params: Any) -> tuple[float, float]:
    """(epsilon, optimal order) of ``bound`` at ``delta``, for the final model
    (for ``composition``: every iterate). Raises like :func:`rdp`."""
    result = account(bound, delta, orders, **params)
    return result.epsilon, result.order


def applicable_bounds(**params: Any) -> dict[str, registry.Applicability]:
    """For every bound id (``best`` included): applies or not, and why.

    ``noise_multiplier`` may be omitted (no precondition depends on it).
    """
    params.setdefault("noise_multiplier", 1.0)
    config, assumptions = build(**params)
    out = {bid: registry.applicability(spec, config, assumptions) for bid, spec in registry.BOUNDS.items()}
    usable = [bid for bid, app in out.items() if app.applies]
    out[registry.BEST] = registry.Applicability(
        bound=registry.BEST,
        applies=bool(usable),
        reasons=() if usable else ("no bound applies to this pipeline",),
        relation=config.relation,
        reference="BOUNDS.md section 5: per-order minimum over " + (", ".join(usable) or "nothing"),
    )
    return out
