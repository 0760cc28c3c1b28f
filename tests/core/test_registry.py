"""lastiter_plugins.registry: every row says where its proof comes from (a published theorem, or this
library's derivation with the docs section and the checks it passed), per pipeline; ``best`` can be
restricted to published theorems, and the outputs say when that changes the number."""

from __future__ import annotations

import re

import pytest

import lastiter_plugins as lp
from lastiter_plugins import evaluation, registry
from lastiter_plugins.api import build
from tests.support import ROOT, strongly_convex

DELTA = 1e-5

#: The built-in scenario: shuffle-once, strongly convex, projected (its best is our shuffle mixture).
BUILTIN = dict(dataset_size=10000, batch_size=100, noise_multiplier=4.0, clip_norm=1.05, learning_rate=1.0,
               epochs=100, sampling="shuffle_once", smoothness=0.26, strong_convexity=0.01, diameter=10.0,
               gradient_norms_within_clip=True)  # fmt: skip
UNPROJECTED = {k: v for k, v in BUILTIN.items() if k != "diameter"}
POISSON_R1 = dict(dataset_size=1000, batch_size=50, noise_multiplier=4.0, steps=400, learning_rate=1.0,
                  smoothness=0.25, strong_convexity=0.05, gradient_norms_within_clip=True, sampling="poisson",
                  relation="replace_one")  # fmt: skip


def test_every_row_names_a_published_theorem_or_a_derivation_with_its_checks():
    for spec in lp.BOUNDS.values():
        prov = spec.provenance
        assert prov is not None and (prov.published or prov.derived), spec.id
        if prov.published:
            assert re.search(r"(19|20)\d\d", prov.published) and ("arXiv" in prov.published), spec.id
        if prov.derived:
            assert prov.derived.startswith("docs/derivations/") and "checks:" in prov.derived, spec.id
            # every page#anchor it cites before its checks is an explicit anchor there ("page#a, #b and #c")
            cited = re.findall(r"(docs/derivations/[\w-]+\.md)((?:#[\w-]+(?:, | and )?)+)", prov.derived.split(";")[0])
            assert cited, spec.id
            for page, tags in cited:
                explicit = set(re.findall(r'<a id="([^"]+)"></a>', (ROOT / page).read_text(encoding="utf-8")))
                missing = set(re.findall(r"#([\w-]+)", tags)) - explicit
                assert not missing, (spec.id, page, missing)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({}, None),
        ({"dataset_size": 10050}, "short last batch of 50"),
        ({"epochs": None, "steps": 10050}, "partial last epoch"),
        ({"diameter": 10.0}, "projection"),
        ({"l2_outside_clip": True}, "l2 term outside the clip"),
    ],
)
def test_a_published_row_is_derived_where_the_pipeline_leaves_its_statement(changes, why):
    params = {k: v for k, v in {**UNPROJECTED, **changes}.items() if v is not None}
    config, assumptions = build(**params)
    prov = lp.BOUNDS["ye-shokri-shuffle"].provenance
    found = prov.why_derived(config, assumptions)
    if why is None:
        assert found is None
        assert prov.describe(config, assumptions) == f"published: {prov.published}"
    else:
        assert why in found and prov.describe(config, assumptions).startswith(f"derived here ({found})")


def test_best_over_published_theorems_only():
    full = lp.epsilon("best", DELTA, **BUILTIN)
    assert not full.published and full.provenance.startswith(
        "derived here: docs/derivations/shifted-interpolation.md#si-shuffle-once"
    )
    published = lp.epsilon("best", DELTA, published_only=True, **BUILTIN)
    assert published.published and published.provenance.startswith("published: ")
    assert published.epsilon > full.epsilon  # the restriction costs something here
    # it is the minimum over the published rows, each computed by name
    config, assumptions = build(**BUILTIN)
    rows = [
        lp.epsilon(spec.id, DELTA, **BUILTIN).epsilon
        for spec in evaluation.best_candidates(config, assumptions)
        if spec.provenance.why_derived(config, assumptions) is None
    ]
    assert published.epsilon == min(rows)
    # without the projection, a published theorem (Ye & Shokri, Thm 4.2) is tighter than Kong & Ribero
    assert lp.epsilon("best", DELTA, published_only=True, **UNPROJECTED).winner == "ye-shokri-shuffle"
    assert lp.epsilon("best", DELTA, published_only=True, **UNPROJECTED).to_dict()["published"] is True


def test_a_named_derived_row_is_refused_under_published_only():
    with pytest.raises(lp.NotApplicableError, match="this library's derivation"):
        lp.epsilon("shifted-interpolation-shuffle", DELTA, published_only=True, **BUILTIN)
    with pytest.raises(lp.NotApplicableError, match="no proven bound with a published proof applies"):
        lp.epsilon("best", DELTA, published_only=True, **POISSON_R1)
    with pytest.raises(lp.NotApplicableError, match="published proof"):
        lp.rdp("best", [2.0, 4.0], published_only=True, **POISSON_R1)


