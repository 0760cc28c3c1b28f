r"""The glue's signatures, and the inputs several papers' glue share.

Each paper module (``kong_ribero.py``, ``ye_shokri.py``, ...) ends with its glue: functions of a
:class:`~lastiter_plugins.config.TrainingConfig` and :class:`~lastiter_plugins.config.LossAssumptions`
(and the Renyi orders) that map DP-SGD hyperparameters to the paper's symbols and call its math. The
registry table (:mod:`lastiter_plugins.registry.table`) names them, one per sampling scheme where the
mapping differs; the registry checks a row's preconditions before any of its glue runs. Nothing in
:mod:`lastiter_plugins.bounds` imports the registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, TypedDict, TypeVar

import numpy as np

from lastiter_plugins.bounds._common import step_contraction
from lastiter_plugins.config import LossAssumptions, TrainingConfig

_T = TypeVar("_T")


class PrivacyProfile(Protocol):
    """What a GDP or PLD bound returns: a privacy profile delta(eps) with its exact inverse."""

    def epsilon(self, delta: float) -> float: ...

    def delta(self, eps: float) -> float: ...


@dataclasses.dataclass(frozen=True)
class SmallestProfile:
    """Several valid privacy profiles of the same pair of laws: at every epsilon the smallest delta, at every
    delta the smallest epsilon. Each profile holds on its own, so their pointwise minimum does."""

    profiles: tuple[PrivacyProfile, ...]

    def delta(self, eps: float) -> float:
        return min(float(p.delta(eps)) for p in self.profiles)

    def epsilon(self, delta: float) -> float:
        return min(float(p.epsilon(delta)) for p in self.profiles)


class RenyiProfile(PrivacyProfile, Protocol):
    """A privacy profile with a Renyi-DP curve (mu-GDP, or a mixture of them)."""

    def rdp(self, orders: np.ndarray) -> np.ndarray: ...


#: (config, assumptions, orders) -> the row's RDP curve at the orders (nats).
RdpFunction = Callable[[TrainingConfig, LossAssumptions, np.ndarray], np.ndarray]
#: (config, assumptions) -> the row's privacy profile (a GDP or PLD row).
ProfileFunction = Callable[[TrainingConfig, LossAssumptions], PrivacyProfile]


class LowerEstimate(Protocol):
    """(config, assumptions, delta, beat) -> a proven lower bound on the row's epsilon at delta, much cheaper than
    the row itself; it may stop as soon as it is above ``beat`` (best skips the row then)."""

    def __call__(self, cfg: TrainingConfig, a: LossAssumptions, delta: float, beat: float = ...) -> float: ...


def given(value: _T | None, name: str) -> _T:
    """An optional input the row's preconditions require (checked by the registry before any glue runs)."""
    if value is None:  # a defect of ours: the registry runs glue only where its conditions hold
        raise RuntimeError(f"internal error: {name} is required here and the preconditions let it through unset")
    return value


def profile_rdp(profile: Callable[[TrainingConfig, LossAssumptions], RenyiProfile]) -> RdpFunction:
    """The RDP curve a profile implies (mu-GDP implies RDP alpha mu^2/2; mixtures by joint convexity)."""

    def rdp(cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
        return profile(cfg, a).rdp(orders)

    return rdp


class DomainInputs(TypedDict):
    """The inputs every bounded-domain bound with sampled batches takes, named as its math module names them."""

    sampling_probability: float
    noise_multiplier: float
    diameter: float
    batch_size: int
    learning_rate: float
    clip_norm: float


def domain_inputs(cfg: TrainingConfig, a: LossAssumptions) -> DomainInputs:
    """See :class:`DomainInputs` (rows with a diameter and a learning rate among their conditions)."""
    return {
        "sampling_probability": cfg.sampling_probability,
        "noise_multiplier": cfg.noise_multiplier,
        "diameter": given(a.diameter, "diameter"),
        "batch_size": cfg.batch_size,
        "learning_rate": given(cfg.learning_rate, "learning_rate"),
        "clip_norm": cfg.clip_norm,
    }


def fixed_size_strong_contraction(cfg: TrainingConfig, a: LossAssumptions) -> float | None:
    """c < 1 of the unclipped gradient step on fixed-size batches (random batches of b), where lam > 0 and
    eta M < 2; else None (the convex variant). Poisson batches have no such factor (an empty batch does not
    contract): their glue passes None."""
    eta, smoothness = given(cfg.learning_rate, "learning_rate"), given(a.smoothness, "smoothness")
    if a.strong_convexity > 0 and eta * smoothness < 2.0:
        return step_contraction(eta * a.strong_convexity, eta * smoothness)
    return None
