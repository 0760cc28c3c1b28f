"""lastiter_plugins/adapters/jax_privacy (the JAX API): training loops over jax_privacy's batch selection strategies on
CPU, each compared with the core's number for the scheme that ran; the batches checked as drawn, the noise the
privatizer adds, and the accountant jax_privacy's calibration uses."""

from __future__ import annotations

import numpy as np
import pytest

from tests.adapters.jax_privacy.support import DELTA, NEEDS_JAX_PRIVACY, regression_data

pytest.importorskip("jax_privacy", reason=NEEDS_JAX_PRIVACY)
import jax
import jax.numpy as jnp
import jax_privacy
from jax_privacy import batch_selection as bs
from jax_privacy.accounting import analysis, calibrate

import lastiter_plugins as lp
from lastiter_plugins.adapters import jax_privacy as ljp

N, B, Z, C, LR = 64, 8, 1.5, 1.0, 0.1
WITHIN_CLIP = lp.LossAssumptions(smoothness=1.0, gradient_norms_within_clip=True)


def _loss(w, x, y):
    return 0.5 * jnp.sum((x @ w - y) ** 2)


def _train(run: ljp.TrainingRun, rng=0, steps: int | None = None) -> jax.Array:
    """The loop a jax_privacy user writes: padded batches, clipped_grad, the run's privatizer, plain SGD."""
    x, y = regression_data(N)
    clipped = jax_privacy.clipped_grad(_loss, l2_clip_norm=C, normalize_by=B, batch_argnums=(1, 2))
    privatizer = run.privatizer(clipped, prng_key=0)
    w = jnp.zeros(x.shape[1])
    state = privatizer.init(w)
    for t, indices in enumerate(run.batches(rng=rng)):
        padded = bs.pad_to_multiple_of(np.asarray(indices), B)
        grad = clipped(w, x[padded], y[padded, 0], is_padding_example=padded < 0)
        grad, state = privatizer.update(grad, state)
        w = w - LR * grad
        if steps is not None and t + 1 == steps:
            break
    return w


def _core(sampling, relation, steps, *, n=N, b=B, assumptions=None, update="sgd"):
    return lp.epsilon("best", DELTA, dataset_size=n, batch_size=b, noise_multiplier=Z, steps=steps, sampling=sampling,
                      relation=relation, learning_rate=LR, clip_norm=C, update=update,
                      **vars(assumptions or lp.LossAssumptions()))  # fmt: skip


def _run(strategy, relation, *, n=N, b=B, assumptions=None, update="sgd"):
    return ljp.TrainingRun(strategy, num_examples=n, batch_size=b, noise_multiplier=Z, clip_norm=C, delta=DELTA,
                           relation=relation, update=update, learning_rate=LR, assumptions=assumptions)  # fmt: skip


@pytest.mark.parametrize(
    ("diameter", "match"),
    [
        (None, r"no loss meets these declarations: .*strong_convexity=0\.1 with gradient_norms_within_clip=True and "
               r"no projection"),
        (4 * C / 0.1, r"strong_convexity \* diameter / 2 = 2 > clip_norm = 1"),
        (2 * C / 0.1, None),  # lam D / 2 = C: some loss meets it
    ],
    ids=["no-projection", "diameter-too-large", "possible"],
)  # fmt: skip
def test_declarations_no_loss_meets_are_refused(diameter, match):
    """issue 41: a real run has real losses (lp.impossible_declaration, checked when the run is declared)."""
    declared = lp.LossAssumptions(smoothness=1.0, strong_convexity=0.1, diameter=diameter,
                                  gradient_norms_within_clip=True)  # fmt: skip
    strategy = bs.CyclicPoissonSampling(sampling_prob=B / N, iterations=4)
    if match is None:
        assert _run(strategy, "add_or_remove_one", assumptions=declared).assumptions == declared
        return
    with pytest.raises(lp.NotApplicableError, match=match + r".*Found them declared to TrainingRun"):
        _run(strategy, "add_or_remove_one", assumptions=declared)


def test_poisson_loop_gets_the_core_number_and_jax_privacys_valid_one():
    run = _run(bs.CyclicPoissonSampling(sampling_prob=B / N, iterations=16), "add_or_remove_one")
    _train(run)
    assert run.steps == 16
    assert run.epsilon() == _core("poisson", "add_or_remove_one", 16).epsilon
    host = run.host_number()
    assert host is not None and host.valid
    assert host.epsilon == pytest.approx(_core("poisson", "add_or_remove_one", 16, update="any").epsilon, rel=0.02)


def test_a_loop_stopped_early_is_accounted_for_the_batches_drawn():
    run = _run(bs.CyclicPoissonSampling(sampling_prob=B / N, iterations=16), "add_or_remove_one")
    _train(run, steps=5)
    assert run.steps == 5 and run.account().config.steps == 5


def test_a_reseeded_poisson_strategy_repeats_its_batches_and_is_refused():
    run = _run(bs.CyclicPoissonSampling(sampling_prob=B / N, iterations=8), "add_or_remove_one")
    _train(run, rng=7)
    with pytest.raises(lp.PipelineChangedError, match="independent batches"):
        _train(run, rng=7)
    with pytest.raises(lp.PipelineChangedError):
        run.epsilon()


def test_balls_in_bins_over_one_cycle_is_random_allocation():
    run = _run(bs.BallsInBinsSampling(iterations=8, cycle_length=8), "replace_one", assumptions=WITHIN_CLIP)
    _train(run)
    result = run.account().result
    expected = _core("random_allocation", "replace_one", 8, assumptions=WITHIN_CLIP)
    assert result.sampling is lp.Sampling.RANDOM_ALLOCATION
    # the core's best for random allocation (since issue 39 its every-iterate PLD row can win over the last-iterate ones)
    assert (result.epsilon, result.winner, result.protects) == (expected.epsilon, expected.winner, expected.protects)


