"""The Poisson rows' batch-size condition (docs/derivations/random-batch.md#rb-poisson-batch-sizes) as the registry
checks it.

The condition is looked at for Poisson pipelines only (any other scheme fails the Poisson rows on its
sampling), and its size events are cached on every input of ``poisson_size_events``. Neither changes a
number: the values below were computed with the code before both changes (commit d7250a6), except the
PLD epsilons' last digits, raised by aa12e0b (epsilon consistent with a delta that takes dp-accounting's
negative FFT-noise probabilities as 0).
"""

from __future__ import annotations

import pytest

import lastiter_plugins as lp

DELTA = 1e-5
BASE = dict(
    dataset_size=1000,
    batch_size=20,
    noise_multiplier=1.5,
    steps=300,
    learning_rate=0.2,
    smoothness=1.0,
    strong_convexity=0.05,
    gradient_norms_within_clip=True,
)
AOR = dict(sampling="poisson", relation="add_or_remove_one")
# eta M (b + 1)/b = 1.99 * 21/20 > 2: no range of batch sizes keeps the step non-expansive
EXPANDS = dict(AOR, learning_rate=1.99)


@pytest.mark.parametrize(
    ("changes", "epsilon", "applies"),
    [
        # (the PLD rows' last digits: with their FFT noise margin, docs/derivations/baselines.md#fft-noise-margin)
        (AOR, 1.0564599301573407, {"composition", "composition-pld-poisson", "liang-unbounded",
                                  "shifted-interpolation-poisson"}),
        (EXPANDS, 1.0564599301573407, {"composition", "composition-pld-poisson", "liang-unbounded"}),
        (dict(sampling="poisson", relation="replace_one"), 1.8576086197115422,
         {"composition-pld-poisson-replace-one", "shifted-interpolation-poisson-replace-one"}),
        (dict(sampling="shuffle_once"), 4.896877652364812,
         {"composition", "composition-gdp-epochs", "kong-ribero-curvature-free", "kong-ribero-cyclic",
          "shifted-interpolation-cyclic", "shifted-interpolation-shuffle", "ye-shokri-convex", "ye-shokri-cyclic",
          "ye-shokri-shuffle"}),
    ],
    ids=["poisson-add-or-remove", "poisson-step-expands", "poisson-replace-one", "shuffle-once"],
)  # fmt: skip
def test_best_and_applicability_are_unchanged(changes, epsilon, applies):
    params = {**BASE, **changes}
    result = lp.epsilon("best", DELTA, **params)
    if result.kind is lp.Kind.PLD:
        # a PLD row's last digits follow the FFT's floating-point path, which differs between CPUs (SIMD
        # width; seen: 1.3e-10 relative on the same versions): equal to far below any change of the code
        assert result.epsilon == pytest.approx(epsilon, rel=1e-9, abs=0)
    else:
        assert result.epsilon == epsilon
    assert {b for b, a in lp.applicable_bounds(**params).items() if a.applies} == applies | {"best"}


def test_calibration_of_a_non_poisson_pipeline_is_unchanged():
    params = {**BASE, "sampling": "shuffle_once"}
    del params["noise_multiplier"]
    # pinned at the interpolating search (3.134939279931106 with plain bisection: both within rtol = 1e-4;
    # the value depends on the search's path, the epsilons it evaluates do not)
    assert lp.calibrate_noise("best", 2.0, DELTA, **params).noise_multiplier == 3.1346981371284053


def test_the_condition_names_the_batch_sizes_on_poisson_pipelines_only():
    # the cache keys on the learning rate: the same pipeline with a step that expands is refused after one that is not
    for changes, refused in ((AOR, False), (EXPANDS, True), (AOR, False)):
        app = lp.applicable_bounds(**{**BASE, **changes})["shifted-interpolation-poisson"]
        assert app.applies is not refused
        assert any("expands at batch size b + 1" in r for r in app.reasons) is refused, app.reasons
    app = lp.applicable_bounds(**{**BASE, **EXPANDS, "sampling": "shuffle_once"})["shifted-interpolation-poisson"]
    assert not app.applies and any("sampling must be one of poisson" in r for r in app.reasons), app.reasons
    assert not any("expands at batch size" in r for r in app.reasons), app.reasons
