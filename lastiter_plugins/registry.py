r"""Which bound applies to which pipeline: the dispatch table.

One :class:`BoundSpec` per bound id: the sampling schemes it covers (with the
neighbouring relation it is proven for), the conditions it needs (each a small
function returning what is violated, or None), the function computing it, how
it is justified (:class:`Proof`), what its number protects (:class:`Protects`)
and what kind of guarantee it computes (:class:`Kind`). This is the single
place where DP-SGD hyperparameters are mapped to the papers' symbols; step-size
limits and contraction factors are functions of the math modules. Decisions
that deviate from, or sharpen, the papers are marked "Decision" and derived in
docs/decisions.md.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np

from lastiter_plugins import baselines
from lastiter_plugins.bounds import (
    altschuler_talwar,
    bounded_domain,
    composition,
    dominating_mixture,
    kong_ribero,
    liang,
    membership_mixtures,
    shifted_interpolation,
    ye_shokri,
)
from lastiter_plugins.bounds._common import gradient_step_contraction
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig, ValueEnum
from lastiter_plugins.defaults import BEST
from lastiter_plugins.errors import NotApplicableError
from lastiter_plugins.profiles import GaussianMixtureProfile

# A condition returns None when it holds, else (what is required, what was found), optionally
# with a third text saying why (kept out of the one-line form compare prints; see Unmet.short).
Condition = Callable[[TrainingConfig, LossAssumptions], "tuple[str, str] | tuple[str, str, str] | None"]
RdpFunction = Callable[[TrainingConfig, LossAssumptions, np.ndarray], np.ndarray]
ProfileFunction = Callable[[TrainingConfig, LossAssumptions], "PrivacyProfile"]
# A proven lower bound on a bound's epsilon at delta, much cheaper than the bound itself.
#: (config, assumptions, delta, beat) -> a proven lower bound on the row's epsilon at delta; it may stop as soon as
#: it is above ``beat`` (best skips the row then).
LowerEstimate = Callable[[TrainingConfig, LossAssumptions, float, float], float]


class PrivacyProfile(Protocol):
    """What a GDP or PLD bound returns: a privacy profile delta(eps) with its exact inverse."""

    def epsilon(self, delta: float) -> float: ...

    def delta(self, eps: float) -> float: ...


ALL_SCHEMES = tuple(Sampling)
EPOCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
FIXED_BATCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE)
# Decision (audit of arXiv 2407.05237 Prop. 2.1): with Poisson sampling the batch can be
# larger than the b it is divided by, so the step acts like eta*|B|/b and the
# Lipschitz and sensitivity constants of Kong & Ribero's proofs fail. Their
# "any sampling" bounds therefore cover every scheme with batches of at most b.
AT_MOST_B_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE, Sampling.RANDOM_BATCH)


class Protects(ValueEnum):
    """What a guarantee covers: the released final model, or every iterate."""

    FINAL_MODEL = "the final model only"
    EVERY_ITERATE = "every iterate"


class Kind(ValueEnum):
    """What a bound computes: a Renyi-DP curve, a Gaussian privacy profile (mu-GDP), or a
    privacy loss distribution composed by dp-accounting (a profile without a Renyi curve;
    its figures depend on dp-accounting's version and discretisation, docs/decisions.md
    section 18)."""

    RDP = "rdp"
    GDP = "gdp"
    PLD = "pld"


@dataclasses.dataclass(frozen=True)
class Proof:
    """How a bound is justified.

    ``proven``: the theorem as stated, or our derivation written out in
    docs/decisions.md and pinned by ground-truth tests. Otherwise ``reason``
    says what is missing. Only proven bounds enter ``best``; an unproven one is
    computed only when asked for by name, and always shown as ``unproven: reason``.
    """

    proven: bool
    reason: str = ""

    def __post_init__(self) -> None:
        if not self.proven and not self.reason:
            raise ValueError("an unproven bound must say why (Proof.reason).")

    def __str__(self) -> str:
        return "proven" if self.proven else f"unproven: {self.reason}"


PROVEN = Proof(True)

#: A check that says why a pipeline leaves a published statement (None: it stays within it).
OutsidePublished = Callable[[TrainingConfig, LossAssumptions], "str | None"]


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where a row's proof comes from (beside its proof status).

    Attributes:
      published: the published theorem the row applies within its stated assumptions (authors,
        venue or arXiv id, theorem); empty when none.
      derived: this library's derivation, extension or correction: the docs section and the
        independent checks it passed (exact instances, fuzzing, re-derivation); empty when none.
      outside_published: checks that say when a pipeline leaves the published statement (a short
        last batch, a projection the paper does not have, the linear-model route, ...): then the
        number rests on ``derived``.
    """

    published: str = ""
    derived: str = ""
    outside_published: tuple[OutsidePublished, ...] = ()

    def __post_init__(self) -> None:
        if not (self.published or self.derived):
            raise ValueError("a provenance names a published theorem or a derivation (or both).")
        if self.outside_published and not (self.published and self.derived):
            raise ValueError("a row that leaves its published statement needs both the theorem and the derivation.")

    def why_derived(self, cfg: TrainingConfig, a: LossAssumptions) -> str | None:
        """None when the number rests on the published theorem for this pipeline, else why not."""
        if not self.published:
            return "no published theorem states it"
        for check in self.outside_published:
            why = check(cfg, a)
            if why is not None:
                return why
        return None

    def describe(self, cfg: TrainingConfig, a: LossAssumptions) -> str:
        """One line: ``published: ...`` or ``derived here: ...`` for this pipeline."""
        why = self.why_derived(cfg, a)
        if why is None:
            return f"published: {self.published}"
        prefix = f"derived here ({why}): " if self.published else "derived here: "
        return prefix + self.derived


