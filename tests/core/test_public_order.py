"""A public order (``TrainingConfig.order_secret=False``): the rows whose proof needs the batches secret leave,
the rows proven for every fixed batch sequence stay (docs/derivations/public-order.md#public-order)."""

from __future__ import annotations

import pytest

import lastiter_plugins as lp
from lastiter_plugins import host
from lastiter_plugins.lower_end import exact

DELTA = 1e-5
#: G2 (strongly convex quadratics) where the secret-order mixture is below the truth of the schedule with the
#: differing example last in every pass: n 100, b 10, z 2, lr 0.8, lam = M = 1, 2 epochs
G2 = exact.g2_params(
    strong_convexity=1.0, learning_rate=0.8, dataset_size=100, batch_size=10, noise_multiplier=2.0, steps=20
)
#: what each scheme loses with a public order (the table of docs/derivations/public-order.md#po-rows)
LEAVE = {
    "cyclic": set(),
    "shuffle_once": {"ye-shokri-shuffle", "shifted-interpolation-shuffle"},
    "reshuffle": set(),
    "random_batch": {
        "ye-shokri-random",
        "shifted-interpolation-random-batch",
        "composition-pld-random-batch",
        "altschuler-talwar",
        "bounded-domain-random",
        "composition",
    },
    "poisson": {
        "altschuler-talwar",
        "bounded-domain-random",
        "composition",
        "liang-bounded",
        "liang-unbounded",
        "shifted-interpolation-poisson",
        "shifted-interpolation-poisson-replace-one",
        "composition-pld-poisson",
        "composition-pld-poisson-replace-one",
    },
    "random_allocation": {
        "shifted-interpolation-random-allocation",
        "shifted-interpolation-random-allocation-replace-one",
        "composition-pld-random-allocation",
        "composition-pld-random-allocation-replace-one",
    },
}


def _covering(sampling: str) -> set[str]:
    return {bid for bid, spec in lp.BOUNDS.items() if lp.Sampling(sampling) in spec.covers}


def _unmet_order(bid: str, config: lp.TrainingConfig, assumptions: lp.LossAssumptions) -> bool:
    evaluation = lp.applicable_bounds(config=config, assumptions=assumptions)[bid]
    return any("order_secret" in u.found for u in evaluation.unmet)


@pytest.mark.parametrize("sampling", list(LEAVE), ids=list(LEAVE))
def test_a_public_order_removes_exactly_the_rows_whose_proof_needs_it_secret(sampling):
    relation = "replace_one"
    params = dict(dataset_size=100, batch_size=10, noise_multiplier=2.0, steps=20, sampling=sampling, relation=relation)
    config, assumptions = lp.build(**params, order_secret=False)
    broken = {bid for bid in _covering(sampling) if _unmet_order(bid, config, assumptions)}
    assert broken == LEAVE[sampling]
    secret, _ = lp.build(**params)
    assert not any(_unmet_order(bid, secret, assumptions) for bid in _covering(sampling))


def test_order_secret_is_a_flag_true_by_default():
    config, _ = lp.build(dataset_size=10, batch_size=2, noise_multiplier=1.0, steps=5, sampling="reshuffle")
    assert config.order_secret is True
    with pytest.raises(ValueError, match=r"order_secret must be True or False\. Found 0"):
        config.replace(order_secret=0)


@pytest.mark.parametrize("sampling", ["reshuffle", "shuffle_once"])
def test_ground_truth_a_public_order_is_at_least_the_fixed_schedule_the_secret_mixture_is_not(sampling):
    # the schedule with the differing example last in every pass is one a public order can be: its exact epsilon
    lower, _ = exact.g2_laws({**G2, "sampling": "cyclic"}).hockey_stick().epsilon(DELTA)
    secret = lp.epsilon("best", DELTA, **G2, sampling=sampling)
    public = lp.epsilon("best", DELTA, **G2, sampling=sampling, order_secret=False)
    assert secret.epsilon < lower  # the mixture would be optimistic for a public order
    assert public.epsilon >= lower
    assert public.epsilon == pytest.approx(lp.epsilon("best", DELTA, **G2, sampling="cyclic").epsilon, rel=1e-9)


def test_reshuffle_with_a_public_order_is_its_worst_component():
    config, assumptions = lp.build(**G2, sampling="reshuffle")
    spec = lp.BOUNDS["shifted-interpolation-reshuffle"]
    assert spec.profile is not None
    mixture = spec.profile(config, assumptions)
    public = spec.profile(config.replace(order_secret=False), assumptions)
    assert public.mus == (max(mixture.mus),) and public.weights == (1.0,)


def test_poisson_with_public_memberships_has_no_row():
    params = dict(dataset_size=100, batch_size=10, noise_multiplier=2.0, steps=20, sampling="poisson")
    for relation in ("add_or_remove_one", "replace_one"):
        with pytest.raises(lp.NotApplicableError):
            lp.epsilon("best", DELTA, **params, relation=relation, order_secret=False)


def test_a_public_order_is_a_departure_that_removes_those_rows():
    config, assumptions = lp.build(**G2, sampling="shuffle_once")
    public = host.Departure(1, "the loader's generator is in torch's fixed fresh state", {"order_secret": False})
    acc = host.account(host.Declaration(), config, assumptions, DELTA, [public])
    assert acc.config.order_secret is False
    assert {r.bound for r in acc.rows_left} == {"ye-shokri-shuffle", "shifted-interpolation-shuffle"} & {
        b for b, e in lp.applicable_bounds(config=config, assumptions=assumptions).items() if e.applies
    }
    assert acc.result.winner == "shifted-interpolation-cyclic"
    with pytest.raises(ValueError, match="order_secret only to False"):
        host.Departure(1, "x", {"order_secret": True})


def test_advice_on_a_public_order_offers_a_secret_seed_and_keeps_it_for_a_new_sampler():
    params = dict(G2, sampling="reshuffle", order_secret=False)
    suggestions = {s.change: s for s in lp.advise(DELTA, **params)}
    [seeded] = [s for s in suggestions.values() if dict(s.parameters) == {"order_secret": True}]
    assert seeded.epsilon == pytest.approx(lp.epsilon("best", DELTA, **G2, sampling="reshuffle").epsilon, rel=1e-12)
    poisson = [s for s in suggestions.values() if s.parameters.get("sampling") == "poisson"]
    assert poisson and all(s.parameters.get("order_secret") is True for s in poisson)


def test_the_number_of_a_public_order_says_so():
    public = lp.epsilon("best", DELTA, **G2, sampling="shuffle_once", order_secret=False)
    shown, explained = (" ".join(text.split()) for text in (str(public), public.explain()))  # (lines wrap)
    assert "shuffle_once (public order)" in shown and "shuffle_once (public order)" in explained
    assert public.to_dict()["order_secret"] is False
    secret = lp.epsilon("best", DELTA, **G2, sampling="shuffle_once")
    assert "(public order)" not in str(secret) and secret.to_dict()["order_secret"] is True
