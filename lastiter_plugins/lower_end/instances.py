r"""How tight: the exact epsilon of an explicit instance that meets every declaration.

For a pipeline (a :class:`TrainingConfig`) and declared loss assumptions
(:class:`LossAssumptions`), :func:`lower_bound` builds one instance (losses, domain,
position of the differing record) that satisfies every declaration for the same run,
computes its exact last-iterate laws (:mod:`lastiter_plugins.lower_end.exact`) and
returns the LOWER end of the certified epsilon of their hockey-stick divergence at the
same delta. The worst case over all models meeting the declarations is therefore at
least that number, and every valid upper bound (``best``) at least as large: the truth
lies in ``[lower, upper]``. docs/decisions.md, section 20 has the derivation.

Instances (the same update, ``x <- Pi(x - eta (mean of clipped gradients + noise))``):

* G1 (no diameter, ``strong_convexity = 0``): linear losses ``<g_i, x>``, ``|g_i| = C`` for
  the differing record and 0 for the others: convex, 0-smooth, every gradient norm <= C on
  the whole space (clipping is the identity), a scalar GLM. Last iterate: a Gaussian, or
  a Gaussian mixture over the record's number of uses (random schemes).
* G2 (no diameter, ``strong_convexity = lam > 0`` as an l2 term outside the clip,
  ``l2_outside_clip=True``): the same linear data losses plus ``lam/2 |x|^2`` added after
  clipping: lam-strongly convex and lam-smooth, data gradients of norm <= C everywhere.
* G3 (a diameter, ``strong_convexity = 0``): the linear losses on ``[-D/2, D/2]`` (the
  projected 1-D walk of Altschuler & Talwar, arXiv 2205.13710, section 4).

No instance (the result says why, ``epsilon`` is None): per-example strong convexity on an
unbounded domain together with bounded gradients (no loss meets those declarations), strong
convexity with clipping that may be active or with a diameter (no exact law implemented),
add-or-remove with a sampling other than Poisson, and instances too large to compute
exactly within about a second.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
from scipy import stats

from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.lower_end import exact

#: The largest exact computation tried (components x cells of a Gaussian mixture, enumerated
#: patterns, G3 steps): beyond it the answer is "too large to compute exactly" (about 1 s).
MAX_MIXTURE_WORK = 2_000_000
MIXTURE_CELLS = 5_000
MAX_PATTERN_STEPS = 12
MAX_G3_STEPS = 40
MAX_G3_POSITIONS = 16
G3_NODES, G3_FINE_CELLS = 1_000, 4_000  # a coarser grid only widens the certified interval (its lower end stays valid)
TOO_LARGE = "too large to compute exactly"


@dataclasses.dataclass(frozen=True)
class InstanceProperties:
    """What an instance's losses and run are, to be checked against the declarations.

    Attributes:
      family: "G1", "G2" or "G3".
      smoothness: the instance's smoothness constant (of the whole loss, l2 term included).
      strong_convexity: its strong convexity (of the whole loss).
      per_example_strong_convexity: the part of it inside each per-example loss.
      diameter: the diameter of the domain it projects onto (None: no projection).
      max_gradient_norm: the largest per-example (data) gradient norm on the whole domain.
      scalar_glm: every per-example loss is phi(<a, x>) with phi convex.
      l2_outside: the l2 weight added after the clipped mean.
      config: the run (the same as the pipeline's).
    """

    family: str
    smoothness: float
    strong_convexity: float
    per_example_strong_convexity: float
    diameter: float | None
    max_gradient_norm: float
    scalar_glm: bool
    l2_outside: float
    config: TrainingConfig


@dataclasses.dataclass(frozen=True)
class LowerBound:
    """The exact epsilon (lower end of its certified interval) of one instance, or why there is none."""

    epsilon: float | None
    note: str
    instance: InstanceProperties | None = None


def violations(props: InstanceProperties, config: TrainingConfig, a: LossAssumptions) -> list[str]:
    """Every declaration (and pipeline parameter) the instance does not meet, in words (empty: it meets all)."""
    out = []
    if props.config != config:
        out.append(f"the instance runs {props.config}, not the declared pipeline {config}")
    if a.smoothness is not None and props.smoothness > a.smoothness:
        out.append(f"smoothness {props.smoothness:g} > declared {a.smoothness:g}")
    if props.strong_convexity < a.strong_convexity:
        out.append(f"strong convexity {props.strong_convexity:g} < declared {a.strong_convexity:g}")
    if a.l2_outside_clip:
        if props.l2_outside < a.strong_convexity or props.per_example_strong_convexity > 0:
            out.append("the strong convexity is not an l2 term outside the clip")
    elif props.l2_outside > 0:
        out.append("an l2 term outside the clip was not declared")
    if props.diameter != a.diameter:
        out.append(f"domain diameter {props.diameter} differs from the declared {a.diameter}")
    if (a.gradient_norms_within_clip or a.clipped_loss_convex_smooth) and props.max_gradient_norm > config.clip_norm:
        out.append(f"per-example gradient norms reach {props.max_gradient_norm:g} > C = {config.clip_norm:g}")
    if a.clipped_loss_convex_smooth and not props.scalar_glm:
        out.append("the per-example losses are not scalar GLMs")
    return out


def _linear_props(family: str, config: TrainingConfig, a: LossAssumptions) -> InstanceProperties:
    lam = a.strong_convexity if family == "G2" else 0.0
    return InstanceProperties(
        family=family,
        smoothness=lam,
        strong_convexity=lam,
        per_example_strong_convexity=0.0,
        diameter=a.diameter if family == "G3" else None,
        max_gradient_norm=config.clip_norm,  # |g| = C for the differing record, 0 for the others
        scalar_glm=True,  # <g, x> = phi(<g/|g|, x>) with phi linear
        l2_outside=lam,
        config=config,
    )


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


def _no_instance(config: TrainingConfig, a: LossAssumptions) -> str | None:
    """Why no implemented instance fits (None: one does)."""
    if config.relation is Relation.ADD_OR_REMOVE_ONE and config.sampling is not Sampling.POISSON:
        return (
            f"no exact instance for add-or-remove with sampling {config.sampling.value} (removing a record "
            "changes the other records' batches; implemented for Poisson sampling only)"
        )
    if a.strong_convexity > 0:
        if a.diameter is not None:
            return "no exact instance implemented for strongly convex losses on a bounded domain"
        if not a.l2_outside_clip:
            if a.update_is_gradient_step:
                return (
                    "no loss meets these declarations: a per-example loss that is strongly convex on an "
                    "unbounded domain has unbounded gradients, so its (clipped) gradients cannot all be the "
                    "gradients of such losses with norms <= C (declare the l2 term outside the clip, or a diameter)"
                )
            return "no exact instance implemented for strongly convex losses whose clipping may be active"
        if config.learning_rate is None:
            return "the strongly convex instance needs the learning rate"
    elif a.diameter is not None and config.learning_rate is None:
        return "the projected-walk instance needs the learning rate"
    return None


def _trimmed_binomial(steps: int, q: float, delta: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Binomial(T, q) support and weights, dropping the tails of total mass <= 1e-10 delta (returned)."""
    drop = 1e-10 * delta
    lo = int(stats.binom.ppf(drop / 2, steps, q))
    hi = int(stats.binom.isf(drop / 2, steps, q))
    support = np.arange(max(lo - 1, 0), min(hi + 1, steps) + 1)
    weights = stats.binom.pmf(support, steps, q)
    missing = max(0.0, 1.0 - float(np.sum(weights)))
    return support.astype(float), weights, missing + 1e-15


def _g1_laws(config: TrainingConfig, delta: float):
    if config.sampling not in (Sampling.RANDOM_BATCH, Sampling.POISSON):
        return exact.g1_laws(_params(config, _linear_props("G1", config, LossAssumptions())))
    counts, weights, missing = _trimmed_binomial(config.steps, config.sampling_probability, delta)
    lr = config.learning_rate if config.learning_rate is not None else 1.0
    a = lr * config.clip_norm / config.batch_size
    variance = config.steps * (lr * config.noise_multiplier * config.clip_norm / config.batch_size) ** 2
    if config.relation is Relation.REPLACE_ONE:
        return exact.GaussianLaws(weights, a * counts, weights, -a * counts, variance, missing)
    return exact.GaussianLaws(weights, a * counts, np.ones(1), np.zeros(1), variance, missing)


def _g2_laws(config: TrainingConfig, lam: float):
    """Linear data losses plus an l2 term outside the clip: x <- rho x - eta mean(g_B) + noise, rho = 1 - eta lam."""
    steps, per_epoch = config.steps, config.steps_per_epoch
    rho = 1.0 - config.learning_rate * lam
    prods = rho ** np.arange(steps - 1, -1, -1, dtype=float)  # step t contracted to the end
    a = config.learning_rate * config.clip_norm / config.batch_size
    sigma_p = config.learning_rate * config.noise_multiplier * config.clip_norm / config.batch_size
    variance = sigma_p**2 * float(np.sum(prods**2))
    sizes = np.full(per_epoch, config.batch_size, dtype=float)
    sizes[-1] = config.dataset_size - (per_epoch - 1) * config.batch_size
    position_weights = sizes / config.dataset_size
    if config.sampling in (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE):
        shifts = a * np.bincount(np.arange(steps) % per_epoch, weights=prods, minlength=per_epoch)
        if config.sampling is Sampling.CYCLIC:
            m = np.array([shifts[int(np.argmax(np.abs(shifts)))]])
            return exact.GaussianLaws(np.ones(1), m, np.ones(1), -m, variance)
        return exact.GaussianLaws(position_weights, shifts, position_weights, -shifts, variance)
    if config.sampling is Sampling.RESHUFFLE:
        means, weights = np.zeros(1), np.ones(1)
        for start in range(0, steps, per_epoch):
            used = np.arange(start, start + per_epoch)
            term = np.where(used < steps, a * prods[np.minimum(used, steps - 1)], 0.0)
            means = (means[:, None] + term[None, :]).ravel()
            weights = (weights[:, None] * position_weights[None, :]).ravel()
            means, inverse = np.unique(means, return_inverse=True)
            weights = np.bincount(inverse.ravel(), weights=weights)
            if means.size * MIXTURE_CELLS > MAX_MIXTURE_WORK:
                return None
        return exact.GaussianLaws(weights, means, weights, -means, variance)
    if steps > MAX_PATTERN_STEPS:
        return None
    patterns = (np.arange(2**steps)[:, None] >> np.arange(steps)[None, :]) & 1
    q = config.sampling_probability
    k = patterns.sum(axis=1)
    weights = np.exp(k * math.log(q) + (steps - k) * math.log1p(-q)) if q < 1 else (k == steps) * 1.0
    means = a * patterns @ prods
    keep = weights > 0
    w, m = weights[keep], means[keep]
    if config.relation is Relation.REPLACE_ONE:
        return exact.GaussianLaws(w, m, w, -m, variance)
    return exact.GaussianLaws(w, m, np.ones(1), np.zeros(1), variance)


def _g3_too_large(config: TrainingConfig) -> bool:
    if config.steps > MAX_G3_STEPS:
        return True
    return config.sampling is not Sampling.CYCLIC and config.steps_per_epoch > MAX_G3_POSITIONS


def lower_bound(config: TrainingConfig, assumptions: LossAssumptions, delta: float) -> LowerBound:
    r"""The exact epsilon at ``delta`` of an instance meeting every declaration (docs/decisions.md, section 20).

    Returns a :class:`LowerBound`: ``epsilon`` is the lower end of the certified interval of the
    instance's exact epsilon (so a lower bound on the truth of that instance, hence on the worst
    case over all models meeting the declarations), ``note`` names the instance; ``epsilon`` is
    None when no instance fits or it is too large to compute exactly, and ``note`` says why.
    """
    why = _no_instance(config, assumptions)
    if why is not None:
        return LowerBound(None, why)
    a = assumptions
    if a.diameter is not None:
        props = _linear_props("G3", config, a)
    elif a.strong_convexity > 0:
        props = _linear_props("G2", config, a)
    else:
        props = _linear_props("G1", config, a)
    wrong = violations(props, config, a)
    if wrong:  # never fake a number: an instance that misses a declaration bounds nothing
        return LowerBound(None, f"the {props.family} instance does not meet the declarations: {'; '.join(wrong)}")
    if props.family == "G3":
        if _g3_too_large(config):
            return LowerBound(None, f"{TOO_LARGE} (projected walk: more than {MAX_G3_STEPS} steps or many positions)")
        try:
            ex, _ = exact.g3_divergence(
                [2.0], _params(config, props), hockey_stick=True, max_nodes=G3_NODES, fine_cells=G3_FINE_CELLS
            )
        except ValueError as err:
            return LowerBound(None, f"{TOO_LARGE} ({err})")
        profile = ex.hockey_stick
        name = f"linear losses (|gradient| = C) projected onto a segment of length D = {a.diameter:g}"
    else:
        laws = _g1_laws(config, delta) if props.family == "G1" else _g2_laws(config, a.strong_convexity)
        if laws is None or max(laws.p_means.size, laws.q_means.size) * MIXTURE_CELLS > MAX_MIXTURE_WORK:
            return LowerBound(None, f"{TOO_LARGE} (more than {MAX_MIXTURE_WORK // MIXTURE_CELLS} mixture components)")
        profile = laws.hockey_stick(cells=MIXTURE_CELLS)
        name = "linear losses (|gradient| = C)"
        if props.family == "G2":
            name += f" plus an l2 term {a.strong_convexity:g} outside the clip"
    lower, _ = profile.epsilon(delta)
    return LowerBound(float(lower), f"{props.family}: {name}, the exact epsilon of its last iterate", props)
