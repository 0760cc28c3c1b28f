r"""How tight: the exact epsilon of an explicit instance that meets every declaration.

For a pipeline (a :class:`TrainingConfig`) and declared loss assumptions
(:class:`LossAssumptions`), :func:`lower_bound` builds the instances (losses, domain,
position of the differing record) that satisfy every declaration for the same run,
and returns the largest LOWER end of their exact epsilons at the same delta. The worst case
over all models meeting the declarations is therefore at least that number, and every valid
upper bound (``best``) at least as large: the truth lies in ``[lower, upper]``.
docs/derivations/lower-end.md#lower-end has the derivation.

Instances (the same update, ``x <- Pi(x - eta (mean of clipped gradients + noise))``), all
one-dimensional, the differing record's loss ``gamma x`` (its neighbour's ``-gamma x``, or absent):

* G1 (``strong_convexity = 0``, no diameter): linear losses, ``gamma = C``.
* G2 (an l2 term ``lam`` outside the clip, no diameter): the same plus ``lam x`` after the
  clipped mean.
* G3 (a diameter, ``strong_convexity = 0``, short runs): the projected 1-D walk of Altschuler
  & Talwar (arXiv 2205.13710, section 4), its laws propagated on a grid (exact.py).
* G4 (a diameter, or a per-example l2 term ``lam/2 x^2`` in every loss): the iterates stay where
  neither clipping nor the projection acts but with a bounded probability, counted; on a segment
  of length D with a per-example term, ``gamma = C - lam D/2`` keeps every gradient within C.

Given the record's memberships, the last iterate of G1, G2, G4 (before clipping or projection
act) is Gaussian; its law is a one-dimensional Gaussian location mixture over a weighted count of
uses, whose exact epsilon mixture.py computes from below at any n and T.

Cyclic runs also try G5 and G6 (:mod:`~lastiter_plugins.lower_end.last_use`: the last use on a cleared
coordinate); the largest lower end of all instances that meet the declarations is reported.

No instance (the result says why, ``epsilon`` is None): declarations no loss meets
(:func:`lastiter_plugins.feasibility.impossible_declaration`), add-or-remove
with a sampling other than Poisson, random allocation, a per-example l2 term with Poisson sampling, a contracting walk
that may reach its segment's ends, and computations beyond about a second.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy import stats

from lastiter_plugins.bounds._common import batch_sizes
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.feasibility import impossible_declaration
from lastiter_plugins.lower_end import exact, last_use, mixture
from lastiter_plugins.lower_end.declarations import ESCAPE_BUDGET, TOO_LARGE, InstanceProperties, violations

#: The largest projected walk computed exactly (G3 steps, positions per pass); beyond it the linear
#: instances (mixture.py) answer alone.
MAX_G3_STEPS = 40
MAX_G3_POSITIONS = 16
G3_NODES, G3_FINE_CELLS = 1_000, 4_000  # a coarser grid only widens the certified interval (its lower end stays valid)
#: The linear instances hold a few arrays of one number per step: beyond this many steps (8 GB of them),
#: no lower end is computed (the answer says so) rather than asking for the memory.
MAX_LINEAR_STEPS = 10**8


@dataclasses.dataclass(frozen=True)
class LowerBound:
    """The exact epsilon (lower end of its certified interval) of one instance, or why there is none."""

    epsilon: float | None
    note: str
    instance: InstanceProperties | None = None


def _params(config: TrainingConfig, props: InstanceProperties) -> dict[str, Any]:
    return {
        "dataset_size": config.dataset_size,
        "batch_size": config.batch_size,
        "noise_multiplier": config.noise_multiplier,
        "steps": config.steps,
        "sampling": config.sampling,
        "relation": config.relation,
        "learning_rate": config.learning_rate,
        "clip_norm": config.clip_norm,
        "smoothness": props.smoothness,
        "strong_convexity": props.strong_convexity,
        "diameter": props.diameter,
        "gradient_norms_within_clip": True,
        "l2_outside_clip": props.l2_outside > 0,
    }


@dataclasses.dataclass(frozen=True)
class LinearInstance:
    r"""A one-dimensional linear-loss instance (docs/derivations/lower-end.md#exact-linear-instances).

    Every record's loss is ``lam_in/2 x^2``, the differing record's adds ``gamma x`` (replace-one:
    ``-gamma x`` in the other dataset; add-or-remove: absent), the update adds ``lam_out x`` after the
    clipped mean (an l2 term outside the clip), and the run projects onto ``[-D/2, D/2]`` when a
    diameter is declared. While ``|x| <= radius`` no gradient is clipped and no projection moves the
    iterate (``radius`` None: never), so the last iterate equals the Gaussian mixture
    ``X = a S + N(0, s^2)`` off an event whose probability :func:`_escape` bounds.
    """

    gamma: float
    lam_in: float = 0.0
    lam_out: float = 0.0
    radius: float | None = None

    def family(self) -> str:
        if self.radius is not None or self.lam_in > 0:
            return "G4"
        return "G2" if self.lam_out > 0 else "G1"

    def properties(self, config: TrainingConfig, a: LossAssumptions) -> InstanceProperties:
        if self.lam_in == 0:
            grad = self.gamma
        elif a.diameter is not None:
            grad = self.gamma + self.lam_in * a.diameter / 2.0
        else:
            grad = math.inf  # lam_in |x| is unbounded on R
        return InstanceProperties(
            family=self.family(),
            smoothness=self.lam_in + self.lam_out,
            strong_convexity=self.lam_in + self.lam_out,
            per_example_strong_convexity=self.lam_in,
            diameter=a.diameter,
            max_gradient_norm=grad,
            scalar_glm=True,  # 1-D: lam_in/2 x^2 + gamma x = phi(<1, x>) with phi convex
            l2_outside=self.lam_out,
            config=config,
        )

    def describe(self, a: LossAssumptions, escape: float = 0.0) -> str:
        text = f"linear losses (|gradient| = {self.gamma:.4g})"
        if self.lam_in > 0:
            text += f" plus a per-example l2 term {self.lam_in:.4g}"
        if self.lam_out > 0:
            text += f" plus an l2 term {self.lam_out:.4g} outside the clip"
        if a.diameter is not None:
            text += f", projected onto a segment of length D = {a.diameter:g}"
        if self.radius is not None:
            text += f" (clipping and projection inactive within |x| <= {self.radius:.4g}, left w.p. <= {escape:.1e})"
        return text


def _no_instance(config: TrainingConfig, a: LossAssumptions) -> str | None:
    """Why no implemented instance fits (None: one does)."""
    if config.relation is Relation.ADD_OR_REMOVE_ONE and config.sampling is not Sampling.POISSON:
        return (
            f"no exact instance for add-or-remove with sampling {config.sampling.value} (removing a record "
            "changes the other records' batches; implemented for Poisson sampling only)"
        )
    per_example = a.strong_convexity > 0 and not a.l2_outside_clip
    if config.sampling is Sampling.RANDOM_ALLOCATION and (
        config.allocations_per_epoch > 1 or per_example or a.diameter is not None
    ):
        return (
            "no exact instance implemented for random allocation with allocations_per_epoch > 1, a per-example l2 "
            "term (the contraction depends on the random batch size) or a projection"
        )
    impossible = impossible_declaration(config, a)  # the one definition of declarations no loss meets
    if impossible is not None:
        return impossible
    if (a.strong_convexity > 0 or a.diameter is not None) and config.learning_rate is None:
        return "the instance needs the learning rate (strong convexity or a projection acts through it)"
    if per_example and config.sampling is Sampling.POISSON:
        return (
            "no exact instance implemented for a per-example l2 term with Poisson sampling (the contraction "
            "depends on the random batch size)"
        )
    if config.learning_rate is not None and config.learning_rate * a.strong_convexity > 1.0:
        return "no exact instance implemented for learning_rate * strong_convexity > 1 (the step overshoots)"
    return None


def _rhos(config: TrainingConfig, lam_in: float, lam_out: float) -> np.ndarray:
    """rho_t = 1 - eta (lam_in |B_t| / b + lam_out), t = 0..T-1 (fixed batch sizes: Poisson has lam_in = 0)."""
    steps, b = config.steps, config.batch_size
    per_epoch, last = batch_sizes(config.dataset_size, b)
    if config.sampling in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE):
        sizes = np.full(per_epoch, float(b))
        sizes[-1] = last
        sizes = sizes[np.arange(steps) % per_epoch]
    else:
        sizes = np.full(steps, float(b))
    lr = config.learning_rate if config.learning_rate is not None else 0.0
    return 1.0 - lr * (lam_in * sizes / b + lam_out)


def _contractions(rhos: np.ndarray) -> np.ndarray:
    """c_t = prod_{s > t} rho_s: how much of step t's displacement reaches the last iterate."""
    tail = np.cumprod(rhos[::-1])[::-1]
    return np.append(tail[1:], 1.0)


def _batch_weights(config: TrainingConfig) -> np.ndarray:
    per_epoch, last = batch_sizes(config.dataset_size, config.batch_size)
    sizes = np.full(per_epoch, float(config.batch_size))
    sizes[-1] = last
    return sizes / config.dataset_size


def _mixing_law(config: TrainingConfig, c: np.ndarray, spacing: float, exact: bool) -> mixture.MixingLaw:
    r"""The law of S' <= S = sum over the record's uses t of c_t (the mixing variable of the last iterate)."""
    steps, per_epoch = config.steps, config.steps_per_epoch
    sampling = config.sampling
    if sampling in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE):
        per_position = np.bincount(np.arange(steps) % per_epoch, weights=c, minlength=per_epoch)
        if sampling is Sampling.CYCLIC:  # the record may sit at any index: the one used most
            return mixture.finite_law(np.array([per_position.max()]), np.ones(1), "cyclic, worst position")
        return mixture.finite_law(per_position, _batch_weights(config), f"{per_epoch} positions")
    if sampling in (Sampling.RESHUFFLE, Sampling.RANDOM_ALLOCATION):
        # one position per pass: the record's batch (reshuffle), or its one step of the epoch, uniform over the t
        # steps (random allocation, k = 1; a step past the end of a partial last epoch contributes 0)
        passes = -(-steps // per_epoch)
        builder = mixture.LatticeSum(spacing, passes, exact_values=exact)
        weights = _batch_weights(config) if sampling is Sampling.RESHUFFLE else np.full(per_epoch, 1.0 / per_epoch)
        for start in range(0, steps, per_epoch):
            values = np.zeros(per_epoch)
            used = c[start : start + per_epoch]
            values[: used.size] = used
            if np.all(values == values[0]):
                builder.add_constant(values[0])
            else:
                builder.add_term(values, weights)
        return builder.law(f"one position per pass, lattice {spacing:g}")
    j = mixture.LatticeSum(spacing, 1, exact_values=exact).lattice_index(c)
    counts = np.bincount(j)
    groups = np.flatnonzero(counts[1:]) + 1
    builder = mixture.LatticeSum(spacing, groups.size, exact_values=exact)
    for jj in groups:
        builder.add_binomial(int(jj), int(counts[jj]), config.sampling_probability)
    return builder.law(f"Binomial memberships, lattice {spacing:g}, trimmed mass {builder.trimmed:.1e}")


def _spacing(config: TrainingConfig, c: np.ndarray) -> float:
    """The finest lattice (2^-12 ... COARSEST_SPACING) whose estimated convolution work fits in half of
    mixture.MAX_WORK (flooring loses at most one spacing per use: the finer, the closer to the truth)."""
    q = config.sampling_probability
    random = config.sampling in (Sampling.RANDOM_BATCH, Sampling.POISSON)
    if random:
        spread = 30.0 * math.sqrt(q * (1.0 - q) * float(np.sum(c * c))) + 1.0
    elif config.sampling in (Sampling.RESHUFFLE, Sampling.RANDOM_ALLOCATION):
        per_epoch = config.steps_per_epoch
        spread = float(np.sum([np.ptp(c[i : i + per_epoch]) for i in range(0, c.size, per_epoch)])) + 1.0
    else:
        return COARSEST_SPACING  # one term: no lattice
    spacing = 2.0**-12
    while spacing < COARSEST_SPACING:
        j = np.floor(c / spacing).astype(np.int64)
        if random:
            counts = np.bincount(j)[1:]
            counts = counts[counts > 0]
            points = float(np.sum(30.0 * np.sqrt(counts * q * (1.0 - q)) + 3.0))
        else:
            per_epoch = config.steps_per_epoch
            points = float(sum(np.unique(j[i : i + per_epoch]).size for i in range(0, j.size, per_epoch)))
        if points * spread / spacing <= mixture.MAX_WORK / 2.0:
            return spacing
        spacing *= 2.0
    return spacing


def _rho_max(config: TrainingConfig, lam_in: float, lam_out: float) -> float:
    """The largest rho_t (the smallest batch contracts least)."""
    smallest = batch_sizes(config.dataset_size, config.batch_size)[1]
    if config.sampling not in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE):
        smallest = config.batch_size
    lr = config.learning_rate if config.learning_rate is not None else 0.0
    return 1.0 - lr * (lam_in * smallest / config.batch_size + lam_out)