def test_fixed_bins_over_several_cycles_get_the_epoch_baseline_only():
    run = _run(bs.BallsInBinsSampling(iterations=24, cycle_length=8), "replace_one", assumptions=WITHIN_CLIP)
    _train(run)
    result = run.account().result
    assert result.protects is lp.Protects.EVERY_ITERATE and result.sampling is lp.Sampling.CYCLIC
    assert result.epsilon == _core("cyclic", "replace_one", 24, update="any").epsilon
    assert "fixed-bins" in str(run.report()) or "keeps its bins" in str(run.report())


def test_equal_split_with_rate_one_is_shuffle_once_on_the_examples_it_keeps():
    run = _run(bs.CyclicPoissonSampling(sampling_prob=1.0, iterations=24, cycle_length=8), "replace_one",
               n=66, assumptions=WITHIN_CLIP)  # fmt: skip
    x_rows = 66
    assert run.num_examples == x_rows and run.scheme.dataset_size == 64
    for _ in run.batches(rng=3):
        pass
    assert run.epsilon() == _core("shuffle_once", "replace_one", 24, n=64, assumptions=WITHIN_CLIP).epsilon


def test_fixed_size_batches_get_the_random_batch_rows_and_jax_privacys_number_is_not_valid():
    run = _run(bs.FixedBatchSampling(batch_size=B, iterations=12), "replace_one")
    _train(run)
    assert run.epsilon() == _core("random_batch", "replace_one", 12).epsilon
    host = run.host_number()
    assert host is not None and not host.valid and "separately" in host.why_not


def test_an_allocation_with_an_example_twice_in_a_cycle_is_refused():
    class BallsInBinsSampling:  # the strategy's name and fields, batches that break its law
        iterations, cycle_length = 8, 8

        def batch_iterator(self, num_examples, rng=None):
            yield from ([0, 1, 2, 3, 4, 5, 6, 7], [7, 8, 9])

    run = _run(BallsInBinsSampling(), "replace_one", assumptions=WITHIN_CLIP)
    with pytest.raises(lp.PipelineChangedError, match="one step of the cycle"):
        list(run.batches())


def test_the_privatizer_adds_the_declared_noise_to_the_clipped_sum():
    run = _run(bs.CyclicPoissonSampling(sampling_prob=B / N, iterations=4), "add_or_remove_one")
    clipped = jax_privacy.clipped_grad(_loss, l2_clip_norm=C, normalize_by=B, batch_argnums=(1, 2))
    privatizer = run.privatizer(clipped, prng_key=1)
    zeros = jnp.zeros(40_000)
    noise, _ = privatizer.update(zeros, privatizer.init(zeros))
    assert float(jnp.std(noise)) == pytest.approx(Z * C / B, rel=0.02)
    wrong = jax_privacy.clipped_grad(_loss, l2_clip_norm=C, normalize_by=B / 2, batch_argnums=(1, 2))
    with pytest.raises(lp.NotApplicableError, match="l2_norm_bound"):
        run.privatizer(wrong)


def test_jax_privacys_calibration_takes_the_runs_accountant():
    """calibrate_noise_multiplier bisects from z = 0 (infinity there) to a z whose core epsilon meets the target."""
    run = _run(bs.CyclicPoissonSampling(sampling_prob=B / N, iterations=16), "add_or_remove_one")
    accountant = run.accountant()
    params = analysis.DpParams(noise_multipliers=0.0, num_samples=N, batch_size=B, delta=DELTA)
    assert accountant.compute_epsilon(16, params) == float("inf")
    z = calibrate.calibrate_noise_multiplier(target_epsilon=3.0, accountant=accountant, batch_sizes=B,
                                             num_updates=16, num_samples=N, target_delta=DELTA)  # fmt: skip
    ours = lp.epsilon("best", DELTA, dataset_size=N, batch_size=B, noise_multiplier=z, steps=16, sampling="poisson",
                      relation="add_or_remove_one", learning_rate=LR, clip_norm=C).epsilon  # fmt: skip
    assert ours <= 3.0
    with pytest.raises(ValueError, match="num_samples"):
        accountant.compute_epsilon(16, analysis.DpParams(noise_multipliers=1.0, num_samples=N + 1, batch_size=B,
                                                         delta=DELTA))  # fmt: skip


def test_update_sgd_needs_its_learning_rate():
    with pytest.raises(ValueError, match="learning_rate"):
        ljp.TrainingRun(bs.CyclicPoissonSampling(sampling_prob=B / N, iterations=4), num_examples=N, batch_size=B,
                        noise_multiplier=Z, clip_norm=C, delta=DELTA, relation="add_or_remove_one", update="sgd")  # fmt: skip


def test_the_relation_left_out_is_the_schemes_default():
    """lastiter_plugins.config.DEFAULT_RELATION, the rule of every route (Poisson warns until 0.4.0)."""
    declared = dict(num_examples=N, batch_size=B, noise_multiplier=Z, clip_norm=C, delta=DELTA)
    with pytest.warns(FutureWarning, match="add_or_remove_one"):
        poisson = ljp.TrainingRun(bs.CyclicPoissonSampling(sampling_prob=B / N, iterations=4), **declared)
    assert poisson.relation is lp.Relation.ADD_OR_REMOVE_ONE
    fixed = ljp.TrainingRun(bs.FixedBatchSampling(batch_size=B, iterations=4), **declared)
    assert fixed.relation is lp.Relation.REPLACE_ONE