@dataclasses.dataclass(frozen=True)
class BoundSpec:
    """One row of the dispatch table.

    Attributes:
      id: the bound id users pass.
      title: a one-line description.
      reference: the citation users can follow (authors, year, arXiv id, theorem).
      covers: sampling scheme -> the neighbouring relation the bound is proven for.
      assumptions: what the bound assumes, in words.
      conditions: the preconditions, each a function returning None or (required, found).
      compute: the RDP curve at the given orders (nats); for a GDP bound, the RDP its
        profile implies (mu-GDP implies RDP alpha mu^2/2; mixtures by joint convexity);
        None for a PLD bound, and for a GDP bound whose profile truncates rare events (no
        Renyi curve).
      profile: for a GDP or PLD bound, its privacy profile (converted to epsilon exactly).
      proof: how the bound is justified.
      protects: what the number covers.
      kind: the kind of guarantee.
      linear_in_order: the RDP curve is exactly rho*alpha (converted at the continuous optimum).
      lower_estimate: a proven lower bound on the bound's epsilon at delta, cheap; ``best``
        computes an expensive bound only when this is not above the best so far.
      estimate_curve: a cheaper curve at or below ``compute`` at every order, which the lower
        estimate from a few orders may use instead (docs/decisions.md, section 22, part 5).
      provenance: whether the proof is a published theorem or this library's derivation.
    """

    id: str
    title: str
    reference: str
    covers: Mapping[Sampling, Relation]
    assumptions: str
    conditions: tuple[Condition, ...]
    compute: RdpFunction | None
    profile: ProfileFunction | None = None
    proof: Proof = PROVEN
    protects: Protects = Protects.FINAL_MODEL
    kind: Kind = Kind.RDP
    linear_in_order: bool = False
    lower_estimate: LowerEstimate | None = None
    estimate_curve: RdpFunction | None = None
    provenance: Provenance | None = None  # every row of the table has one (checked when the table is built)

    def __post_init__(self) -> None:
        if (self.kind is Kind.RDP) != (self.profile is None):
            raise ValueError(f"{self.id}: a GDP or PLD bound, and only those, has a privacy profile.")
        if (self.kind is Kind.PLD and self.compute is not None) or (self.kind is Kind.RDP and self.compute is None):
            raise ValueError(f"{self.id}: a PLD bound has no Renyi curve, an RDP bound has one.")

    @property
    def has_renyi_curve(self) -> bool:
        """Whether the bound gives a Renyi-DP curve (a PLD row never does, nor a profile whose tails
        are truncated: mass negligible for delta can dominate a Renyi divergence)."""
        return self.compute is not None

    @property
    def relations(self) -> frozenset[Relation]:
        return frozenset(self.covers.values())

    def relation_for(self, sampling: Sampling) -> Relation | None:
        return self.covers.get(sampling)


@dataclasses.dataclass(frozen=True)
class Unmet:
    """One failed precondition: what is required, what was found, and (optionally) why it is needed."""

    required: str
    found: str
    why: str = ""

    @property
    def short(self) -> str:
        """The condition in one short line, without the theorem: ``required (found X)``."""
        return f"{self.required} (found {self.found})"

    @property
    def condition(self) -> str:
        """The condition in full (with why it is needed), without the theorem: what a listing that cites
        each reference once, at its end, prints."""
        why = f" ({self.why})" if self.why else ""
        return f"{self.required}{why} (found {self.found})"

    def message(self, where: str) -> str:
        """The full sentence of an error message, naming the bound and its theorem (``where``)."""
        why = f" ({self.why})" if self.why else ""
        return f"{self.required}{why} for {where}. Found {self.found}."


@dataclasses.dataclass(frozen=True)
class Applicability:
    """Whether a bound applies to a pipeline, and if not, every reason why.

    ``reasons`` are the full sentences (with the bound's reference); ``unmet`` the same
    conditions as data, in the same order (the first is what compare prints).
    """

    bound: str
    applies: bool
    reasons: tuple[str, ...]
    relation: Relation | None
    reference: str
    unmet: tuple[Unmet, ...] = ()

    @property
    def reason(self) -> str:
        return " ".join(self.reasons)


# ---------------------------------------------------------------- conditions


def _needs_learning_rate(cfg: TrainingConfig, a: LossAssumptions):
    if cfg.learning_rate is None:
        return "learning_rate (the constant SGD step size) must be given", "none"
    return None


def _needs_smoothness(cfg: TrainingConfig, a: LossAssumptions):
    if a.smoothness is None:
        return "smoothness (M, the gradient-Lipschitz constant of every per-example loss) must be declared", "none"
    return None


def _needs_diameter(cfg: TrainingConfig, a: LossAssumptions):
    if a.diameter is None:
        return (
            "diameter (D) must be declared",
            "no projection",
            "every step must project the parameters onto a convex set of that diameter",
        )
    return None


def _needs_convexity(cfg: TrainingConfig, a: LossAssumptions):
    if not a.convex:
        return "the losses must be convex (weak_convexity = 0)", f"weak_convexity={a.weak_convexity}"
    return None


def _needs_strong_convexity(cfg: TrainingConfig, a: LossAssumptions):
    if a.strong_convexity <= 0:
        return "strong_convexity (lam) must be > 0", f"strong_convexity={a.strong_convexity}"
    return None


def _needs_inactive_clipping(cfg: TrainingConfig, a: LossAssumptions):
    # Decision (audit of arXiv 2203.05363): the rho-contraction of Lemma D.3 holds for
    # the gradient step, not for the clipped one (a clipped field is bounded,
    # hence not strongly monotone; counterexamples exist), so these bounds need
    # the user's assertion that clipping is never active.
    if not a.update_is_gradient_step:
        return (
            "gradient_norms_within_clip or clipped_loss_convex_smooth",
            "both False",
            "gradient_norms_within_clip: every per-example gradient norm <= C on the whole domain, so clipping is "
            "never active; clipped_loss_convex_smooth: the scalar-GLM route; the contraction / non-expansiveness "
            "argument does not hold for clipped gradients in general",
        )
    return None


def _steps_per_epoch_at_least_two(cfg: TrainingConfig, a: LossAssumptions):
    if cfg.steps_per_epoch < 2:
        return "ceil(dataset_size / batch_size) must be >= 2", f"{cfg.steps_per_epoch}"
    return None


def _full_batch(cfg: TrainingConfig, a: LossAssumptions):
    if cfg.batch_size != cfg.dataset_size:
        return "batch_size must equal dataset_size (full-batch gradient descent)", f"{cfg.batch_size}"
    return None


def _step_size(
    limit: Callable[[TrainingConfig, LossAssumptions], float],
    text: str | Callable[[TrainingConfig, LossAssumptions], str],
    *,
    strict: bool,
) -> Condition:
    """learning_rate <= limit (or < limit when ``strict``); skipped while the
    inputs are missing (that is reported by the other conditions). ``text`` is
    the limit's formula, or a function giving it for the configuration."""

    def check(cfg: TrainingConfig, a: LossAssumptions):
        if cfg.learning_rate is None or a.smoothness is None:
            return None
        bound = limit(cfg, a)
        ok = cfg.learning_rate < bound if strict else cfg.learning_rate <= bound
        if ok:
            return None
        op = "<" if strict else "<="
        formula = text(cfg, a) if callable(text) else text
        return f"learning_rate must be {op} {formula} = {bound:.6g}", f"{cfg.learning_rate:g}"

    return check


def _kong_ribero_limit(cfg: TrainingConfig, a: LossAssumptions) -> float:
    return kong_ribero.max_learning_rate(a.smoothness, a.weak_convexity, not a.update_is_gradient_step)


_kong_ribero_step = _step_size(
    _kong_ribero_limit,
    lambda c, a: (
        "1/(2(M+m)) (clipping may be active)"
        if not a.update_is_gradient_step
        else "1/(M+m) (the update is a gradient step: clipping never active, or the scalar-GLM route)"
    ),
    strict=False,
)


def _poisson_q(cfg: TrainingConfig) -> float | None:
    return cfg.sampling_probability if cfg.sampling is Sampling.POISSON else None