def _escape(config: TrainingConfig, inst: LinearInstance, rho_max: float) -> float:
    r"""Probability (under either law) that the unconstrained iterates leave ``[-radius, radius]`` in T steps.

    ``X_t`` given the memberships is Gaussian with ``|mean| <= a sum_k rho^k`` and variance
    ``<= sigma^2 sum_k rho^(2k)`` (rho = the largest rho_t, the sums over k < min(t, T)), so by the
    union bound over t = 1..T, ``P(exists t: |X_t| > R) <= 2 T Phi_c((R - m)/s)``."""
    if inst.radius is None:
        return 0.0
    m_bar, s_bar = _reach(config, inst.gamma, rho_max)
    if inst.radius <= m_bar:
        return 1.0
    tail = max(float(stats.norm.sf((inst.radius - m_bar) / s_bar)), 1e-300)  # never an underflowed 0
    return min(1.0, 2.0 * config.steps * tail * (1.0 + 1e-9))


def _reach(config: TrainingConfig, gamma: float, rho: float) -> tuple[float, float]:
    """(largest |mean|, largest std) of an unconstrained iterate (rho: the largest rho_t)."""
    lr = config.learning_rate if config.learning_rate is not None else 1.0
    steps = config.steps
    geo = steps if rho >= 1.0 else min(steps, 1.0 / (1.0 - rho))
    geo2 = steps if rho >= 1.0 else min(steps, 1.0 / (1.0 - rho * rho))
    sigma = lr * config.noise_multiplier * config.clip_norm / config.batch_size
    return lr * gamma / config.batch_size * geo, sigma * math.sqrt(geo2)