def test_the_note_says_when_the_restriction_would_change_the_number():
    config, assumptions = build(**BUILTIN)
    full = lp.epsilon("best", DELTA, **BUILTIN)
    published = lp.epsilon("best", DELTA, published_only=True, **BUILTIN)
    note = evaluation.published_note(full, config, assumptions)
    assert (
        f"{published.epsilon:.4g} via {published.winner}" in note
        and "docs/derivations/shifted-interpolation.md#si-shuffle-once" in note
    )
    assert evaluation.published_note(published, config, assumptions) == ""  # already published: nothing to say
    # compare's best line says it too
    line = lp.compare.compare(DELTA, lower_bound=False, **BUILTIN).best[0]
    assert line.provenance == full.provenance and line.published_note == note
    config, assumptions = build(**POISSON_R1)
    note = evaluation.published_note(lp.epsilon("best", DELTA, **POISSON_R1), config, assumptions)
    assert "no published theorem applies" in note


def test_calibration_over_published_theorems_only():
    params = {k: v for k, v in BUILTIN.items() if k != "noise_multiplier"}
    z_all = lp.calibrate_noise("best", 3.0, DELTA, **params).noise_multiplier
    z_published = lp.calibrate_noise("best", 3.0, DELTA, published_only=True, **params).noise_multiplier
    assert z_published > z_all
    assert lp.epsilon("best", DELTA, published_only=True, noise_multiplier=z_published, **params).epsilon <= 3.0


def test_applicable_bounds_names_best_over_published_rows():
    table = lp.applicable_bounds(published_only=True, **BUILTIN)
    assert "shifted-interpolation-shuffle" not in table[lp.BEST].reference
    assert "kong-ribero-cyclic" in table[lp.BEST].reference
    assert table["shifted-interpolation-shuffle"].provenance.startswith("derived here")
    assert table["kong-ribero-cyclic"].published


def test_a_provenance_must_name_its_source():
    with pytest.raises(ValueError, match="names a published theorem or a derivation"):
        registry.Provenance()
    with pytest.raises(ValueError, match="needs both"):
        registry.Provenance(published="X 2020 (arXiv 1)", outside_published=(lambda c, a: None,))


def test_the_dp_accounting_accountant_takes_published_only():
    from lastiter_plugins.adapters.dp_accounting import LastIterateAccountant, LastIterateDpSgdEvent

    event = LastIterateDpSgdEvent(steps=10000, **{k: v for k, v in BUILTIN.items() if k != "epochs"})
    for published_only in (False, True):
        acc = LastIterateAccountant(published_only=published_only, neighboring_relation="replace_one")
        acc.compose(event)
        expected = lp.epsilon("best", DELTA, published_only=published_only, **BUILTIN)
        assert acc.get_epsilon(DELTA) == expected.epsilon
        assert ("via kong-ribero-cyclic" in acc.statement(DELTA)) is published_only
    with pytest.raises(ValueError, match="published_only must be True or False"):
        LastIterateAccountant(published_only=1)


def test_the_keras_callback_takes_published_only():
    pytest.importorskip("tensorflow_privacy")
    from lastiter_plugins.adapters.tf_privacy import LastIterateCallback

    callback = LastIterateCallback(sampling="cyclic", dataset_size=100, delta=DELTA, published_only=True)
    assert callback.published_only is True
    with pytest.raises(ValueError, match="published_only must be True or False"):
        LastIterateCallback(sampling="cyclic", dataset_size=100, delta=DELTA, published_only="yes")


# -- the update rule: last-iterate rows analyse plain SGD, composition covers any use of the noisy sums


@pytest.mark.parametrize("sampling", [s.value for s in lp.Sampling])
def test_any_update_leaves_exactly_the_every_iterate_rows(sampling):
    params = strongly_convex(sampling=sampling, diameter=10.0)
    relation = lp.Relation.ADD_OR_REMOVE_ONE if sampling == "poisson" else lp.Relation.REPLACE_ONE
    sgd = lp.applicable_bounds(**params, relation=relation)
    other = lp.applicable_bounds(**params, relation=relation, update="any")
    for bid, spec in lp.BOUNDS.items():
        if spec.protects is lp.Protects.EVERY_ITERATE:
            assert other[bid].applies == sgd[bid].applies, bid
        else:
            assert not other[bid].applies, bid
            if spec.relation_for(lp.Sampling(sampling)) is relation:  # the first reason given is the update
                assert other[bid].unmet[0].found == "update=any", bid
    assert any(sgd[bid].applies for bid, spec in lp.BOUNDS.items() if spec.protects is lp.Protects.FINAL_MODEL)


def test_best_under_any_update_is_best_over_the_every_iterate_rows():
    params = strongly_convex(sampling="shuffle_once", relation="replace_one")
    sgd = lp.epsilon("best", 1e-5, **params)
    other = lp.epsilon("best", 1e-5, **params, update="any")
    assert sgd.protects is lp.Protects.FINAL_MODEL  # the last-iterate bound wins for plain SGD
    assert other.protects is lp.Protects.EVERY_ITERATE
    assert other.winner == "composition-gdp-epochs"
    assert other.epsilon == lp.epsilon("composition-gdp-epochs", 1e-5, **params).epsilon
    with pytest.raises(lp.NotApplicableError, match="update=any"):
        lp.epsilon("shifted-interpolation-shuffle", 1e-5, **params, update="any")


def test_a_row_without_the_update_condition_is_a_table_defect():
    """Every last-iterate row names needs_sgd_update and no every-iterate row does (checked when the table is
    built); this test restates it so that a change of the build check is seen."""
    from lastiter_plugins.registry import conditions

    for spec in lp.BOUNDS.values():
        assert (conditions.needs_sgd_update in spec.conditions) == (spec.protects is lp.Protects.FINAL_MODEL), spec.id
