"""lastiter_plugins/adapters/_derivation.py: the pipeline derived from the index stream, against the declared scheme.

Pure Python (no host library): each case feeds the batches a sampler drew and the gradients each
step summed, and checks the step is accepted or refused with its cause.
"""

from __future__ import annotations

import random

import pytest

import lastiter_plugins as lp
from lastiter_plugins.adapters._derivation import Derivation, DrawnBatch

N, B = 12, 4
L = N // B


def _pass(pass_id: int, order: list[int]) -> list[DrawnBatch]:
    return [DrawnBatch(pass_id, k, tuple(order[k * B : (k + 1) * B])) for k in range(L)]


def _feed(derivation: Derivation, batches: list[DrawnBatch]) -> str | None:
    for batch in batches:
        problem = derivation.check_step(batch, len(batch.indices))
        if problem is not None:
            return problem
    return None


def _epochs(sampling: str) -> Derivation:
    return Derivation(lp.Sampling.parse(sampling), N, L, None)


def test_one_gradient_per_drawn_example():
    derivation = _epochs("cyclic")
    batch = DrawnBatch(1, 0, (0, 1, 2, 3))
    assert "holds 4 examples. Found 8 per-example gradients" in derivation.check_step(batch, 8)
    assert derivation.steps == 0
    assert derivation.check_step(batch, 4) is None and derivation.steps == 1


def test_a_step_without_a_drawn_batch_is_refused():
    assert "no batch drawn" in _epochs("cyclic").check_step(None, 4)


@pytest.mark.parametrize(("indices", "match"), [((0, 0, 1, 2), "at most once"), ((0, 1, 2, N), r"lie in \[0, 12\)")])
def test_indices_must_be_distinct_and_in_the_dataset(indices, match):
    assert match.split("\\")[0] in _epochs("cyclic").check_step(DrawnBatch(1, 0, indices), 4)


def test_cyclic_accepts_the_same_order_and_refuses_another():
    order = list(range(N))
    derivation = _epochs("cyclic")
    assert _feed(derivation, _pass(1, order) + _pass(2, order)) is None
    assert "different from the first epoch's" in _feed(derivation, _pass(3, order[::-1]))


def test_shuffle_once_refuses_a_second_permutation():
    first, second = random.Random(0).sample(range(N), N), random.Random(1).sample(range(N), N)
    derivation = _epochs("shuffle_once")
    assert _feed(derivation, _pass(1, first) + _pass(2, first)) is None
    assert "one order of the data" in _feed(derivation, _pass(3, second))


def test_reshuffle_refuses_a_repeated_permutation_and_accepts_fresh_ones():
    rng = random.Random(0)
    derivation = _epochs("reshuffle")
    assert _feed(derivation, [b for e in range(1, 4) for b in _pass(e, rng.sample(range(N), N))]) is None
    repeated = rng.sample(range(N), N)
    derivation = _epochs("reshuffle")
    assert _feed(derivation, _pass(1, repeated)) is None
    assert "equal to an earlier epoch's" in _feed(derivation, _pass(2, repeated))


def test_reshuffle_refuses_an_equal_prefix_only_beyond_chance():
    """n = 40, b = 2: a fresh permutation starts with given 2k indices with probability 1/(40 39 ... (41-2k)):
    2^-31 after 3 batches (chance), 2^-41 after 4 (refused, before the pass ends)."""
    n, b = 40, 2
    derivation = Derivation(lp.Sampling.RESHUFFLE, n, n // b, None)
    for pass_id in (1, 2):
        for k in range(n // b if pass_id == 1 else 3):
            assert derivation.check_step(DrawnBatch(pass_id, k, (2 * k, 2 * k + 1)), b) is None
    assert "equal to an earlier" in derivation.check_step(DrawnBatch(2, 3, (6, 7)), b)


@pytest.mark.parametrize("sampling", ["cyclic", "shuffle_once", "reshuffle"])
def test_epoch_schemes_refuse_a_pass_broken_off(sampling):
    derivation = _epochs(sampling)
    order = list(range(N))
    assert _feed(derivation, _pass(1, order)[:2]) is None
    assert "whole passes" in _feed(derivation, _pass(2, order))


def test_epoch_schemes_refuse_a_batch_drawn_and_not_used():
    derivation = _epochs("cyclic")
    batches = _pass(1, list(range(N)))
    assert _feed(derivation, batches[:1]) is None
    assert "drawn and not used" in _feed(derivation, batches[2:])


def _poisson_pass(pass_id: int, rng: random.Random, q: float, n: int = 50) -> list[DrawnBatch]:
    return [DrawnBatch(pass_id, k, tuple(i for i in range(n) if rng.random() < q)) for k in range(round(1 / q))]


def test_poisson_refuses_a_repeated_pass_and_accepts_broken_ones():
    q = 0.1
    derivation = Derivation(lp.Sampling.POISSON, 50, 10, q)
    rng = random.Random(0)
    assert _feed(derivation, _poisson_pass(1, rng, q)[:3] + _poisson_pass(2, rng, q)) is None  # broken off: fine
    repeated = _poisson_pass(3, random.Random(7), q)
    assert _feed(derivation, repeated) is None
    again = [DrawnBatch(4, b.position, b.indices) for b in repeated]
    assert "equal to an earlier pass's" in _feed(derivation, again)


@pytest.mark.parametrize("sampling", ["cyclic", "shuffle_once"])
def test_fixed_order_compares_batches_exactly_not_by_hash(sampling, monkeypatch):
    # Every batch hashing alike must not let a second epoch with other batches pass as the first's order
    # (a hash collision may only refuse a genuine run, never accept a different one).
    from lastiter_plugins.adapters import _derivation

    monkeypatch.setattr(_derivation, "hash", lambda _: 0, raising=False)
    order = list(range(N))
    derivation = _epochs(sampling)
    assert _feed(derivation, _pass(1, order) + _pass(2, order)) is None
    assert "different from the first epoch's" in _feed(derivation, _pass(3, order[::-1]))


def test_fixed_order_checkpoint_keeps_the_first_pass_exactly():
    order = list(range(N))
    derivation = _epochs("cyclic")
    assert _feed(derivation, _pass(1, order)) is None
    state = derivation.state()
    assert state["first"] == [order[k * B : (k + 1) * B] for k in range(L)]
    resumed = _epochs("cyclic")
    resumed.restore(state)
    assert _feed(resumed, _pass(7, order)) is None
    assert "different from the first epoch's" in _feed(resumed, _pass(8, order[::-1]))
    old = {"steps": state["steps"], "passes": state["passes"]}
    with pytest.raises(ValueError, match="no first pass"):
        _epochs("cyclic").restore(old)


def test_a_later_fixed_order_pass_is_a_permutation_without_the_seen_check():
    # After the first pass, equality with it position by position is what makes a pass a permutation.
    order = list(range(N))
    derivation = _epochs("cyclic")
    assert _feed(derivation, _pass(1, order)) is None
    repeated = [DrawnBatch(2, 0, (0, 1, 2, 3)), DrawnBatch(2, 1, (0, 1, 2, 3))]
    assert "different from the first epoch's" in _feed(derivation, repeated)