#: The coarsest lattice for contraction-weighted counts (each use may lose up to this much of
#: a weight <= 1); beyond it the answer is "too large to compute exactly".
COARSEST_SPACING = 2.0**-4


def _staying_radius(config: TrainingConfig, lam_in: float, rho_max: float) -> tuple[float, float]:
    """(R, gamma = C - lam_in R) with escape probability <= ESCAPE_BUDGET when clipping bounds the region."""
    k = float(stats.norm.isf(ESCAPE_BUDGET / (2.0 * config.steps)))
    m1, s_bar = _reach(config, 1.0, rho_max)
    radius = (config.clip_norm * m1 + k * s_bar) / (1.0 + lam_in * m1)
    return radius * (1.0 + 1e-9), config.clip_norm - lam_in * radius * (1.0 + 1e-9)


def _candidates(config: TrainingConfig, a: LossAssumptions) -> list[LinearInstance]:
    """The linear instances that meet the declarations (the lower end is the largest of their epsilons)."""
    lam, clip, diameter = a.strong_convexity, config.clip_norm, a.diameter
    half = None if diameter is None else diameter / 2.0
    if a.l2_outside_clip or lam == 0:
        lam_out = lam if a.l2_outside_clip else 0.0
        out = [LinearInstance(clip, 0.0, lam_out, half)]
        if lam == 0 and half is not None and not a.l2_outside_clip and config.sampling is not Sampling.POISSON:
            out += _contracting_candidates(config, a, half)
        return out
    if half is not None:  # per-example l2 on a segment: gradients <= C on the whole domain
        gamma = clip - lam * half
        return [LinearInstance(gamma, lam, 0.0, half)] if gamma > 0 else []  # lam D/2 >= C: see lower_bound
    # per-example l2, no domain, clipping may be active: gradients <= C on the region the iterates keep to
    radius, gamma = _staying_radius(config, lam, _rho_max(config, lam, 0.0))
    return [LinearInstance(gamma, lam, 0.0, radius)] if gamma > 0 else []


