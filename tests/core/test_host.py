"""lastiter_plugins/host.py: the host contract (departures gate rows, not runs; the host's own number)."""

from __future__ import annotations

import pytest

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
