"""lastiter_plugins/host.py: the host contract (departures gate rows, not runs; the host's own number)."""

from __future__ import annotations

import math
import sys
import warnings
from statistics import NormalDist

import numpy as np
import pytest
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp

import lastiter_plugins as lp
from lastiter_plugins import host
from tests.support import strongly_convex

DELTA = 1e-5
ADAM = host.Departure(step=1, fact="the optimizer is torch.optim.Adam", changes={"update": "any"})


def _pipeline(**overrides):
    return lp.build(**strongly_convex(sampling="shuffle_once", relation="replace_one", **overrides))


def test_without_departures_the_account_is_best():
    config, assumptions = _pipeline()
    acc = host.account(host.Declaration(), config, assumptions, DELTA)
    assert acc.result == lp.epsilon("best", DELTA, config=config, assumptions=assumptions)
    assert acc.rows_left == () and acc.config == config and acc.assumptions == assumptions


def test_a_departure_removes_exactly_the_rows_it_breaks_and_says_when():
    config, assumptions = _pipeline()
    declared = {e.bound for e in lp.applicable_bounds(config=config, assumptions=assumptions).values() if e.applies}
    acc = host.account(host.Declaration(), config, assumptions, DELTA, [ADAM])
    assert acc.config.update is lp.Update.ANY
    assert acc.result == lp.epsilon("best", DELTA, config=config.replace(update="any"), assumptions=assumptions)
    assert acc.result.protects is lp.Protects.EVERY_ITERATE
    left = {r.bound for r in acc.rows_left}
    assert left == {b for b in declared - {"best"} if lp.BOUNDS[b].protects is lp.Protects.FINAL_MODEL}
    assert left and all(r.step == 1 and r.fact == ADAM.fact and "update=any" in r.condition for r in acc.rows_left)


def test_each_row_leaves_at_the_first_departure_that_breaks_it():
    config, assumptions = _pipeline()
    within = host.Departure(3, "a per-example gradient norm 1.7 > C = 1", {"gradient_norms_within_clip": False})
    acc = host.account(
        host.Declaration(), config, assumptions, DELTA, [ADAM.__class__(9, ADAM.fact, ADAM.changes), within]
    )
    steps = {r.bound: r.step for r in acc.rows_left}
    assert steps["shifted-interpolation-shuffle"] == 3  # needs the gradients within the clip: left at step 3
    assert all(step in (3, 9) for step in steps.values())
    assert 9 in steps.values()  # the rows that needed no more than the SGD update left at step 9


def test_the_named_bound_broken_is_refused_naming_the_departure():
    config, assumptions = _pipeline()
    declaration = host.Declaration(bound="shifted-interpolation-shuffle")
    host.account(declaration, config, assumptions, DELTA)  # applies as declared
    with pytest.raises(lp.NotApplicableError, match=r"step 1: the optimizer is torch\.optim\.Adam"):
        host.account(declaration, config, assumptions, DELTA, [ADAM])


def test_require_last_iterate_refuses_an_every_iterate_number():
    config, assumptions = _pipeline()
    declaration = host.Declaration(require=host.LAST_ITERATE)
    assert host.account(declaration, config, assumptions, DELTA).result.protects is lp.Protects.FINAL_MODEL
    with pytest.raises(lp.NotApplicableError, match=r"require='last_iterate'.*composition-gdp-epochs"):
        host.account(declaration, config, assumptions, DELTA, [ADAM])


def test_require_last_iterate_keeps_best_while_a_last_iterate_row_is_left():
    # cyclic, 2 epochs: composition-gdp-epochs beats shifted-interpolation-cyclic after the first epoch
    config = lp.TrainingConfig(dataset_size=64, batch_size=16, noise_multiplier=1.3, steps=4, sampling="cyclic",
                               learning_rate=0.05)  # fmt: skip
    assumptions = lp.LossAssumptions(smoothness=0.25, gradient_norms_within_clip=True)
    declaration = host.Declaration(require=host.LAST_ITERATE)
    best = lp.epsilon("best", DELTA, config=config, assumptions=assumptions)
    assert best.protects is lp.Protects.EVERY_ITERATE  # the every-iterate row wins here
    assert host.account(declaration, config, assumptions, DELTA).result == best
    with pytest.raises(lp.NotApplicableError, match="require='last_iterate'"):
        host.account(declaration, config, assumptions, DELTA, [ADAM])


@pytest.mark.parametrize(
    "changes",
    [{"gradient_norms_within_clip": True}, {"update": "sgd"}, {"strong_convexity": 0.5}, {"sampling": "poisson"}, {}],
    ids=["declares-more", "sgd", "stronger", "another-field", "nothing"],
)
def test_a_departure_can_only_weaken_the_pipeline(changes):
    with pytest.raises(ValueError, match="departure"):
        host.Departure(step=2, fact="x", changes=changes)