_non_expansive_step = _step_size(
    lambda c, a: altschuler_talwar.max_learning_rate(a.smoothness, _poisson_q(c)),
    lambda c, a: "2b/(nM) (poisson: a batch can hold all n examples)" if c.sampling is Sampling.POISSON else "2/M",
    strict=False,
)
_ye_shokri_step = _step_size(
    lambda c, a: ye_shokri.max_learning_rate(a.strong_convexity, a.smoothness), "2/(lam+M)", strict=True
)
_two_over_m_strict = _step_size(lambda c, a: ye_shokri.max_learning_rate(0.0, a.smoothness), "2/M", strict=True)
_one_over_m_strict = _step_size(lambda c, a: ye_shokri.full_batch_max_learning_rate(a.smoothness), "1/M", strict=True)


# ---------------------------------------------------------------- bound functions


def _kr_lipschitz(cfg: TrainingConfig, a: LossAssumptions) -> float:
    # The scalar-GLM route makes the clipped update the gradient step of convex losses psi_i with
    # |grad psi_i| <= C: Kong & Ribero's no-clipping constant L_eta applies (no sqrt(2)).
    return kong_ribero.update_lipschitz(
        cfg.learning_rate, a.smoothness, a.weak_convexity, not a.update_is_gradient_step
    )


def _kong_ribero_cyclic(cfg, a, orders):
    return kong_ribero.cyclic_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        steps_per_epoch=cfg.steps_per_epoch,
        epochs=cfg.full_epochs,
        lipschitz=_kr_lipschitz(cfg, a),
    )


def _kong_ribero_bounded(cfg, a, orders):
    return kong_ribero.bounded_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        lipschitz=_kr_lipschitz(cfg, a),
        diameter=a.diameter,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        clip_norm=cfg.clip_norm,
    )


def _kong_ribero_curvature_free(cfg, a, orders):
    return kong_ribero.curvature_free_rdp(
        orders, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps, batch_size=cfg.batch_size
    )


def _domain_inputs(cfg: TrainingConfig, a: LossAssumptions) -> dict:
    """The inputs every bounded-domain bound with sampled batches takes, named as its math module names them."""
    return {
        "sampling_probability": cfg.sampling_probability,
        "noise_multiplier": cfg.noise_multiplier,
        "diameter": a.diameter,
        "batch_size": cfg.batch_size,
        "learning_rate": cfg.learning_rate,
        "clip_norm": cfg.clip_norm,
    }


def _altschuler_talwar(cfg, a, orders):
    # The strongly convex variant (eq. 5.3) needs the step to contract by c < 1.
    return altschuler_talwar.rdp(
        orders, steps=cfg.steps, contraction=_strong_contraction(cfg, a), **_domain_inputs(cfg, a)
    )


def _strong_contraction(cfg: TrainingConfig, a: LossAssumptions) -> float | None:
    """c < 1 of the unclipped gradient step for fixed-size batches, else None (an empty
    Poisson batch does not contract)."""
    if a.strong_convexity > 0 and cfg.sampling is Sampling.RANDOM_BATCH and cfg.learning_rate * a.smoothness < 2.0:
        return gradient_step_contraction(cfg.learning_rate, a.strong_convexity, a.smoothness)
    return None


def _bounded_domain_random(cfg, a, orders):
    return bounded_domain.random_batch_rdp(
        orders, steps=cfg.steps, contraction=_strong_contraction(cfg, a), **_domain_inputs(cfg, a)
    )


def _si_inputs(cfg: TrainingConfig, a: LossAssumptions) -> dict:
    """Our parameters in the units of Bok, Su & Altschuler: per-step mu s = 2/z, the
    weakest contraction over the batch sizes of a pass, the diameter over sigma_p."""
    return {
        "step_mu": shifted_interpolation.replace_one_step_mu(cfg.noise_multiplier),
        "contraction": shifted_interpolation.worst_batch_contraction(
            learning_rate=cfg.learning_rate,
            strong_convexity=a.strong_convexity,
            smoothness=a.smoothness,
            dataset_size=cfg.dataset_size,
            batch_size=cfg.batch_size,
        ),
        "diameter_ratio": shifted_interpolation.diameter_in_noise_units(
            a.diameter,
            batch_size=cfg.batch_size,
            learning_rate=cfg.learning_rate,
            noise_multiplier=cfg.noise_multiplier,
            clip_norm=cfg.clip_norm,
        ),
    }


def _si_full_batch(cfg, a) -> GaussianMixtureProfile:
    return GaussianMixtureProfile.gaussian(shifted_interpolation.full_batch_mu(steps=cfg.steps, **_si_inputs(cfg, a)))


def _si_cyclic(cfg, a) -> GaussianMixtureProfile:
    mu = shifted_interpolation.cyclic_mu(steps_per_epoch=cfg.steps_per_epoch, steps=cfg.steps, **_si_inputs(cfg, a))
    return GaussianMixtureProfile.gaussian(mu)


def _si_shuffle(cfg, a) -> GaussianMixtureProfile:
    weights, mus = shifted_interpolation.shuffle_once_profile(
        dataset_size=cfg.dataset_size, batch_size=cfg.batch_size, steps=cfg.steps, **_si_inputs(cfg, a)
    )
    return GaussianMixtureProfile.mixture(weights, mus)


def _si_reshuffle(cfg, a) -> GaussianMixtureProfile:
    weights, mus = shifted_interpolation.reshuffle_profile(
        dataset_size=cfg.dataset_size, batch_size=cfg.batch_size, steps=cfg.steps, **_si_inputs(cfg, a)
    )
    return GaussianMixtureProfile.mixture(weights, mus)


def _si_random_batch(cfg, a) -> GaussianMixtureProfile:
    c = membership_mixtures.step_contraction(
        cfg.batch_size,
        learning_rate=cfg.learning_rate,
        strong_convexity=a.strong_convexity,
        smoothness=a.smoothness,
        batch_size=cfg.batch_size,
        l2_outside_clip=a.l2_outside_clip,
    )
    return membership_mixtures.membership_profile(
        step_mu=shifted_interpolation.replace_one_step_mu(cfg.noise_multiplier),
        contraction=c,
        use_probability=cfg.sampling_probability,
        steps=cfg.steps,
    )


def _poisson_events(cfg: TrainingConfig, a: LossAssumptions):
    return _poisson_events_of(**_poisson_inputs(cfg, a))


@functools.lru_cache(maxsize=256)
def _poisson_events_of(**inputs) -> tuple[tuple[float, float], ...]:
    # keyed on every input of poisson_size_events; its binomial-tail bisections cost ~35 ms, asked by the
    # applicability of both Poisson rows at every evaluation (a calibration evaluates dozens)
    return tuple(membership_mixtures.poisson_size_events(**inputs))


def _poisson_inputs(cfg: TrainingConfig, a: LossAssumptions) -> dict:
    return {
        "dataset_size": cfg.dataset_size,
        "batch_size": cfg.batch_size,
        "sampling_probability": cfg.sampling_probability,
        "steps": cfg.steps,
        "learning_rate": cfg.learning_rate,
        "strong_convexity": a.strong_convexity,
        "smoothness": a.smoothness,
        "l2_outside_clip": a.l2_outside_clip,
    }


