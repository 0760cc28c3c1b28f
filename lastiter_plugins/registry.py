r"""Which bound applies to which pipeline: the dispatch table.

One :class:`BoundSpec` per bound id: the sampling schemes it covers (with the
neighbouring relation it is proven for), the conditions it needs (each a small
function returning what is violated, or None), and the function computing it.
This is the single place where DP-SGD hyperparameters are mapped to the papers'
symbols (BOUNDS.md section 1). Decisions that deviate from, or sharpen,
BOUNDS.md are marked "Decision" and listed in docs/bounds.md.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

import numpy as np

from lastiter_plugins.bounds import altschuler_talwar, composition, kong_ribero, liang, ye_shokri
from lastiter_plugins.config import LossAssumptions, Relation, Sampling, TrainingConfig
from lastiter_plugins.errors import NotApplicableError

# A condition returns None when it holds, else (what is required, what was found).
Condition = Callable[[TrainingConfig, LossAssumptions], "tuple[str, str] | None"]
RdpFunction = Callable[[TrainingConfig, LossAssumptions, np.ndarray], np.ndarray]

ALL_SCHEMES = tuple(Sampling)
EPOCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE)
FIXED_BATCH_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE)
# Decision (audit of seed 003 Prop. 2.1): with Poisson sampling the batch can be
# larger than the b it is divided by, so the step acts like eta*|B|/b and the
# Lipschitz and sensitivity constants of Kong & Ribero's proofs fail. Their
# "any sampling" bounds therefore cover every scheme with batches of at most b.
AT_MOST_B_SCHEMES = (Sampling.CYCLIC, Sampling.SHUFFLE_ONCE, Sampling.RESHUFFLE, Sampling.RANDOM_BATCH)


@dataclasses.dataclass(frozen=True)
class BoundSpec:
    """One row of the dispatch table."""

    id: str
    title: str
    reference: str
    covers: Mapping[Sampling, Relation]
    assumptions: str
    conditions: tuple[Condition, ...]
    compute: RdpFunction
    last_iterate: bool = True

    @property
    def relations(self) -> frozenset[Relation]:
        return frozenset(self.covers.values())

    def relation_for(self, sampling: Sampling) -> Relation | None:
        return self.covers.get(sampling)


@dataclasses.dataclass(frozen=True)
class Applicability:
    """Whether a bound applies to a pipeline, and if not, every reason why."""

    bound: str
    applies: bool
    reasons: tuple[str, ...]
    relation: Relation | None
    reference: str

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
            "diameter (D) must be declared: every step must project the parameters onto a convex set of that diameter",
            "no projection",
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
    # Decision (audit of seed 004): the rho-contraction of Lemma D.3 holds for
    # the gradient step, not for the clipped one (a clipped field is bounded,
    # hence not strongly monotone; counterexamples exist), so these bounds need
    # the user's assertion that clipping is never active.
    if a.clipping_may_be_active:
        return (
            "clipping must be declared inactive (gradient_norms_within_clip=True: every per-example gradient norm <= C on "
            "the whole domain), since the contraction argument does not hold for clipped gradients",
            "gradient_norms_within_clip=False",
        )
    return None


def _steps_per_epoch_at_least_two(cfg: TrainingConfig, a: LossAssumptions):
    if cfg.steps_per_epoch < 2:
        return "ceil(dataset_size / batch_size) must be >= 2", f"{cfg.steps_per_epoch}"
    return None


def _batch_divides_dataset(cfg: TrainingConfig, a: LossAssumptions):
    # Decision (audit of seed 004): a short last batch normalised by b contracts
    # only by 1 - eta*lam*|B|/b, not rho; the theorem assumes b divides n.
    if cfg.dataset_size % cfg.batch_size:
        return (
            "batch_size must divide dataset_size (equal batches; a short last batch breaks the contraction)",
            f"{cfg.dataset_size} % {cfg.batch_size} = {cfg.dataset_size % cfg.batch_size}",
        )
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
    return kong_ribero.max_learning_rate(a.smoothness, a.weak_convexity, a.clipping_may_be_active)


def _inverse(value: float) -> float:
    return math.inf if value == 0 else 1.0 / value


_kong_ribero_step = _step_size(
    _kong_ribero_limit,
    lambda c, a: (
        "1/(2(M+m)) (clipping may be active)"
        if a.clipping_may_be_active
        else "1/(M+m) (gradient_norms_within_clip=True)"
    ),
    strict=False,
)


def _altschuler_talwar_limit(cfg: TrainingConfig, a: LossAssumptions) -> float:
    # Decision (audit of seed 001, Observation 3.3): non-expansiveness needs the
    # effective step eta*|B|/b <= 2/M for every batch; Poisson batches can hold
    # all n examples, so eta <= 2b/(nM) there.
    limit = 2.0 * _inverse(a.smoothness)
    return limit * cfg.sampling_probability if cfg.sampling is Sampling.POISSON else limit


_altschuler_talwar_step = _step_size(
    _altschuler_talwar_limit,
    lambda c, a: "2b/(nM) (poisson: a batch can hold all n examples)" if c.sampling is Sampling.POISSON else "2/M",
    strict=False,
)
_ye_shokri_step = _step_size(lambda c, a: 2.0 * _inverse(a.strong_convexity + a.smoothness), "2/(lam+M)", strict=True)
_two_over_m_strict = _step_size(lambda c, a: 2.0 * _inverse(a.smoothness), "2/M", strict=True)
_one_over_m_strict = _step_size(lambda c, a: _inverse(a.smoothness), "1/M", strict=True)


# ---------------------------------------------------------------- bound functions


def _kr_lipschitz(cfg: TrainingConfig, a: LossAssumptions) -> float:
    return kong_ribero.update_lipschitz(cfg.learning_rate, a.smoothness, a.weak_convexity, a.clipping_may_be_active)


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


def _altschuler_talwar(cfg, a, orders):
    contraction = None
    # The strongly convex variant (eq. 5.3) needs the step to contract by c < 1:
    # fixed-size batches (not Poisson, where an empty batch does not contract),
    # unclipped gradients (a clipped field is not strongly monotone) and eta < 2/M.
    if (
        a.strong_convexity > 0
        and a.gradient_norms_within_clip
        and cfg.sampling is Sampling.RANDOM_BATCH
        and cfg.learning_rate * a.smoothness < 2.0
    ):
        eta = cfg.learning_rate
        contraction = max(abs(1.0 - eta * a.strong_convexity), abs(1.0 - eta * a.smoothness))
    return altschuler_talwar.rdp(
        orders,
        sampling_probability=cfg.sampling_probability,
        noise_multiplier=cfg.noise_multiplier,
        steps=cfg.steps,
        diameter=a.diameter,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        clip_norm=cfg.clip_norm,
        contraction=contraction,
    )


def _liang_bounded(cfg, a, orders):
    # Decision (audit of seed 002, eq. 37): a Poisson batch B is divided by the
    # fixed b, so a step is (1 + eta*M*|B|/b)-Lipschitz, not (1 + eta*M); |B| can
    # be n, so the worst case c = 1 + eta*M*n/b is used.
    return liang.bounded_rdp(
        orders,
        sampling_probability=cfg.sampling_probability,
        noise_multiplier=cfg.noise_multiplier,
        diameter=a.diameter,
        batch_size=cfg.batch_size,
        learning_rate=cfg.learning_rate,
        clip_norm=cfg.clip_norm,
        expansion=1.0 + cfg.learning_rate * a.smoothness / cfg.sampling_probability,
    )


def _liang_unbounded(cfg, a, orders):
    return liang.unbounded_rdp(
        orders, sampling_probability=cfg.sampling_probability, noise_multiplier=cfg.noise_multiplier, steps=cfg.steps
    )


def _rho(cfg: TrainingConfig, a: LossAssumptions) -> float:
    return 1.0 - cfg.learning_rate * a.strong_convexity


def _ye_shokri_cyclic(cfg, a, orders):
    return ye_shokri.cyclic_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        steps_per_epoch=cfg.steps_per_epoch,
        epochs=cfg.epochs_started,
        contraction=_rho(cfg, a),
    )


def _ye_shokri_shuffle(cfg, a, orders):
    return ye_shokri.shuffle_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        steps_per_epoch=cfg.steps_per_epoch,
        epochs=cfg.epochs_started,
        contraction=_rho(cfg, a),
    )


def _ye_shokri_random(cfg, a, orders):
    return ye_shokri.random_batch_rdp(
        orders,
        noise_multiplier=cfg.noise_multiplier,
        sampling_probability=cfg.sampling_probability,
        steps=cfg.steps,
        contraction=_rho(cfg, a),
    )


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


# ---------------------------------------------------------------- the table


def _covers(schemes, relation=Relation.REPLACE_ONE) -> dict[Sampling, Relation]:
    return {s: relation for s in schemes}


_KR = "Kong & Ribero 2024"
_SMOOTH_WEAK = "per-example losses m-weakly convex and M-smooth (upper curvature M)"

BOUNDS: dict[str, BoundSpec] = {
    spec.id: spec
    for spec in (
        BoundSpec(
            id="kong-ribero-cyclic",
            title="cyclic traversal, weakly convex smooth losses",
            reference=f"{_KR} (seed 003), Theorem 2.3",
            covers=_covers(FIXED_BATCH_SCHEMES),
            assumptions=f"{_SMOOTH_WEAK}; eta <= 1/(2(M+m)) (1/(M+m) if clipping is never active)",
            conditions=(_needs_learning_rate, _needs_smoothness, _kong_ribero_step),
            compute=_kong_ribero_cyclic,
        ),
        BoundSpec(
            id="kong-ribero-bounded",
            title="bounded domain, weakly convex smooth losses, independent of T",
            reference=f"{_KR} (seed 003), Theorem 2.2",
            covers=_covers(AT_MOST_B_SCHEMES),
            assumptions=f"{_SMOOTH_WEAK}; projection onto a convex set of diameter D; step size as kong-ribero-cyclic",
            conditions=(_needs_learning_rate, _needs_smoothness, _needs_diameter, _kong_ribero_step),
            compute=_kong_ribero_bounded,
        ),
        BoundSpec(
            id="kong-ribero-curvature-free",
            title="no assumption on the losses (always worse than composition)",
            reference=f"{_KR} (seed 000), Theorem 4.3",
            covers=_covers(AT_MOST_B_SCHEMES),
            assumptions="clipped per-example gradients only",
            conditions=(),
            compute=_kong_ribero_curvature_free,
        ),
        BoundSpec(
            id="altschuler-talwar",
            title="bounded domain, convex smooth losses, sampled batches",
            reference="Altschuler & Talwar 2022 (seed 001), eq. 3.6; strongly convex: eq. 5.3, Remark 5.3",
            covers=_covers((Sampling.RANDOM_BATCH, Sampling.POISSON)),
            assumptions="per-example (clipped) losses convex and M-smooth; eta <= 2/M (poisson: 2b/(nM)); projection "
            "onto a convex set of diameter D; strong convexity used only with gradient_norms_within_clip=True and random batches",
            conditions=(
                _needs_learning_rate,
                _needs_smoothness,
                _needs_diameter,
                _needs_convexity,
                _altschuler_talwar_step,
            ),
            compute=_altschuler_talwar,
        ),
        BoundSpec(
            id="liang-bounded",
            title="bounded domain, smooth (non-convex) losses, Poisson sampling",
            reference="Liang et al. 2025 (seed 002), Theorem 3.4, eq. 14",
            covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
            assumptions="per-example losses M-smooth; projection onto a convex set of diameter D; step expansion "
            "1 + eta*M*n/b (worst-case Poisson batch)",
            conditions=(_needs_learning_rate, _needs_smoothness, _needs_diameter),
            compute=_liang_bounded,
        ),
        BoundSpec(
            id="liang-unbounded",
            title="smooth losses, Poisson sampling (composition in disguise)",
            reference="Liang et al. 2025 (seed 002), Theorem 3.3, eq. 12",
            covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
            assumptions="per-example losses M-smooth",
            conditions=(_needs_smoothness,),
            compute=_liang_unbounded,
        ),
        BoundSpec(
            id="ye-shokri-cyclic",
            title="strongly convex, fixed batches (any fixed partition)",
            reference="Ye & Shokri 2022 (seed 004), Theorem 3.3",
            covers=_covers(FIXED_BATCH_SCHEMES),
            assumptions="per-example losses lam-strongly convex and M-smooth; eta < 2/(lam+M); clipping never active; "
            "b divides n",
            conditions=(
                _needs_learning_rate,
                _needs_smoothness,
                _needs_strong_convexity,
                _needs_inactive_clipping,
                _steps_per_epoch_at_least_two,
                _batch_divides_dataset,
                _ye_shokri_step,
            ),
            compute=_ye_shokri_cyclic,
        ),
        BoundSpec(
            id="ye-shokri-shuffle",
            title="strongly convex, shuffle once and partition",
            reference="Ye & Shokri 2022 (seed 004), Theorem 4.2",
            covers=_covers((Sampling.SHUFFLE_ONCE,)),
            assumptions="as ye-shokri-cyclic; the permutation is drawn once, at random, and kept secret",
            conditions=(
                _needs_learning_rate,
                _needs_smoothness,
                _needs_strong_convexity,
                _needs_inactive_clipping,
                _steps_per_epoch_at_least_two,
                _batch_divides_dataset,
                _ye_shokri_step,
            ),
            compute=_ye_shokri_shuffle,
        ),
        BoundSpec(
            id="ye-shokri-random",
            title="strongly convex, random batch of size b every step",
            reference="Ye & Shokri 2022 (seed 004), Theorem 4.3",
            covers=_covers((Sampling.RANDOM_BATCH,)),
            assumptions="per-example losses lam-strongly convex and M-smooth; eta < 2/(lam+M); clipping never active",
            conditions=(
                _needs_learning_rate,
                _needs_smoothness,
                _needs_strong_convexity,
                _needs_inactive_clipping,
                _steps_per_epoch_at_least_two,
                _ye_shokri_step,
            ),
            compute=_ye_shokri_random,
        ),
        BoundSpec(
            id="ye-shokri-convex",
            title="convex, fixed batches",
            reference="Ye & Shokri 2022 (seed 004), Theorem D.4",
            covers=_covers(FIXED_BATCH_SCHEMES),
            assumptions="per-example losses convex and M-smooth; eta < 2/M; clipping never active",
            conditions=(
                _needs_learning_rate,
                _needs_smoothness,
                _needs_convexity,
                _needs_inactive_clipping,
                _two_over_m_strict,
            ),
            compute=_ye_shokri_convex,
        ),
        BoundSpec(
            id="ye-shokri-full-batch",
            title="convex, full-batch gradient descent",
            reference="Ye & Shokri 2022 (seed 004), Theorem D.6",
            covers=_covers(ALL_SCHEMES),
            assumptions="b = n; per-example losses convex (lam-strongly convex, lam >= 0) and M-smooth; eta < 1/M; "
            "clipping never active",
            conditions=(
                _full_batch,
                _needs_learning_rate,
                _needs_smoothness,
                _needs_convexity,
                _needs_inactive_clipping,
                _one_over_m_strict,
            ),
            compute=_ye_shokri_full_batch,
        ),
        BoundSpec(
            id="composition",
            title="standard composition over all steps (certifies every iterate)",
            reference="BOUNDS.md section 4 (Gaussian / sampled Gaussian mechanism, dp-accounting RDP)",
            covers={
                **_covers(EPOCH_SCHEMES),
                Sampling.RANDOM_BATCH: Relation.REPLACE_ONE,
                Sampling.POISSON: Relation.ADD_OR_REMOVE_ONE,
            },
            assumptions="none beyond clipping",
            conditions=(),
            compute=_composition,
            last_iterate=False,
        ),
    )
}

BEST = "best"
BOUND_IDS: tuple[str, ...] = (*BOUNDS, BEST)


def get_spec(bound: str) -> BoundSpec:
    """The table row of a bound id (``best`` has none)."""
    try:
        return BOUNDS[bound]
    except (KeyError, TypeError):
        raise ValueError(f"bound must be one of {', '.join(BOUND_IDS)}. Found {bound!r}.") from None


def applicability(spec: BoundSpec, cfg: TrainingConfig, a: LossAssumptions) -> Applicability:
    """Check every precondition of ``spec`` for the declared pipeline."""
    reasons: list[str] = []
    where = f"{spec.id} ({spec.reference})"
    relation = spec.relation_for(cfg.sampling)
    if relation is None:
        covered = ", ".join(s.value for s in spec.covers)
        reasons.append(f"sampling must be one of {covered} for {where}. Found {cfg.sampling.value}.")
    elif relation is not cfg.relation:
        reasons.append(
            f"relation must be {relation.value} for {where} with sampling={cfg.sampling.value}. "
            f"Found {cfg.relation.value}."
        )
    for condition in spec.conditions:
        failed = condition(cfg, a)
        if failed is not None:
            required, found = failed
            reasons.append(f"{required} for {where}. Found {found}.")
    shown_relation = next(iter(spec.relations)) if len(spec.relations) == 1 else relation
    return Applicability(spec.id, not reasons, tuple(reasons), shown_relation, spec.reference)


def compute(spec: BoundSpec, cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    """RDP of ``spec`` at ``orders``; raises NotApplicableError unless every precondition holds."""
    check = applicability(spec, cfg, a)
    if not check.applies:
        raise NotApplicableError(check.reason)
    return evaluate(spec, cfg, a, orders)


def evaluate(spec: BoundSpec, cfg: TrainingConfig, a: LossAssumptions, orders: np.ndarray) -> np.ndarray:
    """RDP of ``spec`` for a pipeline whose applicability the caller has just checked."""
    values = np.asarray(spec.compute(cfg, a, orders), dtype=float)
    if np.isnan(values).any() or (values < 0).any():  # an internal error, never a user's
        raise ArithmeticError(f"{spec.id} produced an invalid RDP value: {values}")
    return values