def _contracting_candidates(config: TrainingConfig, a: LossAssumptions, half: float) -> list[LinearInstance]:
    """Convex declarations on a segment of half-length ``half``: a per-example l2 term lam' (allowed: strong
    convexity >= 0, and lam' <= M) just strong enough that the walk stays inside the segment but with
    probability 1e-30."""
    lr, clip = config.learning_rate, config.clip_norm
    assert lr is not None  # _no_instance refuses a projection without the learning rate
    top = min(1.0 / lr, clip / (2.0 * half))  # keeps gamma >= C/2
    if a.smoothness is not None:
        top = min(top, a.smoothness)
    if top <= 0:
        return []

    def escape(lam: float) -> float:
        return _escape(config, LinearInstance(clip - lam * half, lam, 0.0, half), _rho_max(config, lam, 0.0))

    if escape(top) > ESCAPE_BUDGET:
        return []
    lo, hi = top * 1e-12, top
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if escape(mid) > ESCAPE_BUDGET else (lo, mid)
    return [LinearInstance(clip - lam * half, lam, 0.0, half) for lam in (hi, min(2.0 * hi, top))]


def _linear_epsilon(config: TrainingConfig, inst: LinearInstance, delta: float) -> tuple[float | None, str]:
    """The lower end of the exact epsilon of one linear instance, or None and why."""
    if config.steps > MAX_LINEAR_STEPS:
        return None, f"{TOO_LARGE} (more than {MAX_LINEAR_STEPS:.0e} steps)"
    rhos = _rhos(config, inst.lam_in, inst.lam_out)
    c = _contractions(rhos)
    exact = bool(np.all(c == 1.0))
    escape = _escape(config, inst, _rho_max(config, inst.lam_in, inst.lam_out))
    if escape >= 1e-3:
        return None, (
            f"the {inst.family()} instance may leave |x| <= {inst.radius:.4g} (probability bound {escape:.2g}), where "
            "clipping or the projection acts: no exact law implemented for a contracting walk there"
        )
    lr = config.learning_rate if config.learning_rate is not None else 1.0
    shift = lr * inst.gamma / config.batch_size
    std = lr * config.noise_multiplier * config.clip_norm / config.batch_size * math.sqrt(float(np.sum(c * c)))
    spacing = 1.0 if exact else _spacing(config, c)
    while True:
        try:
            law = _mixing_law(config, c, spacing, exact)
            break
        except mixture.MixtureTooLarge:
            if spacing >= (1.0 if exact else COARSEST_SPACING):
                return None, f"{TOO_LARGE} ({inst.family()}: more than {mixture.MAX_WORK:.0e} operations)"
            spacing *= 4.0
    add_or_remove = config.relation is Relation.ADD_OR_REMOVE_ONE
    eps = mixture.epsilon_lower_end(law, shift, std, add_or_remove=add_or_remove, delta=delta, escape=escape)
    return eps, law.detail