def test_learning_rate_left_out_lists_the_rows_that_need_it():
    config, assumptions = _pipeline(learning_rate=None)
    need = host.rows_needing("learning_rate", config, assumptions)
    assert "ye-shokri-shuffle" in need and "composition-gdp-epochs" not in need
    given = lp.applicable_bounds(config=_pipeline()[0], assumptions=assumptions)
    assert any(given[b].applies for b in need)
    assert all(u.required.startswith("learning_rate") for b in need for u in given[b].unmet)


def test_the_hosts_number_is_marked_not_valid_where_its_sampling_fails():
    shuffled = lp.TrainingConfig.from_epochs(
        epochs=3, dataset_size=1000, batch_size=50, noise_multiplier=1.0, sampling="reshuffle"
    )
    numbers = {h.id: h for h in host.host_numbers(shuffled, DELTA, "opacus")}
    prv = numbers["opacus-prv"]
    assert not prv.valid and "poisson" in prv.why_not and "NOT VALID" in str(prv)
    valid = lp.epsilon("best", DELTA, config=shuffled, assumptions=lp.LossAssumptions())
    assert prv.epsilon is not None and prv.epsilon < valid.epsilon  # the mistake the report exists to show
    poisson = shuffled.replace(sampling="poisson", relation="add_or_remove_one")
    prv = {h.id: h for h in host.host_numbers(poisson, DELTA, "opacus")}["opacus-prv"]
    assert prv.valid and prv.epsilon == pytest.approx(
        lp.epsilon("composition-pld-poisson", DELTA, config=poisson, assumptions=lp.LossAssumptions()).epsilon, rel=0.05
    )


def test_refusal_names_the_broken_named_bound_and_is_none_while_it_holds():
    config, assumptions = _pipeline()
    named = host.Declaration(bound="shifted-interpolation-shuffle")
    assert host.refusal(named, config, assumptions) is None
    why = host.refusal(named, config, assumptions, [ADAM])
    assert why is not None and "shifted-interpolation-shuffle must apply" in why and "update=any" in why
    with pytest.raises(lp.NotApplicableError):  # account refuses exactly where refusal says so
        host.account(named, config, assumptions, DELTA, [ADAM])


def test_refusal_under_require_last_iterate_and_never_for_best_while_composition_is_left():
    config, assumptions = _pipeline()
    assert host.refusal(host.Declaration(), config, assumptions, [ADAM]) is None
    last = host.Declaration(require=host.LAST_ITERATE)
    assert host.refusal(last, config, assumptions) is None
    why = host.refusal(last, config, assumptions, [ADAM])
    assert why is not None and "composition-gdp-epochs" in why and "step 1: the optimizer is torch.optim.Adam" in why


def test_published_note_is_the_cores():
    config, assumptions = _pipeline()
    result = lp.epsilon("best", DELTA, config=config, assumptions=assumptions)
    from lastiter_plugins import evaluation

    assert host.published_note(result, config, assumptions) == evaluation.published_note(result, config, assumptions)


# ---------------------------------------------------------------- composing a run with the host's mechanisms

#: issue 38's random-batch run: within the clip, strongly convex, projected (altschuler-talwar, unproven, applies)
RANDOM_BATCH = dict(dataset_size=1000, batch_size=50, noise_multiplier=4.0, steps=400, learning_rate=1.0,
                    smoothness=0.25, strong_convexity=0.05, gradient_norms_within_clip=True, diameter=2.0,
                    sampling="random_batch", relation="replace_one")  # fmt: skip
#: one pipeline per kind of row: Renyi curves, f-DP profiles (one Gaussian, mixtures), PLD profiles
KINDS = {
    "random_batch": RANDOM_BATCH,
    "shuffle_once": strongly_convex(sampling="shuffle_once", relation="replace_one"),
    "cyclic": dict(dataset_size=1000, batch_size=50, noise_multiplier=4.0, steps=400, learning_rate=1.0,
                   smoothness=0.25, gradient_norms_within_clip=True, sampling="cyclic"),
    "poisson": dict(dataset_size=1000, batch_size=50, noise_multiplier=1.0, steps=200, sampling="poisson",
                    relation="add_or_remove_one"),
}  # fmt: skip


def _applying(config, assumptions):
    table = lp.applicable_bounds(config=config, assumptions=assumptions)
    return [bid for bid, e in table.items() if e.applies and bid != lp.BEST]


