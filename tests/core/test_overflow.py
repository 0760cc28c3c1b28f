"""Random allocation with batches cut at max_batch_size (docs/derivations/fixed-length-batches.md).

* Lemma C on exact instances: a linear loss in one dimension, so the final iterate of the run is a Gaussian
  location mixture over every allocation and cut; a cut rule chosen to hurt (one world keeps the largest
  gradients, the other the smallest). The cut run's hockey-stick divergence (its certified upper end) is at
  most the uncut run's (its certified lower end) plus P[E(X)] + e^eps P[E(Y)], each term exact; and the same
  instances show the overflow terms are needed: the cut run is less private than the uncut one.
* The library's epsilon and delta for a config with max_batch_size: Lemma C's numbers exactly, never below
  the exact instance, no Renyi curve, no mu.
* overflow_probability against a direct binomial sum; padded_batch_size the smallest length meeting its target;
  cut_epsilon's answer satisfies condition (F).
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
from scipy import special

import lastiter_plugins as lp
from lastiter_plugins import host, overflow
from lastiter_plugins.config import TrainingConfig
from lastiter_plugins.errors import NotApplicableError
from lastiter_plugins.lower_end.exact import gaussian_mixture_hockey_stick

# ---------------------------------------------------------------- exact instances


def _final_sums(gradients: list[float], t: int, epochs: int, length: int | None, keep_largest: bool):
    """(weights, means) of the sum of every kept gradient over the run (the final iterate of a linear loss, up
    to an affine map), every allocation of the examples to t steps in each epoch enumerated; a batch above
    ``length`` keeps its ``length`` largest (or smallest) gradients; and the probability that some batch was
    cut."""
    sums: dict[float, int] = {}
    cut = 0
    allocations = list(itertools.product(range(t), repeat=len(gradients)))
    for run in itertools.product(allocations, repeat=epochs):
        total, was_cut = 0.0, False
        for allocation in run:
            for step in range(t):
                batch = sorted(
                    (g for g, s in zip(gradients, allocation, strict=True) if s == step), reverse=keep_largest
                )
                if length is not None and len(batch) > length:
                    batch, was_cut = batch[:length], True
                total += sum(batch)
        sums[total] = sums.get(total, 0) + 1
        cut += was_cut
    count = len(allocations) ** epochs
    means = np.array(sorted(sums))
    return np.array([sums[m] for m in means]) / count, means, cut / count


# (others' gradients, t, L, epochs): X = the others, Y = X plus the record (gradient +1); C = 1
INSTANCES = [
    ([1.0, 1.0, -1.0, -1.0], 2, 4, 1),  # only Y can exceed L
    ([1.0, -1.0, -1.0], 2, 2, 1),  # both worlds can
    ([1.0, -1.0], 2, 2, 2),  # two epochs
]


@pytest.mark.parametrize(("others", "t", "length", "epochs"), INSTANCES)
def test_lemma_c_holds_on_every_allocation_and_the_cut_can_hurt(others, t, length, epochs):
    z = 0.5
    variance = z * z * t * epochs  # the noise of every step, summed
    xw, xm, px = _final_sums(others, t, epochs, length, keep_largest=False)
    yw, ym, py = _final_sums([*others, 1.0], t, epochs, length, keep_largest=True)
    uxw, uxm, _ = _final_sums(others, t, epochs, None, keep_largest=False)
    uyw, uym, _ = _final_sums([*others, 1.0], t, epochs, None, keep_largest=True)
    cut = gaussian_mixture_hockey_stick(yw, ym, xw, xm, variance, both_directions=False)
    uncut = gaussian_mixture_hockey_stick(uyw, uym, uxw, uxm, variance, both_directions=False)
    cut_back = gaussian_mixture_hockey_stick(xw, xm, yw, ym, variance, both_directions=False)
    uncut_back = gaussian_mixture_hockey_stick(uxw, uxm, uyw, uym, variance, both_directions=False)
    hurts = False
    for eps in (0.0, 0.25, 0.5, 1.0, 2.0):
        a = math.exp(eps)
        assert cut.delta(eps)[1][0] <= uncut.delta(eps)[0][0] + py + a * px + 1e-12
        assert cut_back.delta(eps)[1][0] <= uncut_back.delta(eps)[0][0] + px + a * py + 1e-12
        hurts |= cut.delta(eps)[0][0] > uncut.delta(eps)[1][0] + 1e-9
    assert hurts, "the instance must show that the cut alone (no overflow term) would be optimistic"
    # the library's bound on this overflow probability covers the exact one, for both worlds
    cfg = TrainingConfig(
        dataset_size=len(others),
        batch_size=-(-len(others) // t),
        noise_multiplier=z,
        steps=t * epochs,
        sampling="random_allocation",
        max_batch_size=length,
    )
    assert cfg.steps_per_epoch == t
    assert overflow.overflow_probability(cfg) >= max(px, py)


def test_library_epsilon_is_never_below_the_exact_cut_run():
    others, t, length, z = [1.0, 1.0, -1.0, -1.0], 2, 4, 0.7
    xw, xm, _ = _final_sums(others, t, 1, length, keep_largest=False)
    yw, ym, _ = _final_sums([*others, 1.0], t, 1, length, keep_largest=True)
    exact = gaussian_mixture_hockey_stick(yw, ym, xw, xm, z * z * t)
    params = dict(dataset_size=4, batch_size=2, steps=2, noise_multiplier=z, sampling="random_allocation")
    for delta in (0.3, 0.45, 0.6):
        found = lp.epsilon("best", delta=delta, max_batch_size=length, **params).epsilon
        assert found >= exact.epsilon(delta)[1], delta


# ---------------------------------------------------------------- the library's numbers


def _params(**changes):
    params = dict(
        dataset_size=6000, batch_size=150, noise_multiplier=1.5, epochs=5, sampling="random_allocation", delta=1e-5
    )
    return params | changes


@pytest.mark.parametrize("relation", ["add_or_remove_one", "replace_one"])
def test_epsilon_and_delta_are_lemma_c_of_the_uncut_rows(relation):
    length = 262
    cut = lp.applicable_bounds(**_params(max_batch_size=length, relation=relation))
    uncut = lp.applicable_bounds(**_params(relation=relation))
    cfg, _ = lp.build(**{k: v for k, v in _params(max_batch_size=length, relation=relation).items() if k != "delta"})
    p = overflow.overflow_probability(cfg)
    assert 1e-16 < p < 1e-9
    compared = 0
    for bid, ev in cut.items():
        if ev.epsilon is None or bid == "best":
            continue
        plain = uncut[bid]
        eps = ev.epsilon
        assert ev.rdp is None and ev.profile is not None  # (epsilon, delta) only
        # (F) holds at the value returned, and it is not below the uncut row's epsilon
        assert eps >= plain.epsilon
        if not math.isfinite(eps):  # vacuous only where (1 + e^eps) p reaches delta at the uncut epsilon already
            assert (1 + math.exp(min(plain.epsilon, 700.0))) * p >= 1e-5
            continue
        assert plain.profile is not None or plain.rdp is not None
        room = 1e-5 - (1 + math.exp(eps)) * p
        assert eps >= _uncut_epsilon(bid, relation, room) - 1e-12
        # delta at epsilon: the uncut delta plus (1 + e^eps) p
        plain_cfg, a = lp.build(**{k: v for k, v in _params(relation=relation).items() if k != "delta"})
        uncut_delta, _ = host.delta_of(bid, plain_cfg, a, eps)
        cut_delta, _ = host.delta_of(bid, cfg, a, eps)
        assert cut_delta == pytest.approx(uncut_delta + (1 + math.exp(eps)) * p, rel=1e-12)
        compared += 1
    assert compared >= (3 if relation == "replace_one" else 1)  # replace-one: an RDP row (composition) too


def _uncut_epsilon(bid, relation, delta):
    return lp.epsilon(bid, **_params(relation=relation) | {"delta": delta}).epsilon


def test_vacuous_when_the_overflow_is_as_large_as_delta():
    cfg_params = _params(max_batch_size=150)
    cfg, _ = lp.build(**{k: v for k, v in cfg_params.items() if k != "delta"})
    assert overflow.overflow_probability(cfg) >= 0.5e-5
    assert lp.epsilon("best", **cfg_params).epsilon == math.inf


def test_a_cut_run_has_no_renyi_curve_and_no_mu():
    cfg, a = lp.build(**{k: v for k, v in _params(max_batch_size=200).items() if k != "delta"})
    with pytest.raises(NotApplicableError, match="max_batch_size = 200 has no Renyi-DP curve"):
        lp.rdp("best", [2.0, 8.0], config=cfg, assumptions=a)
    with pytest.raises(NotApplicableError, match="no Renyi-DP curve"):
        lp.rdp("composition", [2.0, 8.0], config=cfg, assumptions=a)
    assert host.gaussian_mus(lp.BOUNDS["composition-gdp-epochs"], cfg.replace(relation="replace_one"), a) == ()


def test_max_batch_size_is_for_random_allocation_only():
    with pytest.raises(ValueError, match="max_batch_size must be None unless sampling is random_allocation"):
        TrainingConfig(
            dataset_size=10,
            batch_size=2,
            noise_multiplier=1,
            steps=5,
            sampling="poisson",
            relation="replace_one",
            max_batch_size=4,
        )
    with pytest.raises(ValueError, match=r"max_batch_size must be an integer >= 1\. Found 0"):
        TrainingConfig(
            dataset_size=10, batch_size=2, noise_multiplier=1, steps=5, sampling="random_allocation", max_batch_size=0
        )


# ---------------------------------------------------------------- the overflow probability and L


@pytest.mark.parametrize("length", [50, 60, 75, 100])
def test_overflow_probability_is_the_union_bound_of_binomial_tails(length):
    cfg = TrainingConfig(
        dataset_size=1000,
        batch_size=50,
        noise_multiplier=1,
        steps=45,
        sampling="random_allocation",
        max_batch_size=length,
    )
    assert cfg.steps_per_epoch == 20
    expected = min(1.0, 45 * _direct_tail(1001, 1 / 20, length))
    assert overflow.overflow_probability(cfg) == pytest.approx(expected, rel=1e-9)


def test_overflow_probability_with_k_allocations_and_full_batch():
    cfg = TrainingConfig(
        dataset_size=300,
        batch_size=60,
        noise_multiplier=1,
        steps=10,
        sampling="random_allocation",
        allocations_per_epoch=2,
        max_batch_size=90,
    )
    assert overflow.overflow_probability(cfg) == pytest.approx(10 * _direct_tail(301, 2 / 10, 90), rel=1e-9)
    full = dict(dataset_size=8, batch_size=8, noise_multiplier=1, steps=3, sampling="random_allocation")
    assert overflow.overflow_probability(TrainingConfig(**full, max_batch_size=8)) == 1.0  # n + 1 rows in one world
    assert overflow.overflow_probability(TrainingConfig(**full, max_batch_size=9)) == 0.0


@pytest.mark.parametrize(("n", "b", "k", "steps", "target"), [(60000, 1500, 1, 2000, 1e-9), (1792, 64, 1, 84, 1e-9),
                                                              (500, 100, 2, 30, 1e-6)])  # fmt: skip
def test_padded_batch_size_is_the_smallest_length_meeting_the_target(n, b, k, steps, target):
    length = overflow.padded_batch_size(n, b, k, steps, target)
    t = -(-n * k // b)
    assert steps * _direct_tail(n + 1, k / t, length) <= target
    assert steps * _direct_tail(n + 1, k / t, length - 1) > target


def _direct_tail(m: int, q: float, length: int) -> float:
    """P[Binomial(m, q) > length], the sum of its terms (each in log space: m up to 60001)."""
    j = np.arange(length + 1, m + 1)
    logs = special.gammaln(m + 1) - special.gammaln(j + 1) - special.gammaln(m - j + 1) + j * math.log(q)
    logs += (m - j) * math.log1p(-q)
    return float(np.exp(logs).sum())


def test_cut_epsilon_answers_a_solution_of_condition_f():
    mu = 1.0

    def epsilon_at(d):  # 1-GDP's epsilon at d (any valid non-increasing curve will do)
        lo, hi = 0.0, 50.0
        for _ in range(200):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if host.gaussian_delta(mu, mid) > d else (lo, mid)
        return hi

    for p in (1e-12, 1e-9, 1e-8, 5e-8):
        eps = overflow.cut_epsilon(epsilon_at, 1e-5, p)
        assert math.isfinite(eps)
        assert eps >= epsilon_at(1e-5 - (1 + math.exp(eps)) * p)
        assert eps >= epsilon_at(1e-5)
    assert overflow.cut_epsilon(epsilon_at, 1e-5, 5e-6) == math.inf  # (1 + e^eps) p >= delta for every eps >= 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert overflow.cut_epsilon(epsilon_at, 1e-5, 0.0) == epsilon_at(1e-5)


def test_cut_epsilon_beyond_e700_still_checks_condition_f():
    """An epsilon above 700 with p below delta e^-700 (a subnormal p: a far tail): (1 + e^eps) p must be formed
    at eps itself, not at min(eps, 700), else (F) is checked at a room larger than the truth. Here a row whose
    epsilon is 800 at every delta: (1 + e^800) p is far above delta, so no epsilon satisfies (F) near 800."""
    p = 1e-315
    assert (1.0 + math.exp(700.0)) * p < 1e-5 < math.exp(800.0 + math.log(p))  # the clamp's room looks positive
    assert overflow.cut_epsilon(lambda d: 800.0, 1e-5, p) == math.inf
    eps = overflow.cut_epsilon(lambda d: 690.0, 1e-5, p)  # below the threshold: a solution of (F), checked
    assert 690.0 <= eps < 690.001
    assert 1e-5 - math.exp(eps + math.log(p)) - p > 0.0
    # the same through the library: noise 0.05 gives epsilon 969.6 uncut, and L = 587 a p of 1.6e-313
    params = {
        "sampling": "random_allocation",
        "relation": "replace_one",
        "dataset_size": 1000,
        "batch_size": 100,
        "steps": 10,
        "noise_multiplier": 0.05,
    }
    cut, _ = lp.build(**params, max_batch_size=587)
    assert 0.0 < overflow.overflow_probability(cut) < 1e-5 * math.exp(-700.0)
    assert 700.0 < lp.epsilon("best", 1e-5, **params).epsilon < math.inf
    assert lp.epsilon("best", 1e-5, config=cut).epsilon == math.inf
    assert overflow.cut_delta(0.0, 969.0, overflow.overflow_probability(cut)) == 1.0
    assert overflow.cut_delta(0.0, 705.0, 1e-315) < 1e-5  # no cap: a tiny p keeps its delta above 700


def test_outputs_name_the_cut():
    result = lp.epsilon("best", **_params(max_batch_size=262))
    assert "random_allocation (batches cut at 262 examples) sampling" in " ".join(str(result).split())
    assert result.to_dict()["max_batch_size"] == 262
    assert "fixed-length-batches.md" in result.explain()
    assert lp.epsilon("best", **_params()).to_dict()["max_batch_size"] is None


def test_the_padded_hosts_learning_rate_is_named_where_max_batch_size_is():
    """A host dividing by its L rows at step size eta is the core's update at eta b / L (part 5); given eta
    itself, the last-iterate rows read a larger step (with strong convexity, more contraction: a smaller
    epsilon than proven). Every place that documents max_batch_size says which learning rate to give."""
    from lastiter_plugins.cli import PARAMETER_FLAGS

    params = {
        "sampling": "random_allocation",
        "dataset_size": 1000,
        "batch_size": 100,
        "noise_multiplier": 1.0,
        "steps": 50,
        "smoothness": 1.0,
        "strong_convexity": 0.05,
        "diameter": 10.0,
        "gradient_norms_within_clip": True,
        "max_batch_size": 170,
    }
    host_eta = lp.epsilon("best", 1e-5, learning_rate=1.0, **params).epsilon
    core_eta = lp.epsilon("best", 1e-5, learning_rate=100 / 170, **params).epsilon
    assert host_eta < core_eta  # the number a user giving the host's eta would get is below the proven one
    for text in (TrainingConfig.__doc__ or "", PARAMETER_FLAGS["max_batch_size"][1]["help"]):
        assert "eta * b / L" in " ".join(text.split())
