"""The standard every-iterate baselines inside best (docs/derivations/baselines.md#baselines).

Each row's number is pinned (to the formula, to dp-accounting's own accountant, and on
the issue's settings) and checked against exact values on small instances: it is never
below the certified exact epsilon of the 1-D linear instance (G1), and where that instance
attains the row's dominating pair (one Poisson step) it is tight.
"""

from __future__ import annotations

import importlib.metadata
import math

import dp_accounting
import numpy as np
import pytest
from scipy import integrate, special

import lastiter_plugins as lp
from lastiter_plugins import evaluation
from lastiter_plugins.bounds import sampled_gaussian_pld as sgp
from lastiter_plugins.lower_end.exact import g1_laws, g1_params
from lastiter_plugins.profiles import gdp_epsilon

DELTA = 1e-5
AOR = "add_or_remove_one"
GDP_ROW, PLD_ROW, PLD_R1_ROW = (
    "composition-gdp-epochs",
    "composition-pld-poisson",
    "composition-pld-poisson-replace-one",
)
# The issue's settings: a reshuffling loader (n = 60000, b = 1500, z = 3, E = 100) and Opacus' default Poisson pipeline.
RESHUFFLE = dict(dataset_size=60000, batch_size=1500, noise_multiplier=3.0, epochs=100, sampling="reshuffle")
POISSON = dict(dataset_size=60000, batch_size=256, noise_multiplier=1.1, epochs=30, sampling="poisson", relation=AOR)


def _host_pld_epsilon(q: float, z: float, steps: int, relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE):
    accountant = dp_accounting.pld.PLDAccountant(relation)
    accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z)), steps)
    return accountant.get_epsilon(DELTA)


# ---------------------------------------------------------------- epoch schemes: exact mu-GDP


@pytest.mark.parametrize(
    "n, b, steps", [(60000, 1500, 4000), (105, 10, 33), (50, 50, 7)], ids=["issue", "partial-epoch", "full-batch"]
)
@pytest.mark.parametrize("sampling", ["cyclic", "shuffle_once", "reshuffle"])
def test_epoch_row_is_mu_two_sqrt_epochs_over_z(n, b, steps, sampling):
    params = dict(dataset_size=n, batch_size=b, noise_multiplier=3.0, steps=steps, sampling=sampling)
    epochs = math.ceil(steps / math.ceil(n / b))  # epochs started, a partial last one included
    profile = lp.BOUNDS[GDP_ROW].profile(*lp.build(**params))
    assert profile.mus == (2.0 * math.sqrt(epochs) / 3.0,) and profile.weights == (1.0,)
    result = lp.epsilon(GDP_ROW, DELTA, **params)
    assert result.epsilon == gdp_epsilon(2.0 * math.sqrt(epochs) / 3.0, DELTA)
    assert result.protects is lp.Protects.EVERY_ITERATE and result.kind is lp.Kind.GDP and result.order is None
    # the same mechanism's RDP: identical curve (alpha mu^2/2), a larger epsilon
    orders = np.array([1.5, 2.0, 10.0])
    np.testing.assert_allclose(lp.rdp(GDP_ROW, orders, **params), lp.rdp("composition", orders, **params), rtol=1e-12)
    assert result.epsilon < lp.epsilon("composition", DELTA, **params).epsilon


def test_epoch_row_on_the_issue_setting():
    """Reshuffle, n = 60000, b = 1500, z = 3, E = 100: 49.88 (the RDP composition gave 52.58)."""
    assert lp.epsilon(GDP_ROW, DELTA, **RESHUFFLE).epsilon == pytest.approx(49.88371, rel=1e-6)
    assert lp.epsilon("composition", DELTA, **RESHUFFLE).epsilon == pytest.approx(52.58, rel=1e-3)
    best = lp.epsilon("best", DELTA, **RESHUFFLE)
    assert (best.winner, best.epsilon) == (GDP_ROW, lp.epsilon(GDP_ROW, DELTA, **RESHUFFLE).epsilon)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # dp-accounting 0.4.3 calls float() on an array