@pytest.mark.parametrize("params", KINDS.values(), ids=KINDS.keys())
def test_rows_are_bests_candidates_or_the_named_row_which_must_apply(params):
    config, assumptions = lp.build(**params)
    table = lp.applicable_bounds(config=config, assumptions=assumptions)
    best = [spec.id for spec in host.rows(lp.BEST, config, assumptions)]
    assert best and best == [b for b in lp.BOUNDS if table[b].applies and lp.BOUNDS[b].proof.proven]
    assert table[lp.BEST].reference.startswith("minimum over " + ", ".join(best))
    for bid in lp.BOUNDS:
        if table[bid].applies:
            assert host.rows(bid, config, assumptions) == (lp.BOUNDS[bid],)
        else:
            with pytest.raises(lp.NotApplicableError):
                host.rows(bid, config, assumptions)


def test_rows_with_published_only_keep_the_published_theorems():
    config, assumptions = _pipeline()
    published = host.rows(lp.BEST, config, assumptions, published_only=True)
    every = host.rows(lp.BEST, config, assumptions)
    derived = [s.id for s in every if s not in published]
    assert published and derived  # this pipeline has both
    with pytest.raises(lp.NotApplicableError, match="published_only"):
        host.rows(derived[0], config, assumptions, published_only=True)


@pytest.mark.parametrize("params", KINDS.values(), ids=KINDS.keys())
def test_delta_of_is_the_counterpart_of_epsilon_for_best_and_every_row(params):
    config, assumptions = lp.build(**params)
    for bid in [lp.BEST, *_applying(config, assumptions)]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", lp.OrderGridWarning)
            result = lp.epsilon(bid, DELTA, config=config, assumptions=assumptions)
            delta, order = host.delta_of(bid, config, assumptions, result.epsilon)
        assert delta <= DELTA * (1 + 1e-6), bid  # the epsilon at DELTA has delta at most DELTA
        assert (order is None) == (result.order is None), bid


@pytest.mark.parametrize("params", KINDS.values(), ids=KINDS.keys())
def test_delta_at_a_huge_epsilon_is_a_number_on_every_row(params):
    """issue 38: delta at epsilon 1e308 raised scipy's "f(a) and f(b) must have different signs" (best on the
    random-batch run); every row answers a delta in [0, 1], 0 for the Renyi rows, without a warning."""
    config, assumptions = lp.build(**params)
    for bid in [lp.BEST, *_applying(config, assumptions)]:
        for eps in (1e300, 1e308, sys.float_info.max, math.inf):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                delta, _ = host.delta_of(bid, config, assumptions, eps)
            assert 0.0 <= delta <= host.delta_of(bid, config, assumptions, 10.0)[0], (bid, eps)
            if lp.BOUNDS.get(bid, lp.BOUNDS["composition"]).kind is lp.Kind.RDP and bid != lp.BEST:
                assert delta == 0.0, (bid, eps)


@pytest.mark.parametrize(
    ("epsilon", "fragment"),
    [(-1.0, "epsilon must be a number >= 0. Found -1.0."), (math.nan, "Found nan"),
     (10**400, "epsilon must be a number >= 0 that a double holds (at most 1.8e308, or inf). Found 1.000e+400")],
    ids=["negative", "nan", "1e400"],
)  # fmt: skip
def test_delta_of_refuses_an_invalid_epsilon_in_one_line(epsilon, fragment):
    config, assumptions = lp.build(**RANDOM_BATCH)
    with pytest.raises(ValueError) as info:
        host.delta_of(lp.BEST, config, assumptions, epsilon)
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_gaussian_mus_one_per_component_of_a_gdp_rows_profile():
    cyclic, cyclic_a = lp.build(**KINDS["cyclic"])
    shuffled, shuffled_a = lp.build(**KINDS["cyclic"] | {"sampling": "shuffle_once"})
    (mu,) = host.gaussian_mus(lp.BOUNDS["shifted-interpolation-cyclic"], cyclic, cyclic_a)
    profile = lp.applicable_bounds(delta=DELTA, config=cyclic, assumptions=cyclic_a)[
        "shifted-interpolation-cyclic"
    ].profile
    assert profile is not None and profile.delta(1.0) == pytest.approx(host.gaussian_delta(mu, 1.0), rel=1e-12)
    assert len(host.gaussian_mus(lp.BOUNDS["shifted-interpolation-shuffle"], shuffled, shuffled_a)) > 1
    # a profile that is no Gaussian mixture (Poisson's dominating pair, the smaller of two profiles): no mus
    convex = dict(dataset_size=1000, batch_size=50, noise_multiplier=1.0, steps=200, learning_rate=1.0,
                  smoothness=1.0, gradient_norms_within_clip=True)  # fmt: skip
    for bound, sampling, relation in [
        ("shifted-interpolation-poisson", "poisson", "add_or_remove_one"),
        ("shifted-interpolation-random-batch", "random_batch", "replace_one"),
    ]:
        config, assumptions = lp.build(**convex, sampling=sampling, relation=relation)
        assert host.gaussian_mus(lp.BOUNDS[bound], config, assumptions) == ()
    with pytest.raises(ValueError, match=r"spec must be a GDP row.*kong-ribero-cyclic, a rdp row"):
        host.gaussian_mus(lp.BOUNDS["kong-ribero-cyclic"], cyclic, cyclic_a)


