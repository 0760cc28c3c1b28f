"""lastiter_plugins/adapters/jax_privacy/_schemes.py: which pipeline a batch selection strategy or a Keras fit is
(docs/derivations/jax-privacy-adapter.md, parts 2, 4 and 5), and the refusals where no row covers it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.adapters.jax_privacy.support import DELTA, NEEDS_JAX_PRIVACY

pytest.importorskip("jax_privacy", reason=NEEDS_JAX_PRIVACY)
from jax_privacy import batch_selection as bs

import lastiter_plugins as lp
from lastiter_plugins.adapters.jax_privacy import NotCoveredError, strategy_scheme
from lastiter_plugins.adapters.jax_privacy._schemes import cycle_batch_size, keras_shape

S = lp.Sampling


@pytest.mark.parametrize(
    ("strategy", "n", "b", "sampling", "size", "every_iterate"),
    [
        (bs.CyclicPoissonSampling(sampling_prob=0.125, iterations=5), 64, 8, S.POISSON, 64, False),
        (bs.FixedBatchSampling(batch_size=8, iterations=5), 64, 8, S.RANDOM_BATCH, 64, False),
        (bs.BallsInBinsSampling(iterations=8, cycle_length=8), 64, 8, S.RANDOM_ALLOCATION, 64, False),
        (bs.BallsInBinsSampling(iterations=5, cycle_length=8), 64, 8, S.RANDOM_ALLOCATION, 64, False),
        (bs.BallsInBinsSampling(iterations=20, cycle_length=8), 64, 8, S.CYCLIC, 64, True),
        (bs.CyclicPoissonSampling(sampling_prob=1.0, iterations=20, cycle_length=8), 66, 8, S.SHUFFLE_ONCE, 64, False),
        (
            bs.CyclicPoissonSampling(
                sampling_prob=1.0, iterations=20, cycle_length=8, partition_type=bs.PartitionType.INDEPENDENT
            ),
            64,
            8,
            S.CYCLIC,
            64,
            True,
        ),
    ],
    ids=[
        "poisson",
        "fixed-batch",
        "balls-in-bins-one-cycle",
        "balls-in-bins-part-cycle",
        "fixed-bins-3-cycles",
        "equal-split-shuffle-once",
        "independent-split-fixed-bins",
    ],
)
def test_strategy_maps_to_its_scheme(strategy, n, b, sampling, size, every_iterate):
    scheme = strategy_scheme(strategy, n, b)
    assert (scheme.sampling, scheme.dataset_size) == (sampling, size)
    assert (scheme.every_iterate_only is not None) == every_iterate


@pytest.mark.parametrize(
    ("strategy", "b", "says"),
    [
        (bs.CyclicPoissonSampling(sampling_prob=0.5, iterations=4, cycle_length=2), 16, "cyclic Poisson"),
        (bs.CyclicPoissonSampling(sampling_prob=0.125, iterations=4, truncated_batch_size=6), 8, "truncat"),
        (bs.CyclicPoissonSampling(sampling_prob=0.1, iterations=4), 8, "sampling_prob must be"),
        (bs.FixedBatchSampling(batch_size=8, iterations=4, replace=True), 8, "replace=True"),
        (bs.FixedBatchSampling(batch_size=8, iterations=4), 4, "batch_size"),
        (bs.BMinSepSampling(sampling_prob=0.1, iterations=4, min_sep=2), 8, "BMinSep"),
        (bs.BallsInBinsSampling(iterations=4, cycle_length=8), 16, "ceil"),
        (bs.CyclicPoissonSampling(sampling_prob=1.0, iterations=4, cycle_length=8), 4, "num_examples // cycle_length"),
        (bs.UserSelectionStrategy(bs.CyclicPoissonSampling(sampling_prob=0.1, iterations=4)), 8, "user"),
    ],
    ids=[
        "cyclic-poisson",
        "truncated",
        "rate-not-b-over-n",
        "with-replacement",
        "fixed-divisor-mismatch",
        "b-min-sep",
        "allocation-divisor",
        "equal-split-divisor",
        "user-level",
    ],
)
def test_strategies_no_row_covers_are_refused_with_the_reason(strategy, b, says):
    with pytest.raises(NotCoveredError, match=says):
        strategy_scheme(strategy, 64, b)


def test_fixed_bins_count_never_fewer_epochs_than_the_cycles():
    """docs/derivations/jax-privacy-adapter.md#jp-fixed-bins: b' = ceil(n/l) gives ceil(n/b') <= l steps per epoch,
    so ceil(T / ceil(n/b')) >= ceil(T/l) epochs; equal when any divisor gives exactly l steps."""
    for n in range(1, 80):
        for cycle in range(1, n + 1):
            b, exact = cycle_batch_size(n, cycle)
            per_epoch = math.ceil(n / b)
            assert per_epoch <= cycle
            assert exact == any(math.ceil(n / d) == cycle for d in range(1, n + 1)), (n, cycle)
            assert exact == (per_epoch == cycle)
            for steps in (1, cycle, 3 * cycle + 1):
                assert math.ceil(steps / per_epoch) >= math.ceil(steps / cycle)


def test_fixed_bins_get_the_epoch_baseline_of_their_cycles():
    """Fixed bins over 3 cycles of 8 steps (n = 64, z = 2): the every-iterate epoch baseline of 3 epochs, 2 sqrt(3)/z-GDP
    under replace-one, and no last-iterate row even where the declarations would give one."""
    scheme = strategy_scheme(bs.BallsInBinsSampling(iterations=24, cycle_length=8), 64, 8)
    cfg = scheme.config(noise_multiplier=2.0, steps=24, relation=lp.Relation.REPLACE_ONE, learning_rate=0.1,
                        clip_norm=1.0, update=lp.Update.SGD)  # fmt: skip
    assumptions = lp.LossAssumptions(smoothness=1.0, gradient_norms_within_clip=True)
    result = lp.epsilon("best", DELTA, config=cfg, assumptions=assumptions)
    assert result.protects is lp.Protects.EVERY_ITERATE
    gdp = lp.epsilon("composition-gdp-epochs", DELTA, config=cfg, assumptions=assumptions).epsilon
    three_epochs = lp.epsilon("composition-gdp-epochs", DELTA, dataset_size=3, batch_size=1, steps=9,
                              noise_multiplier=2.0, sampling="cyclic", relation="replace_one").epsilon  # fmt: skip
    assert result.epsilon == pytest.approx(gdp) and gdp == pytest.approx(three_epochs, rel=1e-12)
    with pytest.raises(lp.NotApplicableError, match="replace_one"):
        scheme.config(noise_multiplier=2.0, steps=24, relation=lp.Relation.ADD_OR_REMOVE_ONE, learning_rate=None,
                      clip_norm=1.0, update=lp.Update.ANY)  # fmt: skip


def test_equal_split_keeps_floor_n_over_l_per_batch():
    """CyclicPoissonSampling(1.0, cycle 8) on 66 examples: 8 batches of 8, 2 examples never used, the same batches every
    cycle (shuffle-once on the 64 kept)."""
    strategy = bs.CyclicPoissonSampling(sampling_prob=1.0, iterations=16, cycle_length=8)
    batches = [tuple(sorted(b)) for b in strategy.batch_iterator(66, rng=0)]
    assert all(len(b) == 8 for b in batches) and batches[:8] == batches[8:]
    assert len(set().union(*batches[:8])) == 64


@pytest.mark.parametrize(
    ("sampling", "n", "b", "per_pass", "k", "physical", "size"),
    [
        (S.RESHUFFLE, 64, 8, 8, 1, False, 8),
        (S.RESHUFFLE, 64, 8, 8, 2, False, 16),
        (S.CYCLIC, 64, 8, 8, 4, False, 32),
        (S.RESHUFFLE, 64, 8, 8, 3, True, 8),
        (S.POISSON, 64, 8, 8, 2, True, 8),
    ],
    ids=["no-accumulation", "groups-inside-passes", "cyclic-groups", "groups-straddle-passes", "poisson-groups"],
)
def test_keras_accumulation(sampling, n, b, per_pass, k, physical, size):
    shape = keras_shape(sampling, n, b, per_pass, k)
    assert (shape.physical, shape.scheme.batch_size) == (physical, size)
    assert (shape.scheme.every_iterate_only is not None) == physical
    z = 1.5
    assert shape.noise_multiplier(z / math.sqrt(k)) == pytest.approx(z / math.sqrt(k) if physical else z)
    assert shape.steps(12) == (12 if physical else 12 // k)


def test_keras_groups_straddling_passes_count_every_physical_step():
    """The physical pipeline (z/sqrt(k), kT steps, every iterate) is never below the grouped one it replaces."""
    straddle = keras_shape(S.RESHUFFLE, 64, 8, 8, 3, ).scheme.config(
        noise_multiplier=1.0 / math.sqrt(3), steps=24, relation=lp.Relation.REPLACE_ONE, learning_rate=None,
        clip_norm=1.0, update=lp.Update.SGD,
    )  # fmt: skip
    assert straddle.update is lp.Update.ANY
    grouped = lp.epsilon("best", DELTA, dataset_size=64, batch_size=24, noise_multiplier=1.0, steps=8,
                         sampling="reshuffle", relation="replace_one").epsilon  # fmt: skip
    assert lp.epsilon("best", DELTA, config=straddle).epsilon >= grouped
    assert np.isfinite(grouped)