def _g3_too_large(config: TrainingConfig) -> bool:
    if config.steps > MAX_G3_STEPS:
        return True
    return config.sampling is not Sampling.CYCLIC and config.steps_per_epoch > MAX_G3_POSITIONS


def _g3_epsilon(config: TrainingConfig, a: LossAssumptions, delta: float) -> float | None:
    """The projected walk's exact epsilon (lower end), or None when too large."""
    props = _g3_props(config, a)
    if _g3_too_large(config):
        return None
    try:
        ex, _ = exact.g3_divergence(
            [2.0], _params(config, props), hockey_stick=True, max_nodes=G3_NODES, fine_cells=G3_FINE_CELLS
        )
    except ValueError:
        return None
    assert ex.hockey_stick is not None  # asked for (hockey_stick=True)
    return float(ex.hockey_stick.epsilon(delta)[0])


def _g3_props(config: TrainingConfig, a: LossAssumptions) -> InstanceProperties:
    return dataclasses.replace(LinearInstance(config.clip_norm).properties(config, a), family="G3")


def lower_bound(config: TrainingConfig, assumptions: LossAssumptions, delta: float) -> LowerBound:
    r"""The exact epsilon at ``delta`` of an instance meeting every declaration
    (docs/derivations/lower-end.md#lower-end).

    Returns a :class:`LowerBound`: ``epsilon`` is the lower end of the certified interval of the
    instance's exact epsilon (so a lower bound on the truth of that instance, hence on the worst
    case over all models meeting the declarations), ``note`` names the instance; ``epsilon`` is
    None when no instance fits or it is too large to compute exactly, and ``note`` says why.
    Several instances may fit (a projected walk: computed exactly on short runs, or kept inside its
    segment by a per-example l2 term; cyclic runs: the last use on a cleared coordinate, last_use.py);
    the largest lower end is returned.
    """
    why = _no_instance(config, assumptions)
    if why is not None:
        return LowerBound(None, why)
    a = assumptions
    found: list[tuple[float, str, InstanceProperties]] = []
    refused: list[str] = []
    for inst in _candidates(config, a):
        props = inst.properties(config, a)
        wrong = violations(props, config, a)
        if wrong:  # never fake a number: an instance that misses a declaration bounds nothing
            refused.append(f"the {props.family} instance does not meet the declarations: {'; '.join(wrong)}")
            continue
        eps, why = _linear_epsilon(config, inst, delta)
        escape = _escape(config, inst, _rho_max(config, inst.lam_in, inst.lam_out))
        if eps is None:
            refused.append(why)
            continue
        found.append((eps, f"{props.family}: {inst.describe(a, escape)}", props))
    if a.diameter is not None and a.strong_convexity == 0 and not a.l2_outside_clip:
        props = _g3_props(config, a)
        if not violations(props, config, a):
            eps = _g3_epsilon(config, a, delta)
            if eps is None:
                refused.append(f"{TOO_LARGE} (G3, projected walk: more than {MAX_G3_STEPS} steps or many positions)")
            else:
                name = f"G3: linear losses (|gradient| = C) projected onto a segment of length D = {a.diameter:g}"
                found.append((eps, name, props))
    timed, why_not = last_use.candidates(config, a)  # cyclic: the last use on a cleared coordinate (G5, G6)
    refused += why_not
    for last in timed:
        props = last.properties(config)
        wrong = violations(props, config, a)
        if wrong:
            refused.append(f"the {props.family} instance does not meet the declarations: {'; '.join(wrong)}")
            continue
        eps, why = last.epsilon(config, delta)
        if eps is None:
            refused.append(why)
            continue
        found.append((eps, f"{props.family}: {why}", props))
    if not found:
        return LowerBound(
            None,
            "; ".join(refused)
            or "no instance implemented for these declarations (a per-example l2 term lam leaves no room for a "
            "data gradient within C: lam times the radius the iterates need, or the domain's, is >= C)",
        )
    eps, name, props = max(found, key=lambda f: f[0])
    return LowerBound(float(eps), f"{name}, the exact epsilon of its last iterate", props)