@pytest.mark.parametrize("epochs", [1, 7, 100])
def test_epoch_row_is_dp_accountings_gaussian(epochs):
    """What compare showed as dp-accounting-pld-epoch: GaussianDpEvent(z/2) x E in the PLD accountant."""
    z = 3.0
    ours = lp.epsilon(GDP_ROW, DELTA, dataset_size=10, batch_size=5, noise_multiplier=z, epochs=epochs,
                      sampling="cyclic").epsilon  # fmt: skip
    # ADD_OR_REMOVE_ONE: a shift of 1 per event in both 0.4.3 and 0.6 (0.6's PLD doubles it under REPLACE_ONE)
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(z / 2.0), epochs)
    theirs = accountant.get_epsilon(DELTA)
    assert ours == pytest.approx(theirs, rel=1e-3)
    assert ours <= theirs * (1 + 1e-9)  # the PLD accountant discretises pessimistically
    loss = dp_accounting.pld.privacy_loss_mechanism.GaussianPrivacyLoss(z / (2.0 * math.sqrt(epochs)))
    assert loss.get_delta_for_epsilon(ours) <= DELTA * (1 + 1e-9)  # rounded up, never below the target
    assert loss.get_delta_for_epsilon(ours * (1 - 1e-6)) > DELTA


@pytest.mark.parametrize(
    "sampling, n, b, steps", [("cyclic", 4, 2, 5), ("reshuffle", 6, 2, 7), ("shuffle_once", 5, 2, 6)]
)
def test_epoch_row_is_never_below_the_exact_last_iterate(sampling, n, b, steps):
    params = g1_params(dataset_size=n, batch_size=b, noise_multiplier=1.3, steps=steps, sampling=sampling)
    exact_lower, _ = g1_laws(params).hockey_stick().epsilon(DELTA)
    row = lp.epsilon(GDP_ROW, DELTA, **params).epsilon
    assert exact_lower <= row


# ---------------------------------------------------------------- Poisson: the PLD rows


@pytest.mark.parametrize(
    "n, b, z, steps", [(60000, 256, 1.1, 7050), (100, 10, 1.0, 30), (60000, 1500, 3.0, 400), (5, 5, 2.0, 5)],
    ids=["opacus", "q=0.1", "issue-z3", "q=1"],
)  # fmt: skip
def test_poisson_row_equals_dp_accountings_pld_accountant(n, b, z, steps):
    params = dict(dataset_size=n, batch_size=b, noise_multiplier=z, steps=steps, sampling="poisson", relation=AOR)
    config, _ = lp.build(**params)
    ours = lp.epsilon(PLD_ROW, DELTA, **params)
    assert ours.epsilon == pytest.approx(_host_pld_epsilon(config.sampling_probability, z, steps), rel=1e-6)
    assert ours.kind is lp.Kind.PLD and ours.protects is lp.Protects.EVERY_ITERATE and ours.order is None


def test_poisson_rows_on_the_issue_setting():
    """Opacus' pipeline (n = 60000, b = 256, z = 1.1, 30 epochs): 1.64 (the RDP composition gave 1.80)."""
    assert lp.epsilon(PLD_ROW, DELTA, **POISSON).epsilon == pytest.approx(1.63851, rel=1e-4)
    assert lp.epsilon("composition", DELTA, **POISSON).epsilon == pytest.approx(1.796, rel=1e-3)
    best = lp.epsilon("best", DELTA, **POISSON)
    assert (best.winner, best.relation) == (PLD_ROW, lp.Relation.ADD_OR_REMOVE_ONE)
    replace_one = {**POISSON, "relation": "replace_one"}
    r1 = lp.epsilon("best", DELTA, **replace_one)
    assert (r1.winner, r1.relation) == (PLD_R1_ROW, lp.Relation.REPLACE_ONE)
    assert r1.epsilon == pytest.approx(2.84697, rel=1e-4)  # before: no baseline at all (refused)


