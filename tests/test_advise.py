"""lp.advise: single changes that lower best, each evaluated by the one evaluation path."""

from __future__ import annotations

import pytest

import lastiter_plugins as lp

RESHUFFLE_LR_TOO_LARGE = dict(
    sampling="reshuffle",
    dataset_size=60_000,
    batch_size=1500,
    noise_multiplier=3.0,
    learning_rate=3.0,  # above 2/M: no last-iterate bound applies
    epochs=100,
    smoothness=1.0,
    strong_convexity=0.5,
    gradient_norms_within_clip=True,
)


def test_advice_lowers_best_and_says_how():
    current = lp.epsilon("best", 1e-5, **RESHUFFLE_LR_TOO_LARGE)
    assert lp.is_standard_baseline(current)
    advice = lp.advise(1e-5, **RESHUFFLE_LR_TOO_LARGE)
    assert advice, "a smaller step size opens the reshuffle bound"
    assert [s.epsilon for s in advice] == sorted(s.epsilon for s in advice)
    first = advice[0]
    assert first.parameters == {"learning_rate": 1.5} and first.changes_training
    assert first.winner == "shifted-interpolation-reshuffle" and first.epsilon < current.epsilon / 10
    for s in advice:  # each number is what the API gives for the changed pipeline, in the same relation
        again = lp.epsilon("best", 1e-5, **{**RESHUFFLE_LR_TOO_LARGE, **s.parameters})
        assert s.epsilon == again.epsilon and s.winner == again.winner
        assert s.result.relation is current.relation and s.epsilon < current.epsilon
        assert str(s.epsilon)[:3] in str(s) and ("changes training" in str(s)) == s.changes_training
    assert len(lp.advise(1e-5, top=1, **RESHUFFLE_LR_TOO_LARGE)) == 1


def test_a_declaration_alone_is_marked_accounting_only():
    params = dict(
        sampling="cyclic",
        dataset_size=10_000,
        batch_size=100,
        noise_multiplier=2.0,
        learning_rate=1.0,
        epochs=50,
        smoothness=0.26,
        strong_convexity=0.01,
    )
    advice = {tuple(s.parameters): s for s in lp.advise(1e-5, **params)}
    declare = advice[("gradient_norms_within_clip",)]
    assert not declare.changes_training and declare.winner == "shifted-interpolation-cyclic"


def test_poisson_under_add_or_remove_gets_no_sampler_change():
    params = dict(
        sampling="poisson",
        relation="add_or_remove_one",
        dataset_size=10_000,
        batch_size=100,
        noise_multiplier=1.0,
        epochs=5,
    )
    for s in lp.advise(1e-5, **params):
        assert "sampling" not in s.parameters and s.result.relation is lp.Relation.ADD_OR_REMOVE_ONE


def test_the_pipeline_itself_is_validated():
    with pytest.raises(ValueError):
        lp.advise(1e-5, **{**RESHUFFLE_LR_TOO_LARGE, "batch_size": 0})