def _si_poisson(cfg, a) -> dominating_mixture.DominatingMixtureProfile:
    # each pattern's run against the run without the record: shift C per use (the divisor b is fixed);
    # the patterns mixed against that one law (add-or-remove), or through it (replace-one): section 25
    return dominating_mixture.poisson_profile(
        step_mu=shifted_interpolation.replace_one_step_mu(cfg.noise_multiplier) / 2.0,
        sampling_probability=cfg.sampling_probability,
        steps=cfg.steps,
        events=list(_poisson_events(cfg, a)),
        reflected=cfg.relation is Relation.REPLACE_ONE,
    )


def _poisson_sizes_contract(cfg: TrainingConfig, a: LossAssumptions):
    # only Poisson sampling has random batch sizes; a row with this condition fails any other scheme on its sampling
    if cfg.sampling is not Sampling.POISSON or cfg.learning_rate is None or a.smoothness is None:
        return None
    if _poisson_events(cfg, a):
        return None
    return (
        "a step non-expansive (c <= 1) for every batch size between the low tail quantile and b + 1",
        f"learning_rate={cfg.learning_rate:g} expands at batch size b + 1 = {cfg.batch_size + 1}",
        "the Poisson bounds condition on the batch sizes staying in a range (its complement's probability, "
        "at most 1e-12 unless the step size forces a narrower range, is added to delta) and need every step "
        "there to be a contraction; see docs/decisions.md",
    )


def _profile_rdp(profile: ProfileFunction) -> RdpFunction:
    def rdp(cfg, a, orders):
        return profile(cfg, a).rdp(orders)

    return rdp


def _liang_expansion(cfg, a) -> float:
    # the larger neighbouring dataset has n + 1 examples, all of which a Poisson batch can hold
    return liang.step_expansion(cfg.learning_rate, a.smoothness, cfg.dataset_size + 1, cfg.batch_size)


def _liang_bounded_lower(cfg, a, delta: float, beat: float = math.inf) -> float:
    return liang.bounded_lower_epsilon(delta, expansion=_liang_expansion(cfg, a), **_domain_inputs(cfg, a))


def _liang_bounded(cfg, a, orders):
    return liang.bounded_rdp(orders, **_domain_inputs(cfg, a), expansion=_liang_expansion(cfg, a))


def _liang_unbounded(cfg, a, orders):
    return liang.unbounded_rdp(
        orders, sampling_probability=cfg.sampling_probability, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps
    )


def _rho(cfg: TrainingConfig, a: LossAssumptions) -> float:
    return ye_shokri.contraction(cfg.learning_rate, a.strong_convexity)


def _last_batch_fraction(cfg: TrainingConfig) -> float:
    """r/b, r = n - (l-1) b the size of the last batch of an epoch (1 when b divides n)."""
    return (cfg.dataset_size - (cfg.steps_per_epoch - 1) * cfg.batch_size) / cfg.batch_size


def _ye_shokri_cyclic(cfg, a, orders):
    return ye_shokri.cyclic_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        steps_per_epoch=cfg.steps_per_epoch,
        epochs=cfg.epochs_started,
        contraction=_rho(cfg, a),
        last_batch_fraction=_last_batch_fraction(cfg),
    )


def _ye_shokri_shuffle(cfg, a, orders):
    return ye_shokri.shuffle_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        steps_per_epoch=cfg.steps_per_epoch,
        epochs=cfg.epochs_started,
        contraction=_rho(cfg, a),
        last_batch_fraction=_last_batch_fraction(cfg),
    )


def _ye_shokri_random(cfg, a, orders, **end):
    return ye_shokri.random_batch_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        sampling_probability=cfg.sampling_probability,
        steps=cfg.steps,
        contraction=_rho(cfg, a),
        **end,
    )


# the recursion's lower end at a loose tolerance: below the curve at every order (decisions.md 22, part 5)
_ye_shokri_random_lower = functools.partial(_ye_shokri_random, tolerance=1e-2, lower_end=True)


def _ye_shokri_convex(cfg, a, orders):
    return ye_shokri.convex_rdp(
        orders, noise_multiplier=cfg.noise_multiplier, steps_per_epoch=cfg.steps_per_epoch, epochs=cfg.epochs_started
    )


def _ye_shokri_full_batch(cfg, a, orders):
    return ye_shokri.full_batch_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        epochs=cfg.steps,  # b = n: every step is an epoch
        learning_rate=cfg.learning_rate,
        strong_convexity=a.strong_convexity,
    )


def _composition(cfg, a, orders):
    if cfg.sampling is Sampling.POISSON:
        return composition.poisson_rdp(
            orders,
            sampling_probability=cfg.sampling_probability,
            noise_multiplier=cfg.noise_multiplier,
            steps=cfg.steps,
        )
    if cfg.sampling is Sampling.RANDOM_BATCH:
        return composition.random_batch_rdp(
            orders,
            dataset_size=cfg.dataset_size,
            batch_size=cfg.batch_size,
            noise_multiplier=cfg.noise_multiplier,
            steps=cfg.steps,
        )
    return composition.epoch_rdp(orders, noise_multiplier=cfg.noise_multiplier, epochs=cfg.epochs_started)


def _pld_steps(cfg: TrainingConfig, a: LossAssumptions):
    if cfg.steps > baselines.PLD_MAX_STEPS:
        return (
            f"steps must be <= {baselines.PLD_MAX_STEPS:.0e}",
            f"{cfg.steps}",
            "the composed privacy loss distribution is held in memory; beyond, the Renyi-DP composition remains",
        )
    return None


# ---------------------------------------------------------------- provenance: leaving a published statement


