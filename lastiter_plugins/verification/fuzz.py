r"""Soundness fuzzing: random instances of G1, G2, G3 meeting each bound's
assumptions; every applicable bound must be >= the certified lower end of the
exact divergence, at every checked order; every f-DP (GDP) bound's privacy
profile must also be >= the certified lower end of the exact hockey-stick
divergence of the instance at a few epsilons.

Full run (>= 1000 checks per bound; about an hour on one core)::

    python -m lastiter_plugins.verification.fuzz --checks-per-bound 1000 --seed 2026 --json benchmarks/fuzz_1000.json

The default test run uses a small fixed-seed subset (tests/core/verification/test_verification.py);
``pytest --runslow`` runs the full one.

An instance "meets a bound's assumptions" exactly when
:func:`lastiter_plugins.applicable_bounds` says the bound applies to its
parameters: the draws below produce parameters that truthfully describe the
instance (M, m, lam, D, clipping), and the bound table decides. Unproven bounds
(``lp.BOUNDS[bid].proof.proven`` False) are checked the same way and reported
separately.

Two checks per (bound, instance):

* Renyi: ``rdp(alpha) >= lower end of max(D_alpha(P||Q), D_alpha(Q||P))`` at
  :data:`CHECK_ORDERS`. For an f-DP bound the RDP curve is the one its profile
  implies (mu-GDP gives ``alpha mu^2 / 2``; mixtures by joint convexity), which
  is implied by the f-DP guarantee, so a violation there is a violation of the
  f-DP bound too.
* hockey-stick (f-DP and PLD bounds): ``profile.delta(eps) >= lower end of
  max(H_eps(P||Q), H_eps(Q||P))`` at :data:`CHECK_EPSILONS` and at the bound's
  own epsilon for deltas 1e-1, 1e-3, 1e-5 (where a small-delta error would show).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

import lastiter_plugins as lp
from lastiter_plugins.lower_end.exact import ExactDivergence, Instance, g1_params, g2_params, g3_params

#: Orders at which bounds are compared to the truth (integers: the SGM terms are exact there).
CHECK_ORDERS = np.array([1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0])
#: Epsilons at which f-DP bounds' privacy profiles are compared to the exact hockey-stick divergence.
CHECK_EPSILONS = np.array([0.0, 0.5, 1.0, 2.0, 4.0])
#: Deltas whose epsilon (of each f-DP bound) is added to the checked epsilons.
CHECK_DELTAS = (1e-1, 1e-3, 1e-5)
#: Relative slack for the comparison of two floating-point numbers (the exact side is already certified).
RELATIVE_SLACK = 1e-9

# Grids used while fuzzing G3 (the error terms they give are part of each record).
G3_FAST = {"max_nodes": 500, "fine_cells": 4000, "tolerance": 1e-3}
G3_FULL = {"max_nodes": 900, "fine_cells": 8000, "tolerance": 5e-4}


def is_proven(bound: str) -> bool:
    """``best`` and every bound whose table row says proven."""
    return bound not in lp.BOUNDS or lp.BOUNDS[bound].proof.proven


def is_profile_bound(bound: str) -> bool:
    """A GDP or PLD bound: its privacy profile is checked against the exact hockey-stick divergence."""
    return bound in lp.BOUNDS and lp.BOUNDS[bound].kind in (lp.Kind.GDP, lp.Kind.PLD)


def _renyi_values(bound: str, orders: np.ndarray, params: Mapping[str, Any]) -> np.ndarray:
    """The bound's RDP curve at ``orders``; for a PLD bound (no Renyi curve; checked by its profile only),
    and for ``best`` where only a PLD bound applies, ``inf``, which no Renyi check can fail."""
    if bound in lp.BOUNDS and not lp.BOUNDS[bound].has_renyi_curve:
        return np.full(len(orders), np.inf)
    try:
        return lp.rdp(bound, orders, **params)
    except lp.NotApplicableError:
        if bound != lp.BEST:
            raise
        return np.full(len(orders), np.inf)


@dataclasses.dataclass(frozen=True)
class Check:
    """One bound on one instance, at every checked order (and, for an f-DP bound, epsilon)."""

    instance: Instance
    bound: str
    orders: np.ndarray
    bound_values: np.ndarray
    exact: ExactDivergence
    eps: np.ndarray | None = None  # epsilons of the hockey-stick check (f-DP bounds only)
    bound_delta: np.ndarray | None = None  # the bound's profile delta(eps)
    exact_delta_lower: np.ndarray | None = None
    exact_delta_upper: np.ndarray | None = None

    @property
    def profile_check(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """(eps, the bound's delta, the exact delta's certified lower and upper ends) of the hockey-stick
        check; None for a bound without a privacy profile."""
        eps, bound, lower, upper = self.eps, self.bound_delta, self.exact_delta_lower, self.exact_delta_upper
        if eps is None or bound is None or lower is None or upper is None:
            return None
        return eps, bound, lower, upper

    @property
    def violations(self) -> np.ndarray:
        """Orders where the bound is below the certified lower end of the truth."""
        slack = RELATIVE_SLACK * np.maximum(1.0, np.abs(self.bound_values))
        return self.orders[self.bound_values < self.exact.lower - slack]

    @property
    def delta_violations(self) -> np.ndarray:
        """Epsilons where the bound's delta(eps) is below the certified lower end of the exact one."""
        if self.profile_check is None:
            return np.array([])
        eps, bound_delta, lower, _ = self.profile_check
        return eps[bound_delta < lower - RELATIVE_SLACK * bound_delta]

    @property
    def failed(self) -> bool:
        return bool(self.violations.size or self.delta_violations.size)

    @property
    def ratios(self) -> np.ndarray:
        """bound / exact (estimate); inf where the truth is 0."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.exact.estimate > 0, self.bound_values / self.exact.estimate, np.inf)

    @property
    def delta_ratios(self) -> np.ndarray:
        """bound delta / certified lower end of the exact delta, where the latter is >= 1e-12
        (>= 1 is what soundness needs; close to 1: the bound is attained there)."""
        if self.profile_check is None:
            return np.array([])
        _, bound_delta, lower, _ = self.profile_check
        keep = lower >= 1e-12
        return bound_delta[keep] / lower[keep]

    def describe(self) -> str:
        lines = [f"{self.bound} on {self.instance.describe()}"]
        for a, b, lo, up in zip(self.orders, self.bound_values, self.exact.lower, self.exact.upper, strict=True):
            flag = "  <-- VIOLATION" if a in self.violations else ""
            lines.append(f"  alpha={a:g}: bound={b:.10g}  exact in [{lo:.10g}, {up:.10g}]{flag}")
        if self.profile_check is not None:
            for e, b, lo, up in zip(*self.profile_check, strict=True):
                flag = "  <-- VIOLATION" if e in self.delta_violations else ""
                lines.append(f"  eps={e:.6g}: bound delta={b:.10g}  exact delta in [{lo:.10g}, {up:.10g}]{flag}")
        lines.append(f"  ({self.exact.detail})")
        return "\n".join(lines)


def _profile_epsilons(profiles: dict) -> np.ndarray:
    extra = []
    for profile in profiles.values():
        for delta in CHECK_DELTAS:
            eps = profile.epsilon(delta)
            if math.isfinite(eps):
                extra.append(eps)
    return np.unique(np.concatenate((CHECK_EPSILONS, np.asarray(extra, dtype=float))))


def check_instance(
    instance: Instance,
    orders: np.ndarray = CHECK_ORDERS,
    exact_options: dict | None = None,
    skip_kinds: tuple[lp.Kind, ...] = (),
) -> list[Check]:
    """Compare every applicable bound (``best`` included) with the exact divergence, and
    every applicable f-DP bound's privacy profile with the exact hockey-stick divergence.
    ``skip_kinds``: leave out the bounds of these kinds (the fast test tier leaves out the PLD
    baselines, whose host-side delta takes seconds per call; the fuzzing checks them)."""
    apps = lp.applicable_bounds(**instance.params)
    ids = [
        bid for bid, app in apps.items() if app.applies and not (bid in lp.BOUNDS and lp.BOUNDS[bid].kind in skip_kinds)
    ]
    if not ids:
        return []
    profiles: dict[str, Any] = {}  # bound id -> its privacy profile
    config, assumptions = lp.build(**instance.params)
    for bid in filter(is_profile_bound, ids):
        make = lp.BOUNDS[bid].profile
        assert make is not None, f"{bid} is a {lp.BOUNDS[bid].kind} row without a privacy profile"
        profiles[bid] = make(config, assumptions)
    exact = instance.exact(orders, hockey_stick=bool(profiles), **(exact_options or {}))
    checks = []
    eps = delta_lower = delta_upper = None
    if profiles:
        assert exact.hockey_stick is not None  # asked for (hockey_stick=True)
        eps = _profile_epsilons(profiles)
        delta_lower, delta_upper = exact.hockey_stick.delta(eps)
    for bid in ids:
        values = _renyi_values(bid, orders, instance.params)
        if bid in profiles and eps is not None:
            bound_delta = np.array([profiles[bid].delta(float(e)) for e in eps])
            checks.append(Check(instance, bid, orders, values, exact, eps, bound_delta, delta_lower, delta_upper))
        else:
            checks.append(Check(instance, bid, orders, values, exact))
    return checks


# ------------------------------------------------------------------ random draws


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def _batching(rng: np.random.Generator, *, max_n: int, full_batch_prob: float, divisible_prob: float, shape: str):
    """(n, b): ``shape`` "any" (sometimes b = n, sometimes b | n), "full" (b = n) or
    "short" (n mod b > 0: a short last batch)."""
    if shape == "short":
        b = int(rng.integers(2, 9))
        n = b * int(rng.integers(1, max(2, max_n // b))) + int(rng.integers(1, b))
        return n, b
    b = int(rng.integers(1, 9))
    u = rng.uniform()
    if shape == "full" or u < full_batch_prob:
        return b, b
    if u < full_batch_prob + divisible_prob:
        return b * int(rng.integers(2, max(3, max_n // b))), b
    return int(rng.integers(b, max_n + 1)), b


def draw_g1(rng: np.random.Generator, sampling: str, relation: str = "replace_one", shape: str = "any") -> Instance:
    """Linear losses. Fixed batches: any T up to 6 passes (b = n: up to 60); sampled: T <= 400."""
    n, b = _batching(rng, max_n=60, full_batch_prob=0.15, divisible_prob=0.3, shape=shape)
    per_epoch = math.ceil(n / b)
    if shape == "full":
        steps = int(rng.integers(1, 61))
    elif sampling in ("cyclic", "shuffle_once", "reshuffle"):
        steps = int(rng.integers(1, 6 * per_epoch + 2))
    else:
        steps = int(rng.integers(1, 401))
    params = g1_params(
        dataset_size=n,
        batch_size=b,
        noise_multiplier=_log_uniform(rng, 0.3, 5.0),
        steps=steps,
        learning_rate=_log_uniform(rng, 1e-3, 1.0),
        clip_norm=_log_uniform(rng, 0.1, 10.0),
        sampling=sampling,
        relation=relation,
    )
    return Instance("G1", params)


def draw_g2(rng: np.random.Generator, sampling: str, shape: str = "any") -> Instance:
    """Strongly convex quadratics; eta = u / lam with u in (0, 1] (u = 1: rho = 0, Kong-Ribero only)."""
    n, b = _batching(rng, max_n=60, full_batch_prob=0.1, divisible_prob=0.5, shape=shape)
    per_epoch = math.ceil(n / b)
    lam = _log_uniform(rng, 1e-3, 2.0)
    u = 1.0 if rng.uniform() < 0.05 else float(rng.uniform(0.01, 0.99))
    if sampling == "reshuffle":  # l^E schedules: a few short passes
        n = min(n, 5 * b)
        per_epoch = math.ceil(n / b)
        steps = int(rng.integers(1, 4 * per_epoch + 1))
    elif sampling == "random_batch":
        steps = int(rng.integers(1, 9))
        if n == b and shape != "full":
            n = 2 * b  # ye-shokri-random needs l >= 2; q < 1 keeps the enumeration meaningful
    elif shape == "full":
        steps = int(rng.integers(1, 61))  # full-batch descent: long enough for the contraction to matter
    else:
        steps = int(rng.integers(1, 6 * per_epoch + 2))
    params = g2_params(
        strong_convexity=lam,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=_log_uniform(rng, 0.3, 5.0),
        steps=steps,
        learning_rate=u / lam,
        clip_norm=_log_uniform(rng, 0.1, 10.0),
        sampling=sampling,
    )
    return Instance("G2", params)


def draw_g2_poisson(rng: np.random.Generator, relation: str = "replace_one") -> Instance:
    """Poisson sampling with linear data losses and an l2 term outside the clip (``l2_outside_clip``):
    the contraction 1 - eta lam holds at every batch size (exact laws: 2^T patterns, T <= 8)."""
    b = int(rng.integers(1, 9))
    n = b * int(rng.integers(2, 8)) + int(rng.integers(0, b))
    lam = _log_uniform(rng, 1e-3, 2.0)
    params = g2_params(
        strong_convexity=lam,
        l2_outside_clip=True,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=_log_uniform(rng, 0.3, 5.0),
        steps=int(rng.integers(1, 9)),
        learning_rate=float(rng.uniform(0.01, 0.99)) / lam,
        clip_norm=_log_uniform(rng, 0.1, 10.0),
        sampling="poisson",
        relation=relation,
    )
    return Instance("G2", params)


def draw_g2_random_allocation(rng: np.random.Generator, relation: str = "replace_one") -> Instance:
    """Random allocation with linear data losses and an l2 term outside the clip (``l2_outside_clip``): the
    contraction 1 - eta lam holds at every batch size (exact laws: every allocation of the record, at most
    t^E <= 4096 of them; partial last epochs included)."""
    b = int(rng.integers(1, 9))
    per_epoch = int(rng.integers(1, 7))
    n = b * (per_epoch - 1) + (int(rng.integers(1, b + 1)) if per_epoch > 1 else b)  # ceil(n / b) = per_epoch
    epochs = int(rng.integers(1, 5))
    while per_epoch**epochs > 4096:
        epochs -= 1
    lam = _log_uniform(rng, 1e-3, 2.0)
    params = g2_params(
        strong_convexity=lam,
        l2_outside_clip=True,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=_log_uniform(rng, 0.3, 5.0),
        steps=int(rng.integers(1, epochs * per_epoch + 1)),
        learning_rate=float(rng.uniform(0.01, 0.99)) / lam,
        clip_norm=_log_uniform(rng, 0.1, 10.0),
        sampling="random_allocation",
        relation=relation,
    )
    return Instance("G2", params)


def draw_g3(
    rng: np.random.Generator,
    sampling: str,
    relation: str = "replace_one",
    max_steps: int = 10,
    shape: str = "any",
) -> Instance:
    """Projected walk with D / s in [0.2, 5], s = eta z C / b the per-step noise."""
    b = int(rng.integers(1, 6))
    l_max = 5 if sampling in ("shuffle_once", "reshuffle", "random_allocation") else 8
    if shape == "full":
        n = b
    elif shape == "short":
        b = int(rng.integers(2, 6))
        n = b * int(rng.integers(1, l_max)) + int(rng.integers(1, b))
    else:
        n = b * int(rng.integers(1, l_max + 1)) if rng.uniform() < 0.5 else int(rng.integers(b, b * l_max + 1))
    z = _log_uniform(rng, 0.5, 4.0)
    lr = _log_uniform(rng, 1e-2, 1.0)
    c = _log_uniform(rng, 0.1, 10.0)
    s = lr * z * c / b
    diameter = _log_uniform(rng, 0.2, 5.0) * s
    steps = int(rng.integers(1, max_steps + 1))
    params = g3_params(
        diameter=diameter,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=z,
        steps=steps,
        learning_rate=lr,
        clip_norm=c,
        sampling=sampling,
        relation=relation,
    )
    x0 = float(rng.uniform(-0.5, 0.5)) * diameter if rng.uniform() < 0.5 else 0.0
    return Instance("G3", params, x0=x0)


Drawer = Callable[[np.random.Generator], Instance]


def _g1(sampling: str, relation: str = "replace_one", shape: str = "any") -> Drawer:
    return lambda r: draw_g1(r, sampling, relation, shape)


def _g2(sampling: str, shape: str = "any") -> Drawer:
    return lambda r: draw_g2(r, sampling, shape)


def _g2p(relation: str = "replace_one") -> Drawer:
    return lambda r: draw_g2_poisson(r, relation)


def _g2ra(relation: str = "replace_one") -> Drawer:
    return lambda r: draw_g2_random_allocation(r, relation)


def _g3(sampling: str, relation: str = "replace_one", shape: str = "any") -> Drawer:
    return lambda r: draw_g3(r, sampling, relation, shape=shape)


_ADD_REMOVE = "add_or_remove_one"

#: Instance families on which each bound can apply (the bound table still decides per draw).
TARGETS: dict[str, list[tuple[str, Drawer]]] = {
    "kong-ribero-cyclic": [
        ("G1 cyclic", _g1("cyclic")),
        ("G1 shuffle_once", _g1("shuffle_once")),
        ("G2 cyclic", _g2("cyclic")),
        ("G2 shuffle_once", _g2("shuffle_once")),
        ("G3 cyclic", _g3("cyclic")),
        ("G3 shuffle_once", _g3("shuffle_once")),
    ],
    "kong-ribero-bounded": [
        ("G3 cyclic", _g3("cyclic")),
        ("G3 shuffle_once", _g3("shuffle_once")),
        ("G3 reshuffle", _g3("reshuffle")),
        ("G3 random_batch", _g3("random_batch")),
    ],
    "kong-ribero-curvature-free": [
        ("G1 cyclic", _g1("cyclic")),
        ("G1 reshuffle", _g1("reshuffle")),
        ("G1 random_batch", _g1("random_batch")),
        ("G3 random_batch", _g3("random_batch")),
    ],
    "altschuler-talwar": [
        ("G3 random_batch", _g3("random_batch")),
        ("G3 poisson", _g3("poisson")),
    ],
    "bounded-domain-random": [
        ("G3 random_batch", _g3("random_batch")),
        ("G3 poisson", _g3("poisson")),
    ],
    "liang-bounded": [("G3 poisson add/remove", _g3("poisson", _ADD_REMOVE))],
    "liang-unbounded": [
        ("G1 poisson add/remove", _g1("poisson", _ADD_REMOVE)),
        ("G3 poisson add/remove", _g3("poisson", _ADD_REMOVE)),
    ],
    "ye-shokri-cyclic": [
        ("G2 cyclic", _g2("cyclic")),
        ("G2 shuffle_once", _g2("shuffle_once")),
        ("G2 cyclic, short last batch", _g2("cyclic", "short")),
        ("G2 shuffle_once, short last batch", _g2("shuffle_once", "short")),
    ],
    "ye-shokri-shuffle": [
        ("G2 shuffle_once", _g2("shuffle_once")),
        ("G2 shuffle_once, short last batch", _g2("shuffle_once", "short")),
    ],
    "ye-shokri-random": [("G2 random_batch", _g2("random_batch"))],
    "ye-shokri-convex": [
        ("G1 cyclic", _g1("cyclic")),
        ("G1 shuffle_once", _g1("shuffle_once")),
        ("G2 cyclic", _g2("cyclic")),
        ("G3 cyclic", _g3("cyclic")),
        ("G3 shuffle_once", _g3("shuffle_once")),
    ],
    "ye-shokri-full-batch": [
        ("G1 cyclic", _g1("cyclic")),
        ("G1 random_batch", _g1("random_batch")),
        ("G2 cyclic", _g2("cyclic")),
    ],
    "shifted-interpolation-full-batch": [
        ("G1 cyclic, b = n", _g1("cyclic", shape="full")),
        ("G2 cyclic, b = n", _g2("cyclic", "full")),
        ("G2 shuffle_once, b = n", _g2("shuffle_once", "full")),
        ("G3 cyclic, b = n", _g3("cyclic", shape="full")),
    ],
    "shifted-interpolation-cyclic": [
        ("G1 cyclic", _g1("cyclic")),
        ("G1 shuffle_once", _g1("shuffle_once")),
        ("G2 cyclic", _g2("cyclic")),
        ("G2 cyclic, short last batch", _g2("cyclic", "short")),
        ("G2 shuffle_once", _g2("shuffle_once")),
        ("G3 cyclic", _g3("cyclic")),
        ("G3 shuffle_once", _g3("shuffle_once")),
    ],
    "shifted-interpolation-shuffle": [
        ("G1 shuffle_once", _g1("shuffle_once")),
        ("G2 shuffle_once", _g2("shuffle_once")),
        ("G2 shuffle_once, short last batch", _g2("shuffle_once", "short")),
        ("G3 shuffle_once", _g3("shuffle_once")),
    ],
    "shifted-interpolation-reshuffle": [
        ("G1 reshuffle", _g1("reshuffle")),
        ("G2 reshuffle", _g2("reshuffle")),
        ("G2 reshuffle, short last batch", _g2("reshuffle", "short")),
        ("G3 reshuffle", _g3("reshuffle")),
    ],
    "shifted-interpolation-random-batch": [
        ("G1 random_batch", _g1("random_batch")),
        ("G2 random_batch", _g2("random_batch")),
        ("G3 random_batch", _g3("random_batch")),
    ],
    "shifted-interpolation-poisson": [
        ("G1 poisson add/remove", _g1("poisson", _ADD_REMOVE)),
        ("G2 poisson add/remove, l2 outside the clip", _g2p(_ADD_REMOVE)),
        ("G3 poisson add/remove", _g3("poisson", _ADD_REMOVE)),
    ],
    "shifted-interpolation-poisson-replace-one": [
        ("G1 poisson", _g1("poisson")),
        ("G2 poisson, l2 outside the clip", _g2p()),
        ("G3 poisson", _g3("poisson")),
    ],
    "shifted-interpolation-random-allocation": [
        ("G1 random_allocation add/remove", _g1("random_allocation", _ADD_REMOVE)),
        ("G2 random_allocation add/remove, l2 outside the clip", _g2ra(_ADD_REMOVE)),
        ("G3 random_allocation add/remove", _g3("random_allocation", _ADD_REMOVE)),
    ],
    "shifted-interpolation-random-allocation-replace-one": [
        ("G1 random_allocation", _g1("random_allocation")),
        ("G2 random_allocation, l2 outside the clip", _g2ra()),
        ("G3 random_allocation", _g3("random_allocation")),
    ],
    "composition-gdp-epochs": [
        ("G1 cyclic", _g1("cyclic")),
        ("G1 reshuffle", _g1("reshuffle")),
        ("G2 shuffle_once", _g2("shuffle_once")),
        ("G3 reshuffle", _g3("reshuffle")),
    ],
    "composition-pld-poisson": [
        ("G1 poisson add/remove", _g1("poisson", _ADD_REMOVE)),
        ("G3 poisson add/remove", _g3("poisson", _ADD_REMOVE)),
    ],
    "composition-pld-poisson-replace-one": [
        ("G1 poisson", _g1("poisson")),
        ("G3 poisson", _g3("poisson")),
    ],
    "composition-pld-random-batch": [
        ("G1 random_batch", _g1("random_batch")),
        ("G3 random_batch", _g3("random_batch")),
    ],
    "composition-pld-random-allocation": [
        ("G1 random_allocation add/remove", _g1("random_allocation", _ADD_REMOVE)),
        ("G3 random_allocation add/remove", _g3("random_allocation", _ADD_REMOVE)),
    ],
    "composition-pld-random-allocation-replace-one": [
        ("G1 random_allocation", _g1("random_allocation")),
        ("G3 random_allocation", _g3("random_allocation")),
    ],
    "composition": [
        ("G1 cyclic", _g1("cyclic")),
        ("G1 reshuffle", _g1("reshuffle")),
        ("G1 random_batch", _g1("random_batch")),
        ("G1 poisson add/remove", _g1("poisson", _ADD_REMOVE)),
        ("G2 shuffle_once", _g2("shuffle_once")),
        ("G3 reshuffle", _g3("reshuffle")),
        ("G3 poisson add/remove", _g3("poisson", _ADD_REMOVE)),
    ],
}


def instance_label(instance: Instance) -> str:
    """Family, sampling, relation and batch shape of an instance (the per-family counts of the report)."""
    p = instance.params
    n, b = p["dataset_size"], p["batch_size"]
    shape = ", b = n" if n == b else (", short last batch" if n % b else "")
    relation = " add/remove" if p.get("relation") == _ADD_REMOVE else ""
    return f"{instance.family} {p['sampling']}{relation}{shape}"


@dataclasses.dataclass
class BoundRecord:
    """What the fuzzing found for one bound."""

    checks: int = 0
    hockey_stick_checks: int = 0
    violations: int = 0
    min_ratio: float = math.inf  # min over checks and orders of bound / exact (estimate)
    min_delta_ratio: float = math.inf  # min of bound delta / lower end of the exact delta
    families: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "checks": self.checks,
            "hockey_stick_checks": self.hockey_stick_checks,
            "violations": self.violations,
            "min_ratio_bound_over_exact": _finite_or_none(self.min_ratio),
            "min_delta_ratio_bound_over_exact": _finite_or_none(self.min_delta_ratio),
            "checks_per_family": dict(sorted(self.families.items())),
        }


def _finite_or_none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


@dataclasses.dataclass
class FuzzReport:
    """Counts, violations and the smallest ratios per bound."""

    bounds: dict[str, BoundRecord] = dataclasses.field(default_factory=dict)
    violations: list[Check] = dataclasses.field(default_factory=list)
    instances: int = 0
    max_exact_width: float = 0.0
    seconds: float = 0.0
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def checks(self) -> dict[str, int]:
        """Renyi checks (bound x instance, each at every checked order) per bound."""
        return {bid: rec.checks for bid, rec in self.bounds.items()}

    @property
    def min_ratio(self) -> dict[str, float]:
        return {bid: rec.min_ratio for bid, rec in self.bounds.items() if math.isfinite(rec.min_ratio)}

    def add(self, check: Check) -> None:
        rec = self.bounds.setdefault(check.bound, BoundRecord())
        rec.checks += 1
        label = instance_label(check.instance)
        rec.families[label] = rec.families.get(label, 0) + 1
        finite = check.ratios[np.isfinite(check.ratios)]
        if finite.size:
            rec.min_ratio = min(rec.min_ratio, float(finite.min()))
        if check.eps is not None:
            rec.hockey_stick_checks += 1
            if check.delta_ratios.size:
                rec.min_delta_ratio = min(rec.min_delta_ratio, float(check.delta_ratios.min()))
        width = check.exact.width[np.isfinite(check.exact.width)]
        if width.size:
            self.max_exact_width = max(self.max_exact_width, float(width.max()))
        if check.failed:
            rec.violations += 1
            self.violations.append(check)

    def proven_violations(self) -> list[Check]:
        return [v for v in self.violations if is_proven(v.bound)]

    def to_dict(self) -> dict:
        def table(proven: bool) -> dict:
            return {bid: rec.to_dict() for bid, rec in sorted(self.bounds.items()) if is_proven(bid) == proven}

        return {
            **self.settings,
            "instances": self.instances,
            "checks": sum(rec.checks for rec in self.bounds.values()),
            "hockey_stick_checks": sum(rec.hockey_stick_checks for rec in self.bounds.values()),
            "proven": table(True),
            "unproven": {bid: {**rec, "proof": str(lp.BOUNDS[bid].proof)} for bid, rec in table(False).items()},
            "max_certified_interval_width": self.max_exact_width,
            "violations_of_proven_bounds": [v.describe() for v in self.proven_violations()],
            "violations_of_unproven_bounds": [v.describe() for v in self.violations if not is_proven(v.bound)],
            "seconds": round(self.seconds, 1),
        }

    def summary(self) -> str:
        total = sum(rec.checks for rec in self.bounds.values())
        hs = sum(rec.hockey_stick_checks for rec in self.bounds.values())
        lines = [
            f"{self.instances} instances, {total} Renyi checks, {hs} hockey-stick checks, {self.seconds:.0f} s",
            f"  {'bound':37s} {'checks':>7s} {'hockey':>7s} {'viol.':>6s} {'min bound/exact':>16s} "
            f"{'min delta/exact':>16s}",
        ]
        for proven in (True, False):
            ids = [bid for bid in sorted(self.bounds) if is_proven(bid) == proven]
            if not ids:
                continue
            lines.append("  proven:" if proven else "  unproven (checked, reported separately):")
            for bid in ids:
                rec = self.bounds[bid]
                delta = f"{rec.min_delta_ratio:.4g}" if math.isfinite(rec.min_delta_ratio) else "-"
                lines.append(
                    f"    {bid:35s} {rec.checks:7d} {rec.hockey_stick_checks:7d} {rec.violations:6d} "
                    f"{rec.min_ratio:16.4g} {delta:>16s}"
                )
        proven_bad = self.proven_violations()
        lines.append(
            f"  violations: {len(proven_bad)} of proven bounds, {len(self.violations) - len(proven_bad)} of unproven"
        )
        lines.extend(v.describe() for v in self.violations)
        return "\n".join(lines)


def fuzz(
    bounds: Iterable[str] | None = None,
    *,
    checks_per_bound: int = 50,
    seed: int = 0,
    orders: np.ndarray = CHECK_ORDERS,
    g3_options: dict | None = None,
    max_instances: int | None = None,
    progress: bool = False,
) -> FuzzReport:
    """Draw instances for each bound until it has been checked ``checks_per_bound``
    times (every other bound that applies to a drawn instance is checked too)."""
    rng = np.random.default_rng(seed)
    wanted = list(TARGETS) if bounds is None else list(bounds)
    unknown = [bid for bid in wanted if bid not in TARGETS]
    if unknown:
        raise ValueError(f"bound must be one of {', '.join(TARGETS)}. Found {unknown[0]!r}.")
    options = {"G3": dict(G3_FAST if g3_options is None else g3_options)}
    report = FuzzReport(
        settings={
            "seed": seed,
            "checks_per_bound": checks_per_bound,
            "bounds": wanted,
            "orders": [float(a) for a in orders],
            "epsilons": [float(e) for e in CHECK_EPSILONS],
            "epsilons_at_deltas": list(CHECK_DELTAS),
            "g3_grid": options["G3"],
            "lastiter_plugins": lp.__version__,
        }
    )
    start = time.perf_counter()
    budget = max_instances if max_instances is not None else 50 * checks_per_bound * len(wanted)
    for bid in wanted:
        families = TARGETS[bid]
        k = 0
        while report.checks.get(bid, 0) < checks_per_bound and report.instances < budget:
            _, draw = families[k % len(families)]
            k += 1
            instance = draw(rng)
            for check in check_instance(instance, orders, options.get(instance.family)):
                report.add(check)
            report.instances += 1
            if progress and report.instances % 50 == 0:
                print(
                    f"[{time.perf_counter() - start:.0f}s] {report.instances} instances; {bid}: "
                    f"{report.checks.get(bid, 0)}; violations {len(report.violations)}",
                    file=sys.stderr,
                    flush=True,
                )
    report.seconds = time.perf_counter() - start
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks-per-bound", type=int, default=1000)
    parser.add_argument("--bound", action="append", help="only these bounds (repeatable)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--full-grid", action="store_true", help="finer G3 grids (slower, tighter intervals)")
    args = parser.parse_args(argv)
    report = fuzz(
        args.bound,
        checks_per_bound=args.checks_per_bound,
        seed=args.seed,
        g3_options=G3_FULL if args.full_grid else None,
        progress=True,
    )
    print(report.summary())
    if args.json:
        record = report.to_dict()
        record["command"] = "python -m lastiter_plugins.verification.fuzz " + " ".join(
            sys.argv[1:] if argv is None else argv
        )
        with open(args.json, "w") as fh:
            json.dump(record, fh, indent=2)
            fh.write("\n")
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