@pytest.mark.parametrize("relation", [AOR, "replace_one"])
@pytest.mark.parametrize("steps", [1, 2, 3, 5])
def test_poisson_rows_are_never_below_the_exact_last_iterate(relation, steps):
    """G1 (linear losses) with Poisson batches: the last iterate is a Binomial mixture of Gaussians, a
    post-processing of the release the rows certify. With one step the release is the row's own pair
    (the replace-one pair of docs/derivations/baselines.md#poisson-replace-one-pair, the remove pair), so the row is
    tight there."""
    row = PLD_ROW if relation == AOR else PLD_R1_ROW
    params = g1_params(dataset_size=20, batch_size=4, noise_multiplier=0.8, steps=steps, sampling="poisson",
                       relation=relation)  # fmt: skip
    exact_lower, exact_upper = g1_laws(params).hockey_stick().epsilon(DELTA)
    ours = lp.epsilon(row, DELTA, **params).epsilon
    assert exact_lower <= ours
    if steps == 1:
        assert ours <= exact_upper * 1.002  # discretisation 1e-4 only


def _hockey(a: float, q: float, u: np.ndarray, v: np.ndarray) -> float:
    r"""H_a(P_u || P_v), P_w = (1-q) N(0, I) + q N(w, I) in 2-D: E[(A + q e^{U - |u|^2/2} - a q e^{V - |v|^2/2})_+]
    with (U, V) = (<u, Y>, <v, Y>); V given U is normal, so the inner expectation is a put price in closed
    form and the outer one a smooth 1-D integral (adaptive quadrature)."""
    a1, b1, c = float(u @ u), float(v @ v), float(u @ v)
    cond_var = max(b1 - c * c / a1, 1e-300)
    sd = math.sqrt(cond_var)
    m = a * q * math.exp(-b1 / 2)

    def inner(t: float) -> float:
        k = (1 - a) * (1 - q) + q * math.exp(t - a1 / 2)
        if k <= 0:
            return 0.0
        mean = c * t / a1
        d = (math.log(k / m) - mean) / sd
        return k * special.ndtr(d) - m * math.exp(mean + cond_var / 2) * special.ndtr(d - sd)

    value, _ = integrate.quad(
        lambda t: inner(t) * math.exp(-t * t / (2 * a1)) / math.sqrt(2 * math.pi * a1),
        -12 * math.sqrt(a1), 12 * math.sqrt(a1), epsabs=1e-13, epsrel=1e-11, limit=400,
    )  # fmt: skip
    return value


def test_replace_one_pair_dominates_every_configuration():
    """The theorem of docs/derivations/baselines.md#poisson-replace-one-pair on random configurations: for gradients u,
    v in the disk of
    radius s = 1/z (2-D covers every configuration) and any a = e^eps, H_a(P_u || P_v) <= H_a(P*, Q*),
    the pair's profile in closed form (what the row discretises; a < 1 by the pair's symmetry)."""
    rng = np.random.default_rng(19)
    worst = -1.0
    for _ in range(300):
        q, s, eps = rng.uniform(0.01, 1.0), rng.uniform(0.1, 2.0), rng.uniform(-3.0, 3.0)
        radius, angle = s * np.sqrt(rng.uniform(size=2)), rng.uniform(0, 2 * math.pi, size=2)
        u, v = (np.array([r * math.cos(t), r * math.sin(t)]) for r, t in zip(radius, angle, strict=True))
        kw = {"sampling_probability": q, "noise_multiplier": 1 / s, "adjacency": "replace"}
        a = math.exp(eps)
        star = sgp.hockey_stick(abs(eps), **kw)[0]
        star = star if eps >= 0 else 1 - a + a * star  # H_a(P||Q) = 1 - a + a H_{1/a}(Q||P), Q||P mirrors P||Q
        worst = max(worst, _hockey(a, q, u, v) - star)
    assert worst <= 1e-9
    # and the pair itself is attained (the bound is tight for one step)
    u, v = np.array([0.8, 0.0]), np.array([-0.8, 1e-4])
    kw = {"sampling_probability": 0.3, "noise_multiplier": 1 / 0.8, "adjacency": "replace"}
    assert _hockey(2.0, 0.3, u, v) == pytest.approx(sgp.hockey_stick(math.log(2.0), **kw)[0], rel=1e-5)


