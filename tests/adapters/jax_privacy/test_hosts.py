"""lastiter_plugins/compare/hosts.py, jax_privacy's rows (display only, shown when jax_privacy is installed): its
Poisson number, valid on Poisson pipelines only; its fixed-batch-size number, below the truth of an adaptive run
(docs/derivations/jax-privacy-adapter.md#jp-host-numbers), so never valid."""

from __future__ import annotations

import pytest

from tests.adapters.jax_privacy.support import DELTA, NEEDS_JAX_PRIVACY
from tests.core.test_random_batch_pld import _adaptive_two_step_lower_delta

pytest.importorskip("jax_privacy", reason=NEEDS_JAX_PRIVACY)
from jax_privacy.accounting import accountants, analysis

import lastiter_plugins as lp
from lastiter_plugins.compare import compare_rows, host_versions
from lastiter_plugins.host import host_numbers

PIPELINE = dict(dataset_size=1000, batch_size=50, noise_multiplier=1.2, steps=200, clip_norm=1.0)


def _config(sampling: str, relation: str) -> lp.TrainingConfig:
    return lp.TrainingConfig(sampling=sampling, relation=relation, **PIPELINE)


def test_jax_privacy_is_a_host_of_compare():
    assert host_versions()["jax-privacy"] is not None
    rows = {row.id: row for row in compare_rows(_config("reshuffle", "replace_one"), lp.LossAssumptions(), DELTA)}
    poisson = rows["jax-privacy-poisson"]
    assert not poisson.valid and not poisson.counted and "poisson" in poisson.first_unmet


def test_its_poisson_number_is_valid_on_poisson_and_the_registrys_pld():
    (poisson, fixed) = host_numbers(_config("poisson", "add_or_remove_one"), DELTA, "jax-privacy")
    assert (poisson.id, fixed.id) == ("jax-privacy-poisson", "jax-privacy-fixed-batch")
    assert poisson.valid and not fixed.valid
    pld = lp.epsilon("composition-pld-poisson", DELTA, sampling="poisson", relation="add_or_remove_one", **PIPELINE)
    assert poisson.epsilon == pytest.approx(pld.epsilon, rel=0.02)


def test_its_poisson_number_on_a_shuffled_pipeline_is_far_below_the_valid_one():
    config = _config("reshuffle", "replace_one")
    (poisson, _) = host_numbers(config, DELTA, "jax-privacy")
    assert not poisson.valid
    assert poisson.epsilon < lp.epsilon("best", DELTA, config=config).epsilon / 2


@pytest.mark.parametrize(("eps", "threshold"), [(1.0, 0.05), (2.0, 0.5), (3.0, 1.0)])
def test_its_fixed_batch_number_is_below_the_truth_of_an_adaptive_run(eps, threshold):
    """n = 4, b = 2, z = 1, T = 2 under replace-one: the exact delta(eps) of an adaptive run is at least
    ``truth``; at delta just below it jax_privacy's FIXED_BATCH_SIZE accounting reports an epsilon below eps."""
    truth = _adaptive_two_step_lower_delta(eps, n=4, b=2, z=1.0, threshold=threshold)
    accountant = analysis.DpsgdTrainingAccountant(
        dp_accountant_config=accountants.PldAccountantConfig(value_discretization_interval=1e-3)
    )
    params = analysis.DpParams(noise_multipliers=1.0, num_samples=4, batch_size=2, delta=truth * 0.999,
                               sampling_method=analysis.SamplingMethod.FIXED_BATCH_SIZE)  # fmt: skip
    assert accountant.compute_epsilon(2, params) < eps
    config = lp.TrainingConfig(dataset_size=4, batch_size=2, noise_multiplier=1.0, steps=2, sampling="random_batch")
    (_, fixed) = host_numbers(config, truth * 0.999, "jax-privacy")
    assert not fixed.valid and "separately" in fixed.why_not
    assert lp.epsilon("best", truth * 0.999, config=config).epsilon >= eps  # the valid number is above the truth