@pytest.mark.parametrize(
    ("mu", "epsilon", "expected"),
    [(1.0, 0.0, 2 * NormalDist().cdf(0.5) - 1), (2.0, 1.0, NormalDist().cdf(0.5) - math.e * NormalDist().cdf(-1.5)),
     (0.0, 1.0, 0.0), (1.0, math.inf, 0.0)],
    ids=["mu1-eps0", "mu2-eps1", "mu0", "eps-inf"],
)  # fmt: skip
def test_gaussian_delta_is_mu_gdps_exact_profile(mu, epsilon, expected):
    # Dong, Roth & Su 2019, Cor. 2.13: Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
    assert host.gaussian_delta(mu, epsilon) == pytest.approx(expected, rel=1e-12, abs=1e-300)


def test_rdp_to_epsilon_is_dp_accountings_conversion_on_the_grid():
    orders = np.array([1.5, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0])
    config, assumptions = lp.build(**KINDS["poisson"])
    curve = 3 * lp.rdp("composition", orders, config=config, assumptions=assumptions)  # a host's sum, say
    eps, order = host.rdp_to_epsilon(orders, curve, DELTA)
    assert (eps, order) == pytest.approx(dp_rdp.compute_epsilon(orders, curve, DELTA), rel=1e-12)
    with pytest.warns(lp.OrderGridWarning):
        host.rdp_to_epsilon(orders[:2], curve[:2], DELTA)  # the optimum at the grid's edge
    with pytest.raises(ValueError, match=r"delta must be in \(0, 1\)"):
        host.rdp_to_epsilon(orders, curve, 0.0)


def test_warn_if_unproven_warns_for_an_unproven_row_only():
    unproven = [b for b, spec in lp.BOUNDS.items() if not spec.proof.proven]
    assert unproven == ["altschuler-talwar"]
    with pytest.warns(lp.UnprovenBoundWarning, match=r"altschuler-talwar is unproven: .* not a privacy guarantee"):
        host.warn_if_unproven("altschuler-talwar")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for bound in (lp.BEST, "composition", "kong-ribero-cyclic"):
            host.warn_if_unproven(bound)


def test_tf_privacy_statement_numbers_are_marked_where_they_are_not_proven(monkeypatch):
    from lastiter_plugins.compare import hosts

    monkeypatch.setattr(hosts, "_host_available", lambda name: True)  # computed with dp-accounting alone
    shuffled = lp.TrainingConfig.from_epochs(
        epochs=3, dataset_size=1000, batch_size=50, noise_multiplier=1.0, sampling="reshuffle"
    )
    numbers = {h.id: h for h in host.host_numbers(shuffled, DELTA, "tf_privacy")}
    assert set(numbers) == {"tf-privacy-epochs", "tf-privacy-poisson"}
    epochs, poisson = numbers["tf-privacy-epochs"], numbers["tf-privacy-poisson"]
    assert not poisson.valid and "poisson" in poisson.why_not and "NOT VALID" in str(poisson)
    assert not epochs.valid and "fixed batch size" in epochs.why_not  # add-or-remove at C: not proven here
    valid = lp.epsilon("best", DELTA, config=shuffled, assumptions=lp.LossAssumptions())
    assert poisson.epsilon < epochs.epsilon < valid.epsilon  # TF Privacy's numbers are below the valid one
    on_poisson = shuffled.replace(sampling="poisson", relation="add_or_remove_one")
    poisson = {h.id: h for h in host.host_numbers(on_poisson, DELTA, "tf_privacy")}["tf-privacy-poisson"]
    composition = lp.epsilon("composition", DELTA, config=on_poisson, assumptions=lp.LossAssumptions())
    assert poisson.valid and poisson.epsilon == pytest.approx(composition.epsilon, rel=0.02)
    monkeypatch.setattr(hosts, "_host_available", lambda name: name != "tf_privacy")
    assert host.host_numbers(shuffled, DELTA, "tf_privacy") == ()