def test_replace_one_row_on_dp_accounting_hosts():
    """0.4.3 refuses Poisson under REPLACE_ONE; 0.5 and later compose the same pair: equal to 1e-6."""
    q, z, steps = 256 / 60000, 1.1, 7050
    params = dict(dataset_size=60000, batch_size=256, noise_multiplier=z, steps=steps, sampling="poisson",
                  relation="replace_one")  # fmt: skip
    ours = lp.epsilon(PLD_R1_ROW, DELTA, **params).epsilon
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    version = tuple(int(x) for x in importlib.metadata.version("dp-accounting").split(".")[:2])
    if version < (0, 5):
        assert not accountant.supports(event)  # why the row builds the pair itself
        return
    assert ours == pytest.approx(_host_pld_epsilon(q, z, steps, dp_accounting.NeighboringRelation.REPLACE_ONE),
                                 rel=1e-6)  # fmt: skip


@pytest.mark.parametrize("adjacency", ["remove", "add", "replace"])
def test_single_step_profile_is_dp_accountings(adjacency):
    """The vectorised hockey stick equals dp-accounting's GaussianPrivacyLoss (remove/add on 0.4.3)."""
    mechanism = dp_accounting.pld.privacy_loss_mechanism
    kind = {"remove": "REMOVE", "add": "ADD", "replace": "REPLACE"}[adjacency]
    if not hasattr(mechanism.AdjacencyType, kind):
        pytest.skip(f"dp-accounting {kind} adjacency not available")
    q, z = 0.05, 0.9
    try:
        host = mechanism.GaussianPrivacyLoss(z, sampling_prob=q, adjacency_type=getattr(mechanism.AdjacencyType, kind))
    except NotImplementedError:
        pytest.skip(f"dp-accounting has no {kind} Gaussian")
    eps = np.array([-0.5, 0.0, 0.01, 0.3, 1.0, 3.0])
    ours = sgp.hockey_stick(eps, sampling_probability=q, noise_multiplier=z, adjacency=adjacency)
    np.testing.assert_allclose(ours, host.get_delta_for_epsilon(eps), rtol=1e-9, atol=1e-15)


def _hand_made_sparse_pld():
    """A sparse PLD (dp-accounting keeps PMFs of at most 1000 losses sparse) with two PMFs and an infinite loss."""
    pmf = dp_accounting.pld.pld_pmf.create_pmf
    remove = pmf({-3: 0.2, 5: 0.5, 100: 0.2999}, 1e-2, 1e-4, True)
    add = pmf({2: 0.7, 40: 0.25, 300: 0.05}, 1e-2, 0.0, True)
    return dp_accounting.pld.privacy_loss_distribution.PrivacyLossDistribution(remove, add).self_compose(3)


# (q, z, T, add_or_remove) of sgp.composed, or None: the hand-made sparse PLD
VECTORISED_CASES = {
    "aor-T10": (0.05, 2.0, 10, True),
    "replace-T10": (0.05, 2.0, 10, False),
    "aor-T1": (0.2, 3.0, 1, True),
    "replace-T1": (0.2, 3.0, 1, False),
    "aor-T100": (0.01, 5.0, 100, True),
    "sparse-limit-pair": (1e-3, 0.01, 3, True),
    "sparse-hand-made": None,
}


