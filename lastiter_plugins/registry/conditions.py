r"""The preconditions of the table's rows, and the checks that say when a pipeline leaves a published statement.

A condition (:data:`~lastiter_plugins.registry.spec.Condition`) returns None when it holds, else (what is
required, what was found[, why]); a check of :class:`~lastiter_plugins.registry.spec.Provenance` returns None
or why the number rests on this library's derivation. Step-size limits are functions of the papers' modules.
"""

from __future__ import annotations

from collections.abc import Callable

from lastiter_plugins import baselines
from lastiter_plugins.bounds import allocation_mixture, kong_ribero, membership_mixtures, ye_shokri
from lastiter_plugins.bounds._common import batch_sizes, non_expansive_max_learning_rate
from lastiter_plugins.bounds._glue import given
from lastiter_plugins.config import LossAssumptions, Sampling, TrainingConfig, Update
from lastiter_plugins.registry.spec import Condition, OutsidePublished, Violation


def needs_sgd_update(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    """The precondition of every last-iterate row: the update is the map its proof analyses."""
    if cfg.update is not Update.SGD:
        return (
            "the update must be plain SGD with a constant learning rate (x - lr * noisy clipped mean, projection "
            "optional)",
            f"update={cfg.update.value}",
            "a last-iterate proof follows that map from step to step; Adam, momentum or a learning-rate schedule "
            "use the noisy sums otherwise, which only the every-iterate rows cover",
        )
    return None


def needs_learning_rate(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    if cfg.learning_rate is None:
        return "learning_rate (the constant SGD step size) must be given", "none"
    return None


def needs_smoothness(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    if a.smoothness is None:
        return "smoothness (M, the gradient-Lipschitz constant of every per-example loss) must be declared", "none"
    return None


def needs_diameter(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    if a.diameter is None:
        return (
            "diameter (D) must be declared",
            "no projection",
            "every step must project the parameters onto a convex set of that diameter",
        )
    return None


def needs_convexity(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    if not a.convex:
        return "the losses must be convex (weak_convexity = 0)", f"weak_convexity={a.weak_convexity}"
    return None


def needs_strong_convexity(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    if a.strong_convexity <= 0:
        return "strong_convexity (lam) must be > 0", f"strong_convexity={a.strong_convexity}"
    return None


def needs_inactive_clipping(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
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


def needs_secret_order(*schemes: Sampling) -> Condition:
    """The precondition of a row whose proof, under ``schemes``, draws on the batches being secret (a
    position mixed over a secret permutation, an amplification by secret memberships): unmet when the
    pipeline's order is public (``order_secret=False``) and its scheme is one of ``schemes``. The rows proven
    for every fixed batch sequence do not have it (docs/derivations/public-order.md#po-rows)."""
    names = ", ".join(s.value for s in schemes)

    def check(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
        if not cfg.order_secret and cfg.sampling in schemes:
            return (
                f"the batches must be drawn from a secret seed (order_secret=True) for this row under {names}",
                "order_secret=False (the order is public)",
                "its proof mixes over the secret position or memberships of the differing example; with a public "
                "order the batches are a known fixed sequence",
            )
        return None

    check.__name__ = check.__qualname__ = f"needs_secret_order({names})"
    return check


def steps_per_epoch_at_least_two(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    if cfg.steps_per_epoch < 2:
        return "ceil(dataset_size / batch_size) must be >= 2", f"{cfg.steps_per_epoch}"
    return None


def full_batch(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
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

    def check(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
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


kong_ribero_step = _step_size(
    kong_ribero.kong_ribero_step_limit,
    lambda c, a: (
        "1/(2(M+m)) (clipping may be active)"
        if not a.update_is_gradient_step
        else "1/(M+m) (the update is a gradient step: clipping never active, or the scalar-GLM route)"
    ),
    strict=False,
)


def _non_expansive_limit(cfg: TrainingConfig, a: LossAssumptions) -> float:
    q = cfg.sampling_probability if cfg.sampling is Sampling.POISSON else None
    return non_expansive_max_learning_rate(given(a.smoothness, "smoothness"), q)


non_expansive_step = _step_size(
    _non_expansive_limit,
    lambda c, a: "2b/(nM) (poisson: a batch can hold all n examples)" if c.sampling is Sampling.POISSON else "2/M",
    strict=False,
)
ye_shokri_step = _step_size(ye_shokri.ye_shokri_step_limit, "2/(lam+M)", strict=True)
two_over_m_strict = _step_size(ye_shokri.ye_shokri_convex_step_limit, "2/M", strict=True)
one_over_m_strict = _step_size(ye_shokri.ye_shokri_full_batch_step_limit, "1/M", strict=True)


def _sizes_contract(
    sampling: Sampling,
    events: Callable[[TrainingConfig, LossAssumptions], tuple[tuple[float, float], ...]],
    what: str,
    anchor: str,
) -> Condition:
    """The batch-size condition of a scheme with random batch sizes: some range of sizes around b + 1 keeps
    every step non-expansive. Only ``sampling`` has these sizes; a row with this condition fails any other
    scheme on its sampling."""

    def check(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
        if cfg.sampling is not sampling or cfg.learning_rate is None or a.smoothness is None:
            return None
        if events(cfg, a):
            return None
        return (
            "a step non-expansive (c <= 1) for every batch size between the low tail quantile and b + 1",
            f"learning_rate={cfg.learning_rate:g} expands at batch size b + 1 = {cfg.batch_size + 1}",
            f"the {what} bounds condition on the batch sizes staying in a range (its complement's probability, "
            "at most 1e-12 unless the step size forces a narrower range, is added to delta) and need every step "
            f"there to be a contraction; see {anchor}",
        )

    return check


poisson_sizes_contract = _sizes_contract(
    Sampling.POISSON,
    membership_mixtures.poisson_events,
    "Poisson",
    "docs/derivations/random-batch.md#rb-poisson-batch-sizes",
)
allocation_sizes_contract = _sizes_contract(
    Sampling.RANDOM_ALLOCATION,
    allocation_mixture.random_allocation_events,
    "random-allocation",
    "docs/derivations/random-allocation-last-iterate.md#ra-sizes",
)


def pld_steps(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    if cfg.steps > baselines.PLD_MAX_STEPS:
        return (
            f"steps must be <= {baselines.PLD_MAX_STEPS:.0e}",
            f"{cfg.steps}",
            "the composed privacy loss distribution is held in memory; beyond, the Renyi-DP composition remains",
        )
    return None


def allocation_groups(cfg: TrainingConfig, a: LossAssumptions) -> Violation:
    k = cfg.allocations_per_epoch
    if cfg.steps_per_epoch >= 2 * k:
        return None
    formula = "ceil(dataset_size * allocations_per_epoch / batch_size)" if k > 1 else "ceil(dataset_size / batch_size)"
    return (
        f"{formula} (the steps of an epoch) must be >= {2 * k} (twice allocations_per_epoch)",
        f"{cfg.steps_per_epoch}",
        "the random-allocation distribution is composed from groups of at least two steps, one allocation each; "
        "a full batch (every example in every step) is accounted by the full-batch and epoch rows",
    )


# ---------------------------------------------------------------- provenance: leaving a published statement


def glm_route(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    return "the linear-model route, docs/derivations/glm.md#glm-route" if a.clipped_loss_convex_smooth else None


def l2_outside(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    return "an l2 term outside the clip, docs/derivations/glm.md#glm-l2-contraction" if a.l2_outside_clip else None


def projected(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    if a.diameter is None:
        return None
    return (
        "a projection the theorem does not have, docs/derivations/assumptions.md#checked-and-kept and "
        "docs/derivations/shifted-interpolation.md#shifted-interpolation"
    )


def short_last_batch(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    last = batch_sizes(cfg.dataset_size, cfg.batch_size)[1]
    return (
        f"a short last batch of {last}, docs/derivations/ye-shokri.md#short-last-batch"
        if last < cfg.batch_size
        else None
    )


def partial_epoch(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    if cfg.steps % cfg.steps_per_epoch == 0:
        return None
    return "a partial last epoch, docs/derivations/assumptions.md#checked-and-kept"


def clipping_may_be_active(cfg: TrainingConfig, a: LossAssumptions) -> str | None:
    if a.update_is_gradient_step:
        return None
    return "clipping may be active: the constant sqrt(2) L_eta, docs/derivations/assumptions.md#unclipped-gradients"


# ---------------------------------------------------------------- groups the table's rows share

#: a step contracting by 1 - eta lam (Ye & Shokri's rows)
CONTRACTING: tuple[Condition, ...] = (
    needs_learning_rate,
    needs_smoothness,
    needs_strong_convexity,
    needs_inactive_clipping,
    steps_per_epoch_at_least_two,
)
#: convex losses, the unclipped step non-expansive
CONVEX_UNCLIPPED: tuple[Condition, ...] = (
    needs_learning_rate,
    needs_smoothness,
    needs_convexity,
    needs_inactive_clipping,
    non_expansive_step,
)
#: as CONVEX_UNCLIPPED over the range of Poisson batch sizes
POISSON_CONVEX_UNCLIPPED: tuple[Condition, ...] = (
    needs_learning_rate,
    needs_smoothness,
    needs_convexity,
    needs_inactive_clipping,
    poisson_sizes_contract,
)
#: as CONVEX_UNCLIPPED over the range of random-allocation batch sizes
ALLOCATION_CONVEX_UNCLIPPED: tuple[Condition, ...] = (
    needs_learning_rate,
    needs_smoothness,
    needs_convexity,
    needs_inactive_clipping,
    allocation_sizes_contract,
)
#: what the random-allocation privacy loss distribution needs
RANDOM_ALLOCATION_PLD: tuple[Condition, ...] = (pld_steps, allocation_groups)
#: where a pipeline with fixed batches leaves a published statement
FIXED_BATCH_OUTSIDE: tuple[OutsidePublished, ...] = (short_last_batch, partial_epoch, projected, l2_outside, glm_route)