def _glm_route(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    return "the linear-model route, docs/decisions.md section 15" if a.clipped_loss_convex_smooth else None


def _l2_outside(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    return "an l2 term outside the clip, section 15 part 4" if a.l2_outside_clip else None


def _projected(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    return "a projection the theorem does not have, sections 7 and 14" if a.diameter is not None else None


def _short_last_batch(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    short = cfg.dataset_size % cfg.batch_size
    return f"a short last batch of {short}, section 11" if short else None


def _partial_epoch(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    return "a partial last epoch, section 7" if cfg.steps % cfg.steps_per_epoch else None


def _clipping_may_be_active(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    return None if a.update_is_gradient_step else "clipping may be active: the constant sqrt(2) L_eta, section 3"


_FIXED_BATCH_OUTSIDE = (_short_last_batch, _partial_epoch, _projected, _l2_outside, _glm_route)
_FUZZ = "benchmarks/fuzz_1000.json"
_FUZZ_MEMBERSHIP = "benchmarks/fuzz_1000_membership.json"
#: both Poisson rows (add-or-remove and replace-one) rest on the same derivation
_POISSON_PROVENANCE = Provenance(
    derived="docs/decisions.md sections 19 and 25 (per-pattern shifted interpolation, batch sizes conditioned; the "
    "patterns mixed against the run without the record); checks: exact instances "
    "(tests/core/bounds/test_membership_mixtures.py, tests/core/bounds/test_dominating_mixture.py), fuzzing "
    f"({_FUZZ_MEMBERSHIP}), an independent re-derivation of section 19"
)

# ---------------------------------------------------------------- the table


def _covers(schemes, relation=Relation.REPLACE_ONE) -> dict[Sampling, Relation]:
    return {s: relation for s in schemes}


# Citations users can follow (authors, year, arXiv id); theorem numbers follow the
# arXiv versions named here.
KONG_RIBERO = "Kong & Ribero 2024, arXiv 2407.05237"
ALTSCHULER_TALWAR = "Altschuler & Talwar 2022, arXiv 2205.13710"
LIANG = "Liang, Zhang, He, Wu & Xing 2025, arXiv 2502.17772"
YE_SHOKRI = "Ye & Shokri 2022, arXiv 2203.05363"
BOK_SU_ALTSCHULER = "Bok, Su & Altschuler 2024, arXiv 2403.00278"
DOCS = "docs/bounds.md"

_SMOOTH_WEAK = "per-example losses m-weakly convex and M-smooth (upper curvature M)"
_WITHIN_CLIP = (
    "every per-example gradient norm <= C on the whole domain (gradient_norms_within_clip=True) or the "
    "scalar-GLM route (clipped_loss_convex_smooth=True)"
)
_CONTRACTING = (
    _needs_learning_rate,
    _needs_smoothness,
    _needs_strong_convexity,
    _needs_inactive_clipping,
    _steps_per_epoch_at_least_two,
)

_AT_UNPROVEN = Proof(
    False,
    "the proof of Theorem 3.1 (step 3b) conditions on the differing example's noise, which changes the law of "
    "the batch indicators for the other dataset; the published form is below the exact divergence on the "
    "paper's own projected 1-D walk (D = 0.01, z = 0.5, q = 0.1, T = 1..5). This sampled-Gaussian form has "
    "never been observed below the truth, but nothing proves it (docs/decisions.md). Use bounded-domain-random.",
)

_CONVEX_UNCLIPPED = (
    _needs_learning_rate,
    _needs_smoothness,
    _needs_convexity,
    _needs_inactive_clipping,
    _non_expansive_step,
)
_POISSON_CONVEX_UNCLIPPED = (
    _needs_learning_rate,
    _needs_smoothness,
    _needs_convexity,
    _needs_inactive_clipping,
    _poisson_sizes_contract,
)
_POISSON_SI_ASSUMES = (
    f"per-example losses convex (lam-strongly convex, lam >= 0) and M-smooth; {_WITHIN_CLIP}; the sum of "
    "clipped gradients is divided by the fixed b (Opacus: the expected batch size); contraction over the "
    "batch sizes of a range around b (l2_outside_clip=True: lam does not grow with the batch size); each "
    "example joins each step independently with probability q = b/n, from a secret seed"
)
_SI_ASSUMES = (
    f"per-example losses convex (lam-strongly convex, lam >= 0) and M-smooth; eta <= 2/M; {_WITHIN_CLIP}; "
    "contraction c = max(|1 - eta*lam*r/b|, |1 - eta*M*r/b|) over the batch sizes r of a pass; optional "
    "projection onto a convex set of diameter D"
)

_TABLE: tuple[BoundSpec, ...] = (
    BoundSpec(
        id="kong-ribero-cyclic",
        provenance=Provenance(
            published="Kong & Ribero 2024 (arXiv 2407.05237), Theorem 2.3",
            derived="docs/decisions.md section 15 (the linear-model route: the clipped update is a gradient step); "
            f"checks: exact instances G1-G3 (tests/core/verification/test_ground_truth.py), fuzzing ({_FUZZ})",
            outside_published=(_glm_route,),
        ),
        title="cyclic traversal, weakly convex smooth losses",
        reference=f"{KONG_RIBERO}, Theorem 2.3",
        covers=_covers(FIXED_BATCH_SCHEMES),
        assumptions=f"{_SMOOTH_WEAK}; eta <= 1/(2(M+m)) (1/(M+m) if {_WITHIN_CLIP})",
        conditions=(_needs_learning_rate, _needs_smoothness, _kong_ribero_step),
        compute=_kong_ribero_cyclic,
        linear_in_order=True,
    ),
    BoundSpec(
        id="kong-ribero-bounded",
        provenance=Provenance(
            published="Kong & Ribero 2024 (arXiv 2407.05237), Theorem 2.2, with clipping never active",
            derived="docs/decisions.md sections 1, 3 and 5 (the Lipschitz constant of the clipped update, Prop. "
            "2.1(b), where the statement uses L_eta); checks: exact instances G1-G3 "
            "(tests/core/verification/test_ground_truth.py), "
            f"fuzzing ({_FUZZ}, {_FUZZ_MEMBERSHIP})",
            outside_published=(_clipping_may_be_active, _glm_route),
        ),
        title="bounded domain, weakly convex smooth losses, independent of T",
        reference=f"{KONG_RIBERO}, Theorem 2.2",
        covers=_covers(AT_MOST_B_SCHEMES),
        assumptions=f"{_SMOOTH_WEAK}; projection onto a convex set of diameter D; step size as kong-ribero-cyclic",
        conditions=(_needs_learning_rate, _needs_smoothness, _needs_diameter, _kong_ribero_step),
        compute=_kong_ribero_bounded,
        linear_in_order=True,
    ),
    BoundSpec(
        id="kong-ribero-curvature-free",
        provenance=Provenance(published="Kong & Ribero 2024 (arXiv 2407.05237v1), Theorem 4.3"),
        title="no assumption on the losses (always worse than composition)",
        reference="Kong & Ribero 2024, arXiv 2407.05237v1, Theorem 4.3",
        covers=_covers(AT_MOST_B_SCHEMES),
        assumptions="clipped per-example gradients only",
        conditions=(),
        compute=_kong_ribero_curvature_free,
        linear_in_order=True,
    ),
    BoundSpec(
        id="altschuler-talwar",
        provenance=Provenance(
            published="Altschuler & Talwar, NeurIPS 2022 (arXiv 2205.13710), eq. 3.6 (its proof has a gap)"
        ),
        title="bounded domain, convex smooth losses, sampled batches (unproven)",
        reference=f"{ALTSCHULER_TALWAR}, eq. 3.6; strongly convex: eq. 5.3, Remark 5.3",
        covers=_covers((Sampling.RANDOM_BATCH, Sampling.POISSON)),
        assumptions="per-example losses convex and M-smooth; eta <= 2/M (poisson: 2b/(nM)); projection onto a "
        f"convex set of diameter D; {_WITHIN_CLIP}",
        conditions=(
            _needs_learning_rate,
            _needs_smoothness,
            _needs_diameter,
            _needs_convexity,
            _needs_inactive_clipping,
            _non_expansive_step,
        ),
        compute=_altschuler_talwar,
        proof=_AT_UNPROVEN,
    ),
    BoundSpec(
        id="bounded-domain-random",
        provenance=Provenance(
            derived="docs/decisions.md section 10 (Feldman, Mironov, Talwar & Thakurta 2018, Lemmas 20-21, per batch "
            "sequence, averaged over the batches); checks: exact instances G3 "
            "(tests/core/bounds/test_bounded_domain.py), "
            f"fuzzing ({_FUZZ}, {_FUZZ_MEMBERSHIP})"
        ),
        title="bounded domain, convex smooth losses, random or Poisson batches",
        reference="Feldman, Mironov, Talwar & Thakurta 2018, arXiv 1808.06651, Lemmas 20-21, per fixed batch "
        f"sequence ({ALTSCHULER_TALWAR}, Prop. 3.2 and 5.6), mixed over batch sequences by joint convexity "
        f"({YE_SHOKRI}, Lemma 4.1); derivation in docs/decisions.md",
        covers=_covers((Sampling.RANDOM_BATCH, Sampling.POISSON)),
        assumptions="per-example losses convex and M-smooth; eta <= 2/M (poisson: 2b/(nM)); projection onto a "
        f"convex set of diameter D after every step; {_WITHIN_CLIP}; batches drawn independently of the data",
        conditions=(*_CONVEX_UNCLIPPED, _needs_diameter),
        compute=_bounded_domain_random,
    ),
    BoundSpec(
        id="liang-bounded",
        provenance=Provenance(
            derived="docs/decisions.md sections 1, 2 and 12 (Liang et al. 2025, arXiv 2502.17772, Theorem 3.4, "
            "corrected: the exact sampled-Gaussian term with sensitivity C, the expansion of Poisson batches); "
            f"checks: exact instances G1 and G3 (tests/core/bounds/test_liang.py), fuzzing ({_FUZZ})"
        ),
        title="bounded domain, smooth (non-convex) losses, Poisson sampling",
        reference=f"{LIANG}, Theorem 3.4",
        covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
        assumptions="per-example losses M-smooth; projection onto a convex set of diameter D; step expansion "
        "1 + eta*M*n/b (worst-case Poisson batch)",
        conditions=(_needs_learning_rate, _needs_smoothness, _needs_diameter),
        compute=_liang_bounded,
        lower_estimate=_liang_bounded_lower,
    ),
    BoundSpec(
        id="liang-unbounded",
        provenance=Provenance(
            derived="docs/decisions.md sections 2 and 12 (Liang et al. 2025, arXiv 2502.17772, Theorem 3.3, "
            "corrected: the exact sampled-Gaussian term with sensitivity C); checks: exact instances G1 "
            f"(tests/core/bounds/test_liang.py), fuzzing ({_FUZZ})"
        ),
        title="smooth losses, Poisson sampling (composition in disguise)",
        reference=f"{LIANG}, Theorem 3.3",
        covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
        assumptions="per-example losses M-smooth",
        conditions=(_needs_smoothness,),
        compute=_liang_unbounded,
    ),
    BoundSpec(
        id="ye-shokri-cyclic",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem 3.3",
            derived="docs/decisions.md sections 3, 7, 11 and 15 (a short last batch, a partial last epoch, a "
            "projection, the linear-model route); checks: exact instances G2 (tests/core/bounds/test_ye_shokri.py), "
            f"fuzzing ({_FUZZ})",
            outside_published=_FIXED_BATCH_OUTSIDE,
        ),
        title="strongly convex, fixed batches (any fixed partition)",
        reference=f"{YE_SHOKRI}, Theorem 3.3",
        covers=_covers(FIXED_BATCH_SCHEMES),
        assumptions=f"per-example losses lam-strongly convex and M-smooth; eta < 2/(lam+M); {_WITHIN_CLIP}; "
        "a short last batch of r examples contracts only by 1 - eta*lam*r/b (docs/decisions.md)",
        conditions=(*_CONTRACTING, _ye_shokri_step),
        compute=_ye_shokri_cyclic,
        linear_in_order=True,
    ),
    BoundSpec(
        id="ye-shokri-shuffle",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem 4.2",
            derived="docs/decisions.md sections 3, 7, 11 and 15 (a short last batch, a partial last epoch, a "
            "projection, the linear-model route); checks: exact instances G2 (tests/core/bounds/test_ye_shokri.py), "
            f"fuzzing ({_FUZZ})",
            outside_published=_FIXED_BATCH_OUTSIDE,
        ),
        title="strongly convex, shuffle once and partition",
        reference=f"{YE_SHOKRI}, Theorem 4.2",
        covers=_covers((Sampling.SHUFFLE_ONCE,)),
        assumptions="as ye-shokri-cyclic; the permutation is drawn once, at random, and kept secret",
        conditions=(*_CONTRACTING, _ye_shokri_step),
        compute=_ye_shokri_shuffle,
    ),
    BoundSpec(
        id="ye-shokri-random",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem 4.3",
            derived="docs/decisions.md sections 7 and 15 (a projection, the linear-model route); checks: exact "
            f"instances G2 (tests/core/verification/test_ground_truth.py), fuzzing ({_FUZZ}, {_FUZZ_MEMBERSHIP})",
            outside_published=(_projected, _l2_outside, _glm_route),
        ),
        title="strongly convex, random batch of size b every step",
        reference=f"{YE_SHOKRI}, Theorem 4.3",
        covers=_covers((Sampling.RANDOM_BATCH,)),
        assumptions=f"per-example losses lam-strongly convex and M-smooth; eta < 2/(lam+M); {_WITHIN_CLIP}",
        conditions=(*_CONTRACTING, _ye_shokri_step),
        compute=_ye_shokri_random,
        estimate_curve=_ye_shokri_random_lower,
    ),
    BoundSpec(
        id="ye-shokri-convex",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem D.4",
            derived="docs/decisions.md sections 7, 11 and 15 (a short last batch, a partial last epoch, a "
            f"projection, the linear-model route); checks: exact instances G1 and G2, fuzzing ({_FUZZ})",
            outside_published=_FIXED_BATCH_OUTSIDE,
        ),
        title="convex, fixed batches",
        reference=f"{YE_SHOKRI}, Theorem D.4",
        covers=_covers(FIXED_BATCH_SCHEMES),
        assumptions=f"per-example losses convex and M-smooth; eta < 2/M; {_WITHIN_CLIP}",
        conditions=(
            _needs_learning_rate,
            _needs_smoothness,
            _needs_convexity,
            _needs_inactive_clipping,
            _two_over_m_strict,
        ),
        compute=_ye_shokri_convex,
        linear_in_order=True,
    ),
    BoundSpec(
        id="ye-shokri-full-batch",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem D.6",
            derived="docs/decisions.md sections 7 and 15 (a projection, the linear-model route); checks: exact "
            f"instances G2, fuzzing ({_FUZZ}, {_FUZZ_MEMBERSHIP})",
            outside_published=(_projected, _l2_outside, _glm_route),
        ),
        title="convex, full-batch gradient descent",
        reference=f"{YE_SHOKRI}, Theorem D.6",
        covers=_covers(ALL_SCHEMES),
        assumptions="b = n; per-example losses convex (lam-strongly convex, lam >= 0) and M-smooth; eta < 1/M; "
        + _WITHIN_CLIP,
        conditions=(
            _full_batch,
            _needs_learning_rate,
            _needs_smoothness,
            _needs_convexity,
            _needs_inactive_clipping,
            _one_over_m_strict,
        ),
        compute=_ye_shokri_full_batch,
        linear_in_order=True,
    ),
    BoundSpec(
        id="shifted-interpolation-full-batch",
        provenance=Provenance(
            published="Bok, Su & Altschuler, ICML 2024 (arXiv 2403.00278), section 4 (NoisyGD)",
            derived="docs/decisions.md section 14, parts 1-2 (re-derived from f-DP composition; projected restarts; "
            "the linear-model route); checks: exact on the quadratic G2, fuzzing "
            f"({_FUZZ}, {_FUZZ_MEMBERSHIP})",
            outside_published=(_projected, _l2_outside, _glm_route),
        ),
        title="f-DP, full-batch noisy gradient descent (exact for strongly convex losses)",
        reference=f"{BOK_SU_ALTSCHULER}, section 4 (shifted interpolation, mu-GDP); derivation in docs/decisions.md",
        covers=_covers(ALL_SCHEMES),
        assumptions="b = n; " + _SI_ASSUMES,
        conditions=(_full_batch, *_CONVEX_UNCLIPPED),
        compute=_profile_rdp(_si_full_batch),
        profile=_si_full_batch,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-cyclic",
        provenance=Provenance(
            published="Bok, Su & Altschuler, ICML 2024 (arXiv 2403.00278), section 4 (NoisyCGD)",
            derived="docs/decisions.md section 14, parts 1 and 3 (re-derived from f-DP composition; a short last "
            "batch, a partial last pass, projected restarts, the linear-model route); checks: exact instances G2 "
            f"(tests/core/bounds/test_shifted_interpolation.py), fuzzing ({_FUZZ})",
            outside_published=_FIXED_BATCH_OUTSIDE,
        ),
        title="f-DP, fixed-order batches, worst position of the differing example",
        reference=f"{BOK_SU_ALTSCHULER}, section 4 (noisy cyclic GD, mu-GDP); derivation in docs/decisions.md",
        covers=_covers(FIXED_BATCH_SCHEMES),
        assumptions=_SI_ASSUMES,
        conditions=_CONVEX_UNCLIPPED,
        compute=_profile_rdp(_si_cyclic),
        profile=_si_cyclic,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-shuffle",
        provenance=Provenance(
            derived="docs/decisions.md section 14, part 4 (per-position mu-GDP averaged by joint convexity); checks: "
            f"exact instances G2 (tests/core/bounds/test_shifted_interpolation.py), fuzzing ({_FUZZ})"
        ),
        title="f-DP, one secret random permutation: privacy profiles averaged over positions",
        reference=f"our extension of {BOK_SU_ALTSCHULER}, section 4: per-position mu-GDP averaged by joint "
        "convexity of the hockey-stick divergence; derivation in docs/decisions.md",
        covers=_covers((Sampling.SHUFFLE_ONCE,)),
        assumptions=_SI_ASSUMES + "; the permutation is drawn once, uniformly at random, and kept secret",
        conditions=_CONVEX_UNCLIPPED,
        compute=_profile_rdp(_si_shuffle),
        profile=_si_shuffle,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-reshuffle",
        provenance=Provenance(
            derived="docs/decisions.md section 17 (a schedule mixture); checks: exact instances "
            "(tests/core/bounds/test_shift_schedules.py), an independent re-derivation"
        ),
        title="f-DP, a fresh secret permutation every epoch: schedule mixture over the last epoch's position",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): earlier "
        "epochs at their worst position, the last epoch's position averaged by joint convexity of the "
        "hockey-stick divergence; derivation in docs/decisions.md",
        covers=_covers((Sampling.RESHUFFLE,)),
        assumptions=_SI_ASSUMES + "; a new permutation every epoch, drawn uniformly at random and kept secret",
        conditions=_CONVEX_UNCLIPPED,
        compute=_profile_rdp(_si_reshuffle),
        profile=_si_reshuffle,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-random-batch",
        provenance=Provenance(
            derived="docs/decisions.md section 19 (a schedule mixture over the memberships); checks: exact instances "
            "(tests/core/bounds/test_membership_mixtures.py), "
            f"fuzzing ({_FUZZ_MEMBERSHIP}), an independent re-derivation"
        ),
        title="f-DP, a fresh random batch of b every step: schedule mixture over the memberships",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): an "
        "allocation whose cost is a sum of independent block terms, its exact law on a lattice (rounded up), "
        "averaged by joint convexity of the hockey-stick divergence; derivation in docs/decisions.md",
        covers=_covers((Sampling.RANDOM_BATCH,)),
        assumptions=_SI_ASSUMES + "; every step draws b of the n examples without replacement, independently, "
        "from a secret seed",
        conditions=_CONVEX_UNCLIPPED,
        compute=None,  # its truncated tails: no Renyi curve (docs/decisions.md, section 19, part 3)
        profile=_si_random_batch,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-poisson",
        provenance=_POISSON_PROVENANCE,
        title="f-DP, Poisson sampling, add-or-remove (Opacus' default): schedule mixture over the memberships",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): every "
        "membership pattern against the run without the record, the patterns' tradeoff functions averaged "
        "(a one-dimensional Gaussian mixture against N(0, 1): amplification by subsampling kept), with the "
        "batch sizes conditioned on a range whose complement's probability is added to delta; derivation in "
        "docs/decisions.md",
        covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
        assumptions=_POISSON_SI_ASSUMES,
        conditions=_POISSON_CONVEX_UNCLIPPED,
        compute=None,  # its truncated tails: no Renyi curve (docs/decisions.md, section 19, part 3)
        profile=_si_poisson,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-poisson-replace-one",
        provenance=_POISSON_PROVENANCE,
        title="f-DP, Poisson sampling, replace-one: schedule mixture over the memberships",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): both "
        "worlds compared through the run without the record (a one-dimensional Gaussian mixture against its "
        "reflection: amplification by subsampling kept), with the "
        "batch sizes conditioned on a range whose complement's probability is added to delta; derivation in "
        "docs/decisions.md",
        covers=_covers((Sampling.POISSON,)),
        assumptions=_POISSON_SI_ASSUMES,
        conditions=_POISSON_CONVEX_UNCLIPPED,
        compute=None,  # its truncated tails: no Renyi curve (docs/decisions.md, section 19, part 3)
        profile=_si_poisson,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="composition",
        provenance=Provenance(
            published="Mironov 2017 (arXiv 1702.07476); Mironov, Talwar & Zhang 2019 (arXiv 1908.10530); Wang, "
            "Balle & Kasiviswanathan 2019 (arXiv 1808.00087): the (sampled) Gaussian mechanism's RDP, composed"
        ),
        title="standard composition over all steps (certifies every iterate)",
        reference="Gaussian / sampled Gaussian mechanism composed over all steps (Mironov 2017, arXiv 1702.07476; "
        "Mironov, Talwar & Zhang 2019, arXiv 1908.10530; Wang, Balle & Kasiviswanathan 2019, arXiv 1808.00087), "
        "computed as dp-accounting's RdpAccountant does",
        covers={
            **_covers(EPOCH_SCHEMES),
            Sampling.RANDOM_BATCH: Relation.REPLACE_ONE,
            Sampling.POISSON: Relation.ADD_OR_REMOVE_ONE,
        },
        assumptions="none beyond clipping",
        conditions=(),
        compute=_composition,
        protects=Protects.EVERY_ITERATE,
    ),
    BoundSpec(
        id="composition-gdp-epochs",
        provenance=Provenance(
            published="Dong, Roth & Su 2019 (arXiv 1905.02383), Cor. 3.3: Gaussian mechanisms composed exactly, "
            "one per epoch"
        ),
        title="one Gaussian mechanism per epoch, composed exactly in mu-GDP (certifies every iterate)",
        reference="exact composition of ceil(T/l) Gaussian mechanisms of shift 2/z: mu = 2 sqrt(ceil(T/l))/z "
        "(Dong, Roth & Su 2019, arXiv 1905.02383, Cor. 3.3), converted exactly; docs/decisions.md section 18",
        covers=_covers(EPOCH_SCHEMES),
        assumptions="every example in at most one batch per epoch; clipping only",
        conditions=(),
        compute=_profile_rdp(baselines.epoch_gdp_profile),
        profile=baselines.epoch_gdp_profile,
        protects=Protects.EVERY_ITERATE,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="composition-pld-poisson",
        provenance=Provenance(
            published="Zhu, Dong & Wang 2022 (arXiv 2106.08567); Doroshenko et al. 2022 (arXiv 2207.04380): "
            "dp-accounting's PLD of the Poisson-sampled Gaussian"
        ),
        title="Poisson-sampled Gaussian composed by dp-accounting's privacy loss distribution (every iterate)",
        reference="dp-accounting's PLDAccountant on PoissonSampledDpEvent(q, GaussianDpEvent(z)) x T (Zhu, Dong & "
        "Wang 2022, arXiv 2106.08567; Doroshenko et al. 2022, arXiv 2207.04380): interval 1e-4, pessimistic; "
        "figures per dp-accounting version; docs/decisions.md section 18",
        covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
        assumptions="clipping only; every example joins every step independently with probability q = b/n",
        conditions=(_pld_steps,),
        compute=None,
        profile=baselines.poisson_pld_profile,
        protects=Protects.EVERY_ITERATE,
        kind=Kind.PLD,
        lower_estimate=baselines.poisson_pld_lower_epsilon,
    ),
    BoundSpec(
        id="composition-pld-poisson-replace-one",
        provenance=Provenance(
            derived="docs/decisions.md section 18, part 3 (our dominating pair, proven for every epsilon); checks: "
            f"the theorem on random configurations and exact at T = 1 (tests/core/test_baselines.py), fuzzing "
            f"({_FUZZ_MEMBERSHIP})"
        ),
        title="Poisson-sampled Gaussian under replace-one: a dominating pair composed as a privacy loss "
        "distribution (every iterate)",
        reference="our dominating pair ((1-q)N(0,1) + qN(1/z,1), (1-q)N(0,1) + qN(-1/z,1)), proven for every "
        "epsilon at once (docs/decisions.md section 18), composed by dominating-pair composition (Zhu, Dong & "
        "Wang 2022, arXiv 2106.08567, Thm 10) in dp-accounting's PLD: interval 1e-4, pessimistic; figures per "
        "dp-accounting version",
        covers=_covers((Sampling.POISSON,)),
        assumptions="clipping only; every example joins every step independently with probability q = b/n",
        conditions=(_pld_steps,),
        compute=None,
        profile=baselines.poisson_pld_profile,
        protects=Protects.EVERY_ITERATE,
        kind=Kind.PLD,
        lower_estimate=baselines.poisson_pld_lower_epsilon,
    ),
    BoundSpec(
        id="composition-pld-random-batch",
        provenance=Provenance(
            published="Dong, Roth & Su 2019 (arXiv 1905.02383), Thm 4.2 (sampling without replacement: "
            "C_p(f)) and Thm 3.2 (adaptive composition), composed as a dominating pair (Zhu, Dong & Wang 2022, "
            "arXiv 2106.08567, Thm 10)",
            derived="docs/decisions.md section 18, part 4 (re-derived: the coupling, both orders as one pair); "
            "checks: every batch enumerated on linear instances, attained at T = 1 "
            "(tests/core/test_random_batch_pld.py), fuzzing (300 checks)",
        ),
        title="fixed-size random batches under replace-one: a dominating pair composed as a privacy loss "
        "distribution (every iterate)",
        reference="our dominating pair of one step of sampling without replacement: at every epsilon the larger "
        "of the remove and add profiles of the Poisson-sampled Gaussian at rate b/n and noise multiplier z/2 "
        "(tradeoff conv(min(f, f^-1)), Dong, Roth & Su 2019, arXiv 1905.02383, Thm 4.2), composed by "
        "dominating-pair composition (Zhu, Dong & Wang 2022, arXiv 2106.08567, Thm 10) in dp-accounting's PLD: "
        "interval 1e-4, pessimistic; derivation in docs/decisions.md section 18",
        covers=_covers((Sampling.RANDOM_BATCH,)),
        assumptions="clipping only; every step a uniformly random batch of exactly b of the n examples, drawn "
        "without replacement, independently across steps",
        conditions=(_pld_steps,),
        compute=None,
        profile=baselines.random_batch_pld_profile,
        protects=Protects.EVERY_ITERATE,
        kind=Kind.PLD,
        lower_estimate=baselines.random_batch_pld_lower_epsilon,
    ),
)

_missing = [spec.id for spec in _TABLE if spec.provenance is None]
if _missing:  # a defect of ours: every row says where its proof comes from
    raise RuntimeError(f"internal error: rows without a provenance: {_missing}")

#: bound id -> its row. Read-only.
BOUNDS: Mapping[str, BoundSpec] = types.MappingProxyType({spec.id: spec for spec in _TABLE})

BOUND_IDS: tuple[str, ...] = (*BOUNDS, BEST)


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


def _checked(spec: BoundSpec, values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    if np.isnan(values).any() or (values < 0).any():  # a defect of ours, never a user's error
        raise RuntimeError(f"internal error: {spec.id} produced an invalid RDP value: {values}")
    return values