@pytest.mark.parametrize("case", list(VECTORISED_CASES.values()), ids=list(VECTORISED_CASES))
def test_vectorised_delta_and_epsilon_are_dp_accountings(case):
    """sgp.delta_for_epsilon / epsilon_for_delta (what the PLD rows use) equal dp-accounting's own
    get_delta_for_epsilon / get_epsilon_for_delta on the installed version (0.4.3 in .venv, 0.6 in
    .venv-dpa06), dense and sparse PMFs: to 1e-12 relative, never smaller. Deltas may exceed the
    host's by the PMF's negative probabilities (FFT noise, about -1e-15 each), which are taken as 0."""
    pld = _hand_made_sparse_pld() if case is None else sgp.composed(*case)
    pmfs = sgp._host_pmfs(pld)
    noise = sum(float(-np.minimum(sgp._host_pmf(p).probs, 0.0).sum()) for p in pmfs)
    assert noise < 1e-12
    sparse = isinstance(pmfs[0], dp_accounting.pld.pld_pmf.SparsePLDPmf)
    assert sparse == (case is None or case[1] < 0.1), [type(p) for p in pmfs]  # the cases cover both kinds
    assert len(pmfs) == (2 if case is None or case[3] else 1)
    for eps in [-1.0, 0.0, 0.05, 0.3, 1.0, 3.0, math.inf]:
        host, ours = float(pld.get_delta_for_epsilon(eps)), sgp.delta_for_epsilon(pld, eps)
        assert host <= ours <= host + 1e-12 * abs(host) + noise, (eps, host, ours)
    for delta in [0.5, 1e-2, 1e-5, 1e-9, 1e-13, 0.0]:
        host, ours = float(pld.get_epsilon_for_delta(delta)), sgp.epsilon_for_delta(pld, delta)
        # the host's value, raised only as far as our delta (negative probabilities taken as 0) needs
        assert host <= ours, (delta, host, ours)
        assert ours == host or sgp.delta_for_epsilon(pld, host) > delta, (delta, host, ours)
        assert not math.isfinite(ours) or sgp.delta_for_epsilon(pld, ours) <= delta, (delta, ours)
        if delta >= 1e-9:  # below, the host's FFT noise (1e-15 a probability) moves epsilon visibly
            assert ours <= host + 1e-6 * max(1.0, abs(host)), (delta, host, ours)
    if case is not None:  # the row's profile uses them (delta clipped to 1)
        q, z, steps, add_or_remove = case
        relation = lp.Relation.ADD_OR_REMOVE_ONE if add_or_remove else lp.Relation.REPLACE_ONE
        profile = lp.baselines.PoissonPldProfile(q, z, steps, relation)
        # the row adds its FFT noise margin (docs/derivations/baselines.md#fft-noise-margin): at least 1e-12, ten times
        # the negative mass
        margin = lp.baselines.fft_noise_margin(pld)
        assert margin >= max(1e-12, 10 * noise)
        assert profile.epsilon(DELTA) == sgp.epsilon_for_delta(pld, DELTA - margin)
        host = float(pld.get_delta_for_epsilon(0.3))
        assert min(host + margin, 1.0) <= profile.delta(0.3) <= min(host * (1 + 1e-12) + noise + margin, 1.0)


# ---------------------------------------------------------------- evaluated only when they can change best


@pytest.mark.parametrize(
    "q, z, steps, add_or_remove",
    [(256 / 60000, 1.1, 7050, True), (256 / 60000, 1.1, 7050, False), (0.1, 1.0, 30, True), (0.025, 3.0, 4000, False)],
)
def test_lower_estimate_is_below_the_pld_and_close_enough_to_be_useful(q, z, steps, add_or_remove):
    lower = sgp.binarised_lower_epsilon(
        DELTA, sampling_probability=q, noise_multiplier=z, steps=steps, add_or_remove=add_or_remove
    )
    pld = sgp.composed(q, z, steps, add_or_remove).get_epsilon_for_delta(DELTA)
    assert 0.5 * pld < lower <= pld


def test_lower_estimate_is_below_the_exact_epsilon():
    """One step, replace-one: the binarised estimate is below the certified exact epsilon of the pair."""
    params = g1_params(dataset_size=20, batch_size=4, noise_multiplier=0.8, steps=1, sampling="poisson")
    exact_lower, _ = g1_laws(params).hockey_stick().epsilon(1e-3)
    lower = sgp.binarised_lower_epsilon(1e-3, sampling_probability=0.2, noise_multiplier=0.8, steps=1,
                                        add_or_remove=False)  # fmt: skip
    assert 0 < lower <= exact_lower


