r"""The dispatch table: one :class:`~lastiter_plugins.registry.spec.BoundSpec` per bound id, with the citations
and the prose its rows share.

Every row names its glue, in the module of its paper (:mod:`lastiter_plugins.bounds`), and its preconditions
(:mod:`lastiter_plugins.registry.conditions`). Where the mapping of the hyperparameters differs between the
sampling schemes a row covers, the row names one glue per scheme (:class:`BySampling`): the table is the one
place that dispatches on sampling. Decisions that deviate from, or sharpen, the papers are marked "Decision"
and derived in docs/decisions.md.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence

from lastiter_plugins import baselines
from lastiter_plugins.bounds import (
    allocation_mixture,
    altschuler_talwar,
    bounded_domain,
    composition,
    concave_majorant,
    kong_ribero,
    liang,
    shifted_interpolation,
    ye_shokri,
)
from lastiter_plugins.bounds._glue import profile_rdp
from lastiter_plugins.config import Relation, Sampling
from lastiter_plugins.defaults import BEST
from lastiter_plugins.registry import conditions as c
from lastiter_plugins.registry.spec import (
    ALL_SCHEMES,
    AT_MOST_B_SCHEMES,
    EPOCH_SCHEMES,
    FIXED_BATCH_SCHEMES,
    BoundSpec,
    BySampling,
    Kind,
    Proof,
    Protects,
    Provenance,
)

RB, P, RA = Sampling.RANDOM_BATCH, Sampling.POISSON, Sampling.RANDOM_ALLOCATION
SO = Sampling.SHUFFLE_ONCE


def _covers(schemes: Sequence[Sampling], relation: Relation = Relation.REPLACE_ONE) -> dict[Sampling, Relation]:
    return {s: relation for s in schemes}


# ---------------------------------------------------------------- citations and prose the rows share

_FUZZ = "benchmarks/fuzz_1000.json"
_FUZZ_MEMBERSHIP = "benchmarks/fuzz_1000_membership.json"
#: both Poisson rows (add-or-remove and replace-one) rest on the same derivation
_POISSON_PROVENANCE = Provenance(
    derived="docs/derivations/random-batch.md#random-batch-poisson and "
    "docs/derivations/poisson-amplification.md#amplification (per-pattern shifted interpolation, batch sizes "
    "conditioned; the "
    "patterns mixed against the run without the record) and docs/derivations/concave-majorant.md#concave-majorant "
    "(the exact per-pattern optimum at c = 1, where the run is nearly non-expansive); checks: exact instances "
    "(tests/core/bounds/test_membership_mixtures.py, tests/core/bounds/test_dominating_mixture.py, "
    "tests/core/bounds/test_concave_majorant.py), fuzzing "
    f"({_FUZZ_MEMBERSHIP}), an independent re-derivation of docs/derivations/random-batch.md#random-batch-poisson"
)

_FUZZ_ALLOCATION = "benchmarks/fuzz_1000_random_allocation.json"
#: both random-allocation rows (add-or-remove and replace-one) rest on the same derivation
_ALLOCATION_PROVENANCE = Provenance(
    derived="docs/derivations/random-allocation-last-iterate.md#ra-last-iterate (per-schedule shifted "
    "interpolation, batch sizes conditioned, every epoch but the last one started at its worst steps; the last "
    "epoch's positions mixed against the run without the record); checks: exact instances "
    "(tests/core/bounds/test_allocation_mixture.py: every allocation of tiny runs enumerated, both relations), "
    f"fuzzing ({_FUZZ_ALLOCATION})"
)
#: both random-allocation PLD rows rest on the same derivation
_RA_PROVENANCE = Provenance(
    derived="docs/derivations/random-allocation.md#ra-one-epoch, #ra-k-of-t, #ra-epochs and #ra-replace-one (an "
    "adaptive run's epoch dominated by the Gaussian allocation pair; k of t as k allocations of one; the epochs "
    "composed; replace-one through the run without the record); "
    "checks: exact instances, every allocation enumerated (tests/core/test_random_allocation_pld.py), "
    "PLD_accounting's lower bound (benchmarks/bench_random_allocation.py)"
)
_RA_REFERENCE = (
    "Feldman & Shenfeld 2026, arXiv 2602.17284: the privacy loss distribution of random allocation of the "
    "Gaussian mechanism, computed by their library PLD_accounting (FFT route, pessimistic; loss interval 5e-5)"
)
_RA_ASSUMES = (
    "clipping only; every epoch each example joins k of the epoch's t = ceil(nk/b) steps, chosen uniformly at "
    "random afresh every epoch, from a secret seed; the noise std on the sum of clipped gradients is z*C "
    "(a fixed divisor b; add_or_remove: not the actual batch size)"
)

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

_AT_UNPROVEN = Proof(
    False,
    "the proof of Theorem 3.1 (step 3b) conditions on the differing example's noise, which changes the law of "
    "the batch indicators for the other dataset; the published form is below the exact divergence on the "
    "paper's own projected 1-D walk (D = 0.01, z = 0.5, q = 0.1, T = 1..5). This sampled-Gaussian form has "
    "never been observed below the truth, but nothing proves it (docs/derivations/provenance.md#proof-status). Use "
    "bounded-domain-random.",
)

_POISSON_SI_ASSUMES = (
    f"per-example losses convex (lam-strongly convex, lam >= 0) and M-smooth; {_WITHIN_CLIP}; the sum of "
    "clipped gradients is divided by the fixed b (Opacus: the expected batch size); contraction over the "
    "batch sizes of a range around b (l2_outside_clip=True: lam does not grow with the batch size); each "
    "example joins each step independently with probability q = b/n, from a secret seed"
)
_ALLOCATION_SI_ASSUMES = (
    f"per-example losses convex (lam-strongly convex, lam >= 0) and M-smooth; {_WITHIN_CLIP}; the sum of "
    "clipped gradients is divided by the fixed b; contraction over the batch sizes of a range around b "
    "(l2_outside_clip=True: lam does not grow with the batch size); every epoch each example is assigned to one "
    "of the epoch's ceil(n/b) steps, uniformly, independently of the other examples and afresh each epoch, from a "
    "secret seed; plain SGD with a constant learning rate"
)
_SI_ASSUMES = (
    f"per-example losses convex (lam-strongly convex, lam >= 0) and M-smooth; eta <= 2/M; {_WITHIN_CLIP}; "
    "contraction c = max(|1 - eta*lam*r/b|, |1 - eta*M*r/b|) over the batch sizes r of a pass; optional "
    "projection onto a convex set of diameter D"
)

# ---------------------------------------------------------------- the table

_TABLE: tuple[BoundSpec, ...] = (
    BoundSpec(
        id="kong-ribero-cyclic",
        provenance=Provenance(
            published="Kong & Ribero 2024 (arXiv 2407.05237), Theorem 2.3",
            derived="docs/derivations/glm.md#glm-route (the linear-model route: the clipped update is a gradient "
            "step); "
            f"checks: exact instances G1-G3 (tests/core/verification/test_ground_truth.py), fuzzing ({_FUZZ})",
            outside_published=(c.glm_route,),
        ),
        title="cyclic traversal, weakly convex smooth losses",
        reference=f"{KONG_RIBERO}, Theorem 2.3",
        covers=_covers(FIXED_BATCH_SCHEMES),
        assumptions=f"{_SMOOTH_WEAK}; eta <= 1/(2(M+m)) (1/(M+m) if {_WITHIN_CLIP})",
        conditions=(c.needs_sgd_update, c.needs_learning_rate, c.needs_smoothness, c.kong_ribero_step),
        compute=kong_ribero.kong_ribero_cyclic,
        linear_in_order=True,
    ),
    BoundSpec(
        id="kong-ribero-bounded",
        provenance=Provenance(
            published="Kong & Ribero 2024 (arXiv 2407.05237), Theorem 2.2, with clipping never active",
            derived="docs/derivations/assumptions.md#poisson-batch-sizes, #unclipped-gradients and "
            "#clipping-never-active (the Lipschitz constant of the clipped update, Prop. "
            "2.1(b), where the statement uses L_eta); checks: exact instances G1-G3 "
            "(tests/core/verification/test_ground_truth.py), "
            f"fuzzing ({_FUZZ}, {_FUZZ_MEMBERSHIP})",
            outside_published=(c.clipping_may_be_active, c.glm_route),
        ),
        title="bounded domain, weakly convex smooth losses, independent of T",
        reference=f"{KONG_RIBERO}, Theorem 2.2",
        covers=_covers(AT_MOST_B_SCHEMES),
        assumptions=f"{_SMOOTH_WEAK}; projection onto a convex set of diameter D; step size as kong-ribero-cyclic",
        conditions=(
            c.needs_sgd_update,
            c.needs_learning_rate,
            c.needs_smoothness,
            c.needs_diameter,
            c.kong_ribero_step,
        ),
        compute=kong_ribero.kong_ribero_bounded,
        linear_in_order=True,
    ),
    BoundSpec(
        id="kong-ribero-curvature-free",
        provenance=Provenance(published="Kong & Ribero 2024 (arXiv 2407.05237v1), Theorem 4.3"),
        title="no assumption on the losses (always worse than composition)",
        reference="Kong & Ribero 2024, arXiv 2407.05237v1, Theorem 4.3",
        covers=_covers(AT_MOST_B_SCHEMES),
        assumptions="clipped per-example gradients only",
        conditions=(c.needs_sgd_update,),
        compute=kong_ribero.kong_ribero_curvature_free,
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
            c.needs_secret_order(RB, P),
            c.needs_sgd_update,
            c.needs_learning_rate,
            c.needs_smoothness,
            c.needs_diameter,
            c.needs_convexity,
            c.needs_inactive_clipping,
            c.non_expansive_step,
        ),
        compute=BySampling(
            {RB: altschuler_talwar.altschuler_talwar_random_batch, P: altschuler_talwar.altschuler_talwar_poisson}
        ),
        proof=_AT_UNPROVEN,
    ),
    BoundSpec(
        id="bounded-domain-random",
        provenance=Provenance(
            derived="docs/derivations/bounded-domain.md#bounded-domain-random (Feldman, Mironov, Talwar & Thakurta "
            "2018, Lemmas 20-21, per batch "
            "sequence, averaged over the batches); checks: exact instances G3 "
            "(tests/core/bounds/test_bounded_domain.py), "
            f"fuzzing ({_FUZZ}, {_FUZZ_MEMBERSHIP})"
        ),
        title="bounded domain, convex smooth losses, random or Poisson batches",
        reference="Feldman, Mironov, Talwar & Thakurta 2018, arXiv 1808.06651, Lemmas 20-21, per fixed batch "
        f"sequence ({ALTSCHULER_TALWAR}, Prop. 3.2 and 5.6), mixed over batch sequences by joint convexity "
        f"({YE_SHOKRI}, Lemma 4.1); derivation in docs/derivations/bounded-domain.md#bounded-domain-random",
        covers=_covers((Sampling.RANDOM_BATCH, Sampling.POISSON)),
        assumptions="per-example losses convex and M-smooth; eta <= 2/M (poisson: 2b/(nM)); projection onto a "
        f"convex set of diameter D after every step; {_WITHIN_CLIP}; batches drawn independently of the data",
        conditions=(c.needs_secret_order(RB, P), c.needs_sgd_update, *c.CONVEX_UNCLIPPED, c.needs_diameter),
        compute=BySampling({RB: bounded_domain.bounded_domain_random_batch, P: bounded_domain.bounded_domain_poisson}),
    ),
    BoundSpec(
        id="liang-bounded",
        provenance=Provenance(
            derived="docs/derivations/assumptions.md#poisson-batch-sizes and "
            "docs/derivations/liang.md#closed-forms-not-used and #add-or-remove-sensitivity (Liang et al. "
            "2025, arXiv 2502.17772, Theorem 3.4, "
            "corrected: the exact sampled-Gaussian term with sensitivity C, the expansion of Poisson batches); "
            f"checks: exact instances G1 and G3 (tests/core/bounds/test_liang.py), fuzzing ({_FUZZ})"
        ),
        title="bounded domain, smooth (non-convex) losses, Poisson sampling",
        reference=f"{LIANG}, Theorem 3.4",
        covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
        assumptions="per-example losses M-smooth; projection onto a convex set of diameter D; step expansion "
        "1 + eta*M*n/b (worst-case Poisson batch)",
        conditions=(
            c.needs_secret_order(P),
            c.needs_sgd_update,
            c.needs_learning_rate,
            c.needs_smoothness,
            c.needs_diameter,
        ),
        compute=liang.liang_bounded,
        lower_estimate=liang.liang_bounded_lower,
    ),
    BoundSpec(
        id="liang-unbounded",
        provenance=Provenance(
            derived="docs/derivations/liang.md#closed-forms-not-used and #add-or-remove-sensitivity (Liang et al. "
            "2025, arXiv 2502.17772, Theorem 3.3, "
            "corrected: the exact sampled-Gaussian term with sensitivity C); checks: exact instances G1 "
            f"(tests/core/bounds/test_liang.py), fuzzing ({_FUZZ})"
        ),
        title="smooth losses, Poisson sampling (composition in disguise)",
        reference=f"{LIANG}, Theorem 3.3",
        covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
        assumptions="per-example losses M-smooth",
        conditions=(
            c.needs_secret_order(P),
            c.needs_sgd_update,
            c.needs_smoothness,
        ),
        compute=liang.liang_unbounded,
    ),
    BoundSpec(
        id="ye-shokri-cyclic",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem 3.3",
            derived="docs/derivations/assumptions.md#unclipped-gradients and #checked-and-kept, "
            "docs/derivations/ye-shokri.md#short-last-batch and docs/derivations/glm.md#glm-route (a short "
            "last batch, a partial last epoch, a "
            "projection, the linear-model route); checks: exact instances G2 (tests/core/bounds/test_ye_shokri.py), "
            f"fuzzing ({_FUZZ})",
            outside_published=c.FIXED_BATCH_OUTSIDE,
        ),
        title="strongly convex, fixed batches (any fixed partition)",
        reference=f"{YE_SHOKRI}, Theorem 3.3",
        covers=_covers(FIXED_BATCH_SCHEMES),
        assumptions=f"per-example losses lam-strongly convex and M-smooth; eta < 2/(lam+M); {_WITHIN_CLIP}; "
        "a short last batch of r examples contracts only by 1 - eta*lam*r/b "
        "(docs/derivations/ye-shokri.md#short-last-batch)",
        conditions=(c.needs_sgd_update, *c.CONTRACTING, c.ye_shokri_step),
        compute=ye_shokri.ye_shokri_cyclic,
        linear_in_order=True,
    ),
    BoundSpec(
        id="ye-shokri-shuffle",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem 4.2",
            derived="docs/derivations/assumptions.md#unclipped-gradients and #checked-and-kept, "
            "docs/derivations/ye-shokri.md#short-last-batch and docs/derivations/glm.md#glm-route (a short "
            "last batch, a partial last epoch, a "
            "projection, the linear-model route); checks: exact instances G2 (tests/core/bounds/test_ye_shokri.py), "
            f"fuzzing ({_FUZZ})",
            outside_published=c.FIXED_BATCH_OUTSIDE,
        ),
        title="strongly convex, shuffle once and partition",
        reference=f"{YE_SHOKRI}, Theorem 4.2",
        covers=_covers((Sampling.SHUFFLE_ONCE,)),
        assumptions="as ye-shokri-cyclic; the permutation is drawn once, at random, and kept secret",
        conditions=(c.needs_secret_order(SO), c.needs_sgd_update, *c.CONTRACTING, c.ye_shokri_step),
        compute=ye_shokri.ye_shokri_shuffle,
    ),
    BoundSpec(
        id="ye-shokri-random",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem 4.3",
            derived="docs/derivations/assumptions.md#checked-and-kept and docs/derivations/glm.md#glm-route (a "
            "projection, the linear-model route); checks: exact "
            f"instances G2 (tests/core/verification/test_ground_truth.py), fuzzing ({_FUZZ}, {_FUZZ_MEMBERSHIP})",
            outside_published=(c.projected, c.l2_outside, c.glm_route),
        ),
        title="strongly convex, random batch of size b every step",
        reference=f"{YE_SHOKRI}, Theorem 4.3",
        covers=_covers((Sampling.RANDOM_BATCH,)),
        assumptions=f"per-example losses lam-strongly convex and M-smooth; eta < 2/(lam+M); {_WITHIN_CLIP}",
        conditions=(c.needs_secret_order(RB), c.needs_sgd_update, *c.CONTRACTING, c.ye_shokri_step),
        compute=ye_shokri.ye_shokri_random,
        estimate_curve=ye_shokri.ye_shokri_random_lower,
    ),
    BoundSpec(
        id="ye-shokri-convex",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem D.4",
            derived="docs/derivations/assumptions.md#checked-and-kept, docs/derivations/ye-shokri.md#short-last-batch "
            "and docs/derivations/glm.md#glm-route (a short last batch, a partial last epoch, a "
            f"projection, the linear-model route); checks: exact instances G1 and G2, fuzzing ({_FUZZ})",
            outside_published=c.FIXED_BATCH_OUTSIDE,
        ),
        title="convex, fixed batches",
        reference=f"{YE_SHOKRI}, Theorem D.4",
        covers=_covers(FIXED_BATCH_SCHEMES),
        assumptions=f"per-example losses convex and M-smooth; eta < 2/M; {_WITHIN_CLIP}",
        conditions=(
            c.needs_sgd_update,
            c.needs_learning_rate,
            c.needs_smoothness,
            c.needs_convexity,
            c.needs_inactive_clipping,
            c.two_over_m_strict,
        ),
        compute=ye_shokri.ye_shokri_convex,
        linear_in_order=True,
    ),
    BoundSpec(
        id="ye-shokri-full-batch",
        provenance=Provenance(
            published="Ye & Shokri, NeurIPS 2022 (arXiv 2203.05363), Theorem D.6",
            derived="docs/derivations/assumptions.md#checked-and-kept and docs/derivations/glm.md#glm-route (a "
            "projection, the linear-model route); checks: exact "
            f"instances G2, fuzzing ({_FUZZ}, {_FUZZ_MEMBERSHIP})",
            outside_published=(c.projected, c.l2_outside, c.glm_route),
        ),
        title="convex, full-batch gradient descent",
        reference=f"{YE_SHOKRI}, Theorem D.6",
        covers=_covers(ALL_SCHEMES),
        assumptions="b = n; per-example losses convex (lam-strongly convex, lam >= 0) and M-smooth; eta < 1/M; "
        + _WITHIN_CLIP,
        conditions=(
            c.needs_sgd_update,
            c.full_batch,
            c.needs_learning_rate,
            c.needs_smoothness,
            c.needs_convexity,
            c.needs_inactive_clipping,
            c.one_over_m_strict,
        ),
        compute=ye_shokri.ye_shokri_full_batch,
        linear_in_order=True,
    ),
    BoundSpec(
        id="shifted-interpolation-full-batch",
        provenance=Provenance(
            published="Bok, Su & Altschuler, ICML 2024 (arXiv 2403.00278), section 4 (NoisyGD)",
            derived="docs/derivations/shifted-interpolation.md#si-lemmas and #si-full-batch (re-derived from f-DP "
            "composition; projected restarts; "
            "the linear-model route); checks: exact on the quadratic G2, fuzzing "
            f"({_FUZZ}, {_FUZZ_MEMBERSHIP})",
            outside_published=(c.projected, c.l2_outside, c.glm_route),
        ),
        title="f-DP, full-batch noisy gradient descent (exact for strongly convex losses)",
        reference=f"{BOK_SU_ALTSCHULER}, section 4 (shifted interpolation, mu-GDP); derivation in "
        f"docs/derivations/shifted-interpolation.md#si-full-batch",
        covers=_covers(ALL_SCHEMES),
        assumptions="b = n; " + _SI_ASSUMES,
        conditions=(c.needs_sgd_update, c.full_batch, *c.CONVEX_UNCLIPPED),
        compute=profile_rdp(shifted_interpolation.shifted_interpolation_full_batch),
        profile=shifted_interpolation.shifted_interpolation_full_batch,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-cyclic",
        provenance=Provenance(
            published="Bok, Su & Altschuler, ICML 2024 (arXiv 2403.00278), section 4 (NoisyCGD)",
            derived="docs/derivations/shifted-interpolation.md#si-lemmas and #si-cyclic (re-derived from f-DP "
            "composition; a short last "
            "batch, a partial last pass, projected restarts, the linear-model route); checks: exact instances G2 "
            f"(tests/core/bounds/test_shifted_interpolation.py), fuzzing ({_FUZZ})",
            outside_published=c.FIXED_BATCH_OUTSIDE,
        ),
        title="f-DP, fixed-order batches, worst position of the differing example",
        reference=f"{BOK_SU_ALTSCHULER}, section 4 (noisy cyclic GD, mu-GDP); derivation in "
        f"docs/derivations/shifted-interpolation.md#si-cyclic",
        covers=_covers(FIXED_BATCH_SCHEMES),
        assumptions=_SI_ASSUMES,
        conditions=(c.needs_sgd_update, *c.CONVEX_UNCLIPPED),
        compute=profile_rdp(shifted_interpolation.shifted_interpolation_cyclic),
        profile=shifted_interpolation.shifted_interpolation_cyclic,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-shuffle",
        provenance=Provenance(
            derived="docs/derivations/shifted-interpolation.md#si-shuffle-once (per-position mu-GDP averaged by joint "
            "convexity); checks: "
            f"exact instances G2 (tests/core/bounds/test_shifted_interpolation.py), fuzzing ({_FUZZ})"
        ),
        title="f-DP, one secret random permutation: privacy profiles averaged over positions",
        reference=f"our extension of {BOK_SU_ALTSCHULER}, section 4: per-position mu-GDP averaged by joint "
        "convexity of the hockey-stick divergence; derivation in "
        "docs/derivations/shifted-interpolation.md#si-shuffle-once",
        covers=_covers((Sampling.SHUFFLE_ONCE,)),
        assumptions=_SI_ASSUMES + "; the permutation is drawn once, uniformly at random, and kept secret",
        conditions=(c.needs_secret_order(SO), c.needs_sgd_update, *c.CONVEX_UNCLIPPED),
        compute=profile_rdp(shifted_interpolation.shifted_interpolation_shuffle),
        profile=shifted_interpolation.shifted_interpolation_shuffle,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-reshuffle",
        provenance=Provenance(
            derived="docs/derivations/schedule-mixtures.md#schedule-mixtures (a schedule mixture); checks: exact "
            "instances "
            "(tests/core/bounds/test_shift_schedules.py), an independent re-derivation"
        ),
        title="f-DP, a fresh secret permutation every epoch: schedule mixture over the last epoch's position",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): earlier "
        "epochs at their worst position, the last epoch's position averaged by joint convexity of the "
        "hockey-stick divergence; derivation in docs/derivations/schedule-mixtures.md#sm-reshuffle",
        covers=_covers((Sampling.RESHUFFLE,)),
        assumptions=_SI_ASSUMES + "; a new permutation every epoch, drawn uniformly at random and kept secret "
        "(a public one: every epoch at its worst position, docs/derivations/public-order.md#po-reshuffle)",
        conditions=(c.needs_sgd_update, *c.CONVEX_UNCLIPPED),
        compute=profile_rdp(shifted_interpolation.shifted_interpolation_reshuffle),
        profile=shifted_interpolation.shifted_interpolation_reshuffle,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-random-batch",
        provenance=Provenance(
            derived="docs/derivations/random-batch.md#random-batch-poisson (a schedule mixture over the memberships) "
            "and docs/derivations/concave-majorant.md#concave-majorant (the exact per-pattern optimum at c = 1, where "
            "the run is nearly non-expansive); checks: exact instances "
            "(tests/core/bounds/test_membership_mixtures.py, tests/core/bounds/test_concave_majorant.py), "
            f"fuzzing ({_FUZZ_MEMBERSHIP}), an independent re-derivation"
        ),
        title="f-DP, a fresh random batch of b every step: schedule mixture over the memberships",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): an "
        "allocation whose cost is a sum of independent block terms, its exact law on a lattice (rounded up), "
        "and, where the run is nearly non-expansive, the exact per-pattern optimum's law (a concave majorant); "
        "the smaller profile, each averaged by joint convexity of the hockey-stick divergence; derivations in "
        "docs/derivations/random-batch.md#random-batch-poisson and docs/derivations/concave-majorant.md",
        covers=_covers((Sampling.RANDOM_BATCH,)),
        assumptions=_SI_ASSUMES + "; every step draws b of the n examples without replacement, independently, "
        "from a secret seed",
        conditions=(c.needs_secret_order(RB), c.needs_sgd_update, *c.CONVEX_UNCLIPPED),
        compute=None,  # its truncated tails: no Renyi curve (docs/derivations/random-batch.md#rb-exact-law)
        profile=concave_majorant.shifted_interpolation_random_batch,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-poisson",
        provenance=_POISSON_PROVENANCE,
        title="f-DP, Poisson sampling, add-or-remove (Opacus' default): schedule mixture over the memberships",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): every "
        "membership pattern against the run without the record, the patterns' tradeoff functions averaged "
        "(a one-dimensional Gaussian mixture against N(0, 1): amplification by subsampling kept), with the "
        "batch sizes conditioned on a range whose complement's probability is added to delta; the smaller "
        "profile of the additive allocation's and, where the run is nearly non-expansive, the exact per-pattern "
        "optimum's law; derivations in docs/derivations/poisson-amplification.md#pa-add-or-remove and "
        "docs/derivations/concave-majorant.md",
        covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
        assumptions=_POISSON_SI_ASSUMES,
        conditions=(c.needs_secret_order(P), c.needs_sgd_update, *c.POISSON_CONVEX_UNCLIPPED),
        compute=None,  # its truncated tails: no Renyi curve (docs/derivations/random-batch.md#rb-exact-law)
        profile=concave_majorant.shifted_interpolation_poisson,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-poisson-replace-one",
        provenance=_POISSON_PROVENANCE,
        title="f-DP, Poisson sampling, replace-one: schedule mixture over the memberships",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): both "
        "worlds compared through the run without the record (a one-dimensional Gaussian mixture against its "
        "reflection: amplification by subsampling kept), with the "
        "batch sizes conditioned on a range whose complement's probability is added to delta; the smaller "
        "profile of the additive allocation's and, where the run is nearly non-expansive, the exact per-pattern "
        "optimum's law; derivations in docs/derivations/poisson-amplification.md#pa-replace-one-pivot and "
        "docs/derivations/concave-majorant.md",
        covers=_covers((Sampling.POISSON,)),
        assumptions=_POISSON_SI_ASSUMES,
        conditions=(c.needs_secret_order(P), c.needs_sgd_update, *c.POISSON_CONVEX_UNCLIPPED),
        compute=None,  # its truncated tails: no Renyi curve (docs/derivations/random-batch.md#rb-exact-law)
        profile=concave_majorant.shifted_interpolation_poisson_replace_one,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-random-allocation",
        provenance=_ALLOCATION_PROVENANCE,
        title="f-DP, random allocation (balls in bins), add-or-remove: schedule mixture over the last epoch's position",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): every epoch "
        "but the last one started at its worst steps, the last epoch's positions mixed against the run without "
        "the record (a one-dimensional Gaussian mixture against N(0, 1): amplification by the secret allocation "
        "kept), with the batch sizes conditioned on a range whose complement's probability is added to delta; "
        "derivation in docs/derivations/random-allocation-last-iterate.md#ra-add-or-remove",
        covers=_covers((Sampling.RANDOM_ALLOCATION,), Relation.ADD_OR_REMOVE_ONE),
        assumptions=_ALLOCATION_SI_ASSUMES,
        conditions=(c.needs_secret_order(RA), c.needs_sgd_update, *c.ALLOCATION_CONVEX_UNCLIPPED),
        compute=None,  # delta = 1 off the batch-size event: no Renyi curve
        profile=allocation_mixture.shifted_interpolation_random_allocation,
        kind=Kind.GDP,
    ),
    BoundSpec(
        id="shifted-interpolation-random-allocation-replace-one",
        provenance=_ALLOCATION_PROVENANCE,
        title="f-DP, random allocation (balls in bins), replace-one: schedule mixture over the last epoch's position",
        reference=f"our schedule mixture of {BOK_SU_ALTSCHULER}'s shifted interpolation (section 4): both worlds "
        "compared through the run without the record (a one-dimensional Gaussian mixture against its "
        "reflection: amplification by the secret allocation kept), every epoch but the last one started at its "
        "worst steps, with the batch sizes conditioned on a range whose complement's probability is added to "
        "delta; derivation in docs/derivations/random-allocation-last-iterate.md#ra-replace-one",
        covers=_covers((Sampling.RANDOM_ALLOCATION,)),
        assumptions=_ALLOCATION_SI_ASSUMES,
        conditions=(c.needs_secret_order(RA), c.needs_sgd_update, *c.ALLOCATION_CONVEX_UNCLIPPED),
        compute=None,  # delta = 1 off the batch-size event: no Renyi curve
        profile=allocation_mixture.shifted_interpolation_random_allocation_replace_one,
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
            **_covers((*EPOCH_SCHEMES, RA)),
            Sampling.RANDOM_BATCH: Relation.REPLACE_ONE,
            Sampling.POISSON: Relation.ADD_OR_REMOVE_ONE,
        },
        assumptions="none beyond clipping (random_allocation: k Gaussian mechanisms per epoch, "
        "docs/derivations/random-allocation.md#ra-rows)",
        conditions=(c.needs_secret_order(RB, P),),
        compute=BySampling(
            {
                P: composition.composition_poisson,
                RB: composition.composition_random_batch,
                **dict.fromkeys((*EPOCH_SCHEMES, RA), composition.composition_epochs),
            }
        ),
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
        "(Dong, Roth & Su 2019, arXiv 1905.02383, Cor. 3.3), converted exactly; k of them per epoch under "
        "random allocation; docs/derivations/baselines.md#baselines and "
        "docs/derivations/random-allocation.md#ra-rows",
        covers=_covers((*EPOCH_SCHEMES, RA)),
        assumptions="every example in at most one batch per epoch (random_allocation: in k); clipping only",
        conditions=(),
        compute=profile_rdp(baselines.epoch_gdp_profile),
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
        "figures per dp-accounting version; docs/derivations/baselines.md#baselines",
        covers=_covers((Sampling.POISSON,), Relation.ADD_OR_REMOVE_ONE),
        assumptions="clipping only; every example joins every step independently with probability q = b/n",
        conditions=(
            c.needs_secret_order(P),
            c.pld_steps,
        ),
        compute=None,
        profile=baselines.poisson_pld_profile,
        protects=Protects.EVERY_ITERATE,
        kind=Kind.PLD,
        lower_estimate=baselines.poisson_pld_lower_epsilon,
    ),
    BoundSpec(
        id="composition-pld-poisson-replace-one",
        provenance=Provenance(
            derived="docs/derivations/baselines.md#poisson-replace-one-pair (our dominating pair, proven for every "
            "epsilon); checks: "
            f"the theorem on random configurations and exact at T = 1 (tests/core/test_baselines.py), fuzzing "
            f"({_FUZZ_MEMBERSHIP})"
        ),
        title="Poisson-sampled Gaussian under replace-one: a dominating pair composed as a privacy loss "
        "distribution (every iterate)",
        reference="our dominating pair ((1-q)N(0,1) + qN(1/z,1), (1-q)N(0,1) + qN(-1/z,1)), proven for every "
        "epsilon at once (docs/derivations/baselines.md#baselines), composed by dominating-pair composition (Zhu, Dong "
        "& "
        "Wang 2022, arXiv 2106.08567, Thm 10) in dp-accounting's PLD: interval 1e-4, pessimistic; figures per "
        "dp-accounting version",
        covers=_covers((Sampling.POISSON,)),
        assumptions="clipping only; every example joins every step independently with probability q = b/n",
        conditions=(
            c.needs_secret_order(P),
            c.pld_steps,
        ),
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
            derived="docs/derivations/baselines.md#random-batch-pair (re-derived: the coupling, both orders as one "
            "pair); "
            "checks: every batch enumerated on linear instances, attained at T = 1 "
            "(tests/core/test_random_batch_pld.py), fuzzing (300 checks)",
        ),
        title="fixed-size random batches under replace-one: a dominating pair composed as a privacy loss "
        "distribution (every iterate)",
        reference="our dominating pair of one step of sampling without replacement: at every epsilon the larger "
        "of the remove and add profiles of the Poisson-sampled Gaussian at rate b/n and noise multiplier z/2 "
        "(tradeoff conv(min(f, f^-1)), Dong, Roth & Su 2019, arXiv 1905.02383, Thm 4.2), composed by "
        "dominating-pair composition (Zhu, Dong & Wang 2022, arXiv 2106.08567, Thm 10) in dp-accounting's PLD: "
        "interval 1e-4, pessimistic; derivation in docs/derivations/baselines.md#baselines",
        covers=_covers((Sampling.RANDOM_BATCH,)),
        assumptions="clipping only; every step a uniformly random batch of exactly b of the n examples, drawn "
        "without replacement, independently across steps",
        conditions=(
            c.needs_secret_order(RB),
            c.pld_steps,
        ),
        compute=None,
        profile=baselines.random_batch_pld_profile,
        protects=Protects.EVERY_ITERATE,
        kind=Kind.PLD,
        lower_estimate=baselines.random_batch_pld_lower_epsilon,
    ),
    BoundSpec(
        id="composition-pld-random-allocation",
        provenance=_RA_PROVENANCE,
        title="random allocation under add-or-remove: the privacy loss distribution of an epoch's allocation, "
        "composed over the epochs (every iterate)",
        reference=f"{_RA_REFERENCE}, composed over the epochs in dp-accounting's PLD (each direction on its own); "
        "derivation in docs/derivations/random-allocation.md",
        covers=_covers((RA,), Relation.ADD_OR_REMOVE_ONE),
        assumptions=_RA_ASSUMES,
        conditions=(c.needs_secret_order(RA), *c.RANDOM_ALLOCATION_PLD),
        compute=None,
        profile=baselines.random_allocation_pld_profile,
        protects=Protects.EVERY_ITERATE,
        kind=Kind.PLD,
    ),
    BoundSpec(
        id="composition-pld-random-allocation-replace-one",
        provenance=_RA_PROVENANCE,
        title="random allocation under replace-one: the remove and add distributions of the run joined through "
        "the run without the record (every iterate)",
        reference=f"{_RA_REFERENCE}, composed over the epochs in dp-accounting's PLD; replace-one by the "
        "triangle inequality of the hockey-stick divergence through the dataset without the record (group "
        "privacy), applied to the whole run; derivation in docs/derivations/random-allocation.md#ra-replace-one",
        covers=_covers((RA,)),
        assumptions=_RA_ASSUMES,
        conditions=(c.needs_secret_order(RA), *c.RANDOM_ALLOCATION_PLD),
        compute=None,
        profile=baselines.random_allocation_replace_one_profile,
        protects=Protects.EVERY_ITERATE,
        kind=Kind.PLD,
    ),
)

_unmarked = [
    spec.id for spec in _TABLE if (c.needs_sgd_update in spec.conditions) != (spec.protects is Protects.FINAL_MODEL)
]
if _unmarked:  # a defect of ours: a last-iterate proof analyses the plain-SGD map, composition covers any update
    raise RuntimeError(f"internal error: rows whose needs_sgd_update does not match what they protect: {_unmarked}")

_missing = [spec.id for spec in _TABLE if spec.provenance is None]
if _missing:  # a defect of ours: every row says where its proof comes from
    raise RuntimeError(f"internal error: rows without a provenance: {_missing}")

#: bound id -> its row. Read-only.
BOUNDS: Mapping[str, BoundSpec] = types.MappingProxyType({spec.id: spec for spec in _TABLE})

BOUND_IDS: tuple[str, ...] = (*BOUNDS, BEST)