def test_best_skips_a_pld_row_that_cannot_win_and_keeps_the_minimum():
    """A long run in a small projection ball: bounded-domain-random (independent of T, 9.0) wins by far
    over the PLD (about 50), so the PLD row is not computed."""
    params = dict(dataset_size=1000, batch_size=10, noise_multiplier=1.0, steps=200_000, sampling="poisson",
                  relation="replace_one", learning_rate=0.01, smoothness=1.0, diameter=1e-4,
                  gradient_norms_within_clip=True)  # fmt: skip
    config, assumptions = lp.build(**params)
    lazy = evaluation.evaluate_for_best(config, assumptions, DELTA)
    assert lazy[PLD_R1_ROW].applies and lazy[PLD_R1_ROW].result is None
    assert "not computed: a proven lower bound on its epsilon" in lazy[PLD_R1_ROW].notes[0]
    full = lp.applicable_bounds(delta=DELTA, config=config, assumptions=assumptions)
    candidates = [e for b, e in full.items() if b != lp.BEST and e.applies and e.proof.proven and e.result is not None]
    best = lp.epsilon("best", DELTA, **params)
    assert best.winner == "bounded-domain-random"
    assert (
        best.epsilon == min(e.epsilon for e in candidates) == full[lp.BEST].epsilon
    )  # the same minimum as computing everything
    assert full[PLD_R1_ROW].epsilon > 2 * best.epsilon


def test_pld_rows_need_at_most_a_million_steps():
    params = dict(dataset_size=60000, batch_size=256, noise_multiplier=1.1, steps=10**6 + 1, sampling="poisson",
                  relation="replace_one")  # fmt: skip
    table = lp.applicable_bounds(**params)
    assert not table[PLD_R1_ROW].applies and "steps must be <= 1e+06" in table[PLD_R1_ROW].reason
    with pytest.raises(lp.NotApplicableError, match="no proven bound applies"):
        lp.epsilon("best", DELTA, **params)  # replace-one Poisson has no RDP baseline
    aor = lp.epsilon("best", DELTA, **{**params, "relation": AOR})
    assert aor.winner == "composition"  # the RDP composition remains


def test_the_cache_answers_only_for_its_own_parameters():
    q, z, steps = 0.05, 1.2, 40
    first = sgp.composed(q, z, steps, True)
    assert sgp.composed(q, z, steps, True) is first
    others = [sgp.composed(q, z * 1.01, steps, True), sgp.composed(q * 1.01, z, steps, True),
              sgp.composed(q, z, steps + 1, True), sgp.composed(q, z, steps, False)]  # fmt: skip
    values = {pld.get_epsilon_for_delta(DELTA) for pld in [first, *others]}
    assert len(values) == 5 and all(pld is not first for pld in others)
    params = dict(dataset_size=100, batch_size=5, noise_multiplier=z, steps=steps, sampling="poisson", relation=AOR)
    eps = [lp.epsilon(PLD_ROW, DELTA, **{**params, "noise_multiplier": zz}).epsilon for zz in (z, z * 1.01, z)]
    assert eps[0] == eps[2] > eps[1]


def test_pld_delta_at_an_epsilon_where_exp_overflows():
    """e^eps overflows above 709: delta is the mass at infinity (never NaN, never negative)."""
    from lastiter_plugins.baselines import PoissonPldProfile

    for relation in (lp.Relation.REPLACE_ONE, lp.Relation.ADD_OR_REMOVE_ONE):
        profile = PoissonPldProfile(0.25, 1.0, 3, relation)
        values = [profile.delta(eps) for eps in (50.0, 800.0, 1e4, math.inf)]
        assert all(math.isfinite(v) and 0.0 <= v <= 1e-9 for v in values), values
        assert values[1] == values[2] == values[3]


def test_pld_delta_is_never_negative_where_the_host_sum_cancels():
    """The fuzzing's instance (G1 Poisson replace-one, q = 1/11, z = 1.75, T = 62): dp-accounting
    0.4.3's running sums gave delta = -1.3e-15 at eps = 7.92 (exact: 2.5e-20); the sum of
    non-negative terms never cancels."""
    from lastiter_plugins.baselines import PoissonPldProfile

    profile = PoissonPldProfile(5 / 55, 1.7513213314255691, 62, lp.Relation.REPLACE_ONE)
    for eps in (4.0, 7.92237, 10.0, 13.4159):
        assert profile.delta(eps) >= 0.0, eps
