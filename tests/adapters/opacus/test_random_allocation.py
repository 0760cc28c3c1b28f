"""Opacus adapter, random allocation: ``RandomAllocationSampler`` with ``make_private(poisson_sampling=False)``.

Real Opacus training of small models on CPU (generated data): the run gets the core's random-allocation number
for what ran (``lastiter_plugins.epsilon`` with the sampler's k and b and Opacus' divisor, computed here
without the adapter), and a loop whose batches are not the sampler's allocations is refused with its cause.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")
pytest.importorskip("PLD_accounting")

from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins.adapters import opacus as lo  # noqa: E402

from .support import OPACUS_REGISTRY, dataset  # noqa: E402
from .support import engine as _engine  # noqa: E402

torch.set_num_threads(1)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
    pytest.mark.filterwarnings("ignore:.*[Ff]ull backward hook"),
]

N, D, Z, LR, DELTA, W = 200, 4, 2.0, 0.5, 1e-5, 0.05
#: logistic regression on features of norm 1, with torch SGD's weight_decay W declared as an l2 term outside the clip
DECLARED = {"smoothness": 0.25 + W, "clipped_loss_convex_smooth": True, "strong_convexity": W, "l2_outside_clip": True}


def _private(request, sampler, loader=None):
    """make_private over ``sampler``'s loader (logistic regression): (engine, model, optimizer, loader)."""
    name = lo.register("ra-" + request.node.name, sampling="random_allocation", dataset_size=N, learning_rate=LR,
                       force=True, **DECLARED)  # fmt: skip
    torch.manual_seed(0)
    model = nn.Linear(D, 1)
    engine = _engine(name)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR, weight_decay=W),
        data_loader=loader if loader is not None else sampler.data_loader(dataset(N, D)),
        noise_multiplier=Z, max_grad_norm=1.0, poisson_sampling=False,
    )  # fmt: skip
    return engine, model, optimizer, loader


def _train(model, optimizer, loader, epochs: int, *, skip_empty: bool = False, reseed=None) -> None:
    """``epochs`` epochs, one step per batch; ``reseed(epoch)`` before each epoch when given."""
    criterion = nn.BCEWithLogitsLoss()
    for epoch in range(epochs):
        if reseed is not None:
            reseed(epoch)
        for x, y in loader:
            if skip_empty and len(x) == 0:
                continue
            optimizer.zero_grad()
            criterion(model(x).squeeze(-1), y).backward()
            optimizer.step()


def _run(request, sampler, epochs: int, **kw):
    """Train for ``epochs`` epochs on ``sampler``'s loader; return (engine, optimizer)."""
    engine, model, optimizer, loader = _private(request, sampler)
    _train(model, optimizer, loader, epochs, **kw)
    return engine, optimizer


LAST = "shifted-interpolation-random-allocation"


def _core(b: int, k: int, steps: int, divisor: float, bound: str = lp.BEST, l2: float | None = None) -> float:
    """The core's number for the run: Opacus divides the noisy sum by ``divisor``, the core by b, so the core's step
    size is lr b / divisor and torch's weight decay W, added after the division, is W divisor / b on its mean
    (``l2``: another coefficient)."""
    declared = {**DECLARED, "strong_convexity": W * divisor / b if l2 is None else l2}
    return lp.epsilon(
        bound, dataset_size=N, batch_size=b, noise_multiplier=Z, steps=steps, sampling="random_allocation",
        allocations_per_epoch=k, learning_rate=LR * b / divisor, delta=DELTA, **declared,
    ).epsilon  # fmt: skip


@pytest.mark.parametrize(("b", "k", "epochs"), [(20, 1, 3), (30, 1, 2), (25, 2, 2)], ids=["b|n", "b!|n", "k=2"])
def test_a_trained_model_gets_the_random_allocation_number(request, b, k, epochs):
    """n = 200: b = 20 gives t = 10 and Opacus' divisor int(n / t) = 20 = b; b = 30 gives t = 7, divisor 28; k = 2,
    b = 25 gives t = 16, divisor 12 (about b / k): the core's step size is lr b / divisor."""
    sampler = lo.RandomAllocationSampler(N, b, allocations_per_epoch=k)
    engine, optimizer = _run(request, sampler, epochs)
    t = -(-N * k // b)
    facts = lo.describe_data_loader(sampler.data_loader(dataset(N, D)))
    assert (facts.sampling, facts.num_batches, facts.allocations_per_epoch) == (lp.Sampling.RANDOM_ALLOCATION, t, k)
    assert optimizer.expected_batch_size == N // t
    assert engine.accountant.steps == epochs * t
    eps = engine.get_epsilon(DELTA)
    assert eps == pytest.approx(_core(b, k, epochs * t, N // t), rel=1e-12)
    report = engine.accountant.report(DELTA)
    assert (report.sampling, report.relation, report.steps) == ("random_allocation", "add_or_remove_one", epochs * t)
    assert "NOT VALID" in str(report)  # Opacus' own numbers are Poisson's


def test_the_last_iterate_row_counts_opacus_divisor(request):
    """The step size and l2 term the last-iterate row counts are Opacus' (lr b / divisor, W divisor / b): with k = 2
    the divisor is about b / 2, and counting the step size lr b / divisor with the declared W would count twice
    the contraction torch's weight decay gives (a number below the run's)."""
    b, k, epochs = 25, 2, 2
    t = -(-N * k // b)
    engine, _ = _run(request, lo.RandomAllocationSampler(N, b, allocations_per_epoch=k), epochs)
    row = next(r for r in engine.accountant.report(DELTA).rows if r.bound == LAST)
    assert row.applies
    assert row.epsilon == pytest.approx(_core(b, k, epochs * t, N // t, LAST), rel=1e-12)
    assert row.epsilon > 1.02 * _core(b, k, epochs * t, N // t, LAST, l2=W)  # 2.764 vs 2.650


def test_empty_batches_are_steps(request):
    """b = 2, t = 100: about e^-2 of the batches are empty; each is a step (noise only), trained like any other."""
    sampler = lo.RandomAllocationSampler(N, 2)
    engine, _ = _run(request, sampler, 1)
    assert engine.accountant.steps == 100


def test_skipping_empty_batches_is_refused(request):
    sampler = lo.RandomAllocationSampler(N, 2, generator=np.random.default_rng(0))
    with pytest.raises(lp.PipelineChangedError, match=r"was drawn and used by no step \(a loop that skips batches"):
        _run(request, sampler, 1, skip_empty=True)


def test_a_generator_reseeded_every_epoch_is_refused(request):
    """The same seed every epoch: fixed bins, random allocation for one epoch only."""
    sampler = lo.RandomAllocationSampler(N, 20)

    def reseed(epoch: int) -> None:
        sampler.generator = np.random.default_rng(1)

    with pytest.raises(lp.PipelineChangedError, match=r"equal to an earlier epoch's: a generator re-seeded"):
        _run(request, sampler, 2, reseed=reseed)


def test_a_torch_generator_reseeded_every_epoch_is_refused(request):
    gen = torch.Generator()
    sampler = lo.RandomAllocationSampler(N, 20, generator=gen)
    with pytest.raises(lp.PipelineChangedError, match=r"equal to an earlier epoch's"):
        _run(request, sampler, 2, reseed=lambda epoch: gen.manual_seed(3))


def test_a_fresh_torch_generator_is_accepted(request):
    gen = torch.Generator()
    gen.manual_seed(3)
    engine, _ = _run(request, lo.RandomAllocationSampler(N, 20, generator=gen), 2)
    assert engine.accountant.steps == 20


def test_a_subclass_of_the_sampler_is_not_recognised(request):
    """The sampler is recognised by its class: a subclass may draw anything."""

    class Mine(lo.RandomAllocationSampler):
        pass

    with pytest.raises(lo.LastIterateConfigurationError, match="batch_sampler=Mine"):
        _run(request, Mine(N, 20), 1)


def test_a_sampler_over_another_size_is_refused(request):
    sampler = lo.RandomAllocationSampler(N - 1, 20)
    loader = DataLoader(dataset(N, D), batch_sampler=sampler)
    with pytest.raises(
        lo.LastIterateConfigurationError, match=r"dataset_size must equal len\(dataset\) = 200. Found 199"
    ):
        _private(request, sampler, loader)


def test_declared_sampling_must_match_the_sampler(request):
    name = lo.register("ra-" + request.node.name, sampling="reshuffle", dataset_size=N, force=True)
    model = nn.Linear(D, 1)
    with pytest.raises(lo.LastIterateConfigurationError, match="implements 'random_allocation'"):
        _engine(name).make_private(
            module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
            data_loader=lo.RandomAllocationSampler(N, 20).data_loader(dataset(N, D)),
            noise_multiplier=Z, max_grad_norm=1.0, poisson_sampling=False,
        )  # fmt: skip


def test_a_changed_sampler_is_refused(request):
    """k changed after make_private: the loader no longer implements what is accounted."""
    sampler = lo.RandomAllocationSampler(N, 20)
    _, model, optimizer, loader = _private(request, sampler)
    _train(model, optimizer, loader, 1)
    sampler.allocations_per_epoch = 2
    with pytest.raises(lp.PipelineChangedError, match="the data loader changed after make_private"):
        _train(model, optimizer, loader, 1)


def test_the_example_gets_the_random_allocation_number():
    """examples/opacus_random_allocation.py (docs/opacus.md shows its output): the core's number for its run, Opacus'
    own numbers NOT VALID beside it, every example once an epoch, and the shuffled loader's number far above."""
    from tests.stories.docs_blocks import _script

    result = _script("examples/opacus_random_allocation.py").main()
    expected = lp.epsilon(lp.BEST, DELTA, dataset_size=1000, batch_size=50, noise_multiplier=1.0, steps=60,
                          sampling="random_allocation")  # fmt: skip
    assert result["epsilon"] == expected.epsilon
    assert expected.winner == "composition-pld-random-allocation"
    assert len(result["sizes"]) == 60 and sum(result["sizes"]) == 3000
    assert all("NOT VALID" in line for line in result["report"].host) and result["report"].host
    assert result["shuffled"] > 5 * result["epsilon"]


def test_loader_workers_draw_ahead_and_the_run_is_accepted(request):
    """num_workers=2: the workers fetch batches ahead of the loop; the steps still use the allocation's batches in order."""
    sampler = lo.RandomAllocationSampler(N, 20)
    engine, model, optimizer, loader = _private(request, sampler, sampler.data_loader(dataset(N, D), num_workers=2))
    _train(model, optimizer, loader, 2)
    assert engine.accountant.steps == 20


def test_a_checkpoint_resumes_at_an_epoch_end_only(request):
    sampler = lo.RandomAllocationSampler(N, 20)
    engine, model, optimizer, loader = _private(request, sampler)
    _train(model, optimizer, loader, 1)
    state = engine.accountant.state_dict()
    engine2, model2, optimizer2, loader2 = _private(request, lo.RandomAllocationSampler(N, 20))
    engine2.accountant.load_state_dict(state)
    model2.load_state_dict(model.state_dict())
    _train(model2, optimizer2, loader2, 1)
    assert engine2.get_epsilon(DELTA) == pytest.approx(_core(20, 1, 20, 20), rel=1e-12)
    # stopped mid-epoch: the resumed loader would start a new allocation inside an accounted epoch
    engine3, model3, optimizer3, loader3 = _private(request, lo.RandomAllocationSampler(N, 20))
    for x, y in itertools.islice(loader3, 3):
        optimizer3.zero_grad()
        nn.BCEWithLogitsLoss()(model3(x).squeeze(-1), y).backward()
        optimizer3.step()
    state = engine3.accountant.state_dict()
    engine4, model4, optimizer4, loader4 = _private(request, lo.RandomAllocationSampler(N, 20))
    engine4.accountant.load_state_dict(state)
    model4.load_state_dict(model3.state_dict())
    with pytest.raises(lo.LastIterateConfigurationError, match="must resume at an epoch boundary"):
        _train(model4, optimizer4, loader4, 1)


@pytest.mark.skipif(
    not OPACUS_REGISTRY,
    reason="make_private_with_epsilon creates the accountant by name: Opacus' accountant registry (Opacus >= 1.6)",
)
def test_make_private_with_epsilon_calibrates_for_random_allocation(request):
    name = lo.register("ra-" + request.node.name, sampling="random_allocation", dataset_size=N, force=True)
    engine = _engine(name)
    model = nn.Linear(D, 1)
    sampler = lo.RandomAllocationSampler(N, 20)
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), data_loader=sampler.data_loader(dataset(N, D)),
        target_epsilon=3.0, target_delta=DELTA, epochs=3, max_grad_norm=1.0, poisson_sampling=False,
    )  # fmt: skip
    _train(model, optimizer, loader, 3)
    eps = engine.get_epsilon(DELTA)
    assert eps <= 3.0
    assert eps == lp.epsilon(lp.BEST, DELTA, dataset_size=N, batch_size=20, noise_multiplier=optimizer.noise_multiplier,
                             steps=30, sampling="random_allocation").epsilon  # fmt: skip


def test_batch_memory_manager_splits_the_allocations_batches(request):
    """Opacus' BatchMemoryManager splits each allocated batch into physical batches of at most 8: one noisy step
    per allocated batch, the same number."""
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    sampler = lo.RandomAllocationSampler(N, 20)
    engine, model, optimizer, loader = _private(request, sampler)
    for _ in range(2):
        with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=optimizer) as split:
            _train(model, optimizer, split, 1)
    assert engine.accountant.steps == 20
    assert engine.get_epsilon(DELTA) == pytest.approx(_core(20, 1, 20, 20), rel=1e-12)


def test_a_never_seeded_torch_generator_makes_the_allocations_public(request):
    """Issue 38: a torch.Generator() never seeded is in torch's fixed fresh state: the allocations are public, and
    no random-allocation row holds under add-or-remove (the run is refused naming the generator)."""
    sampler = lo.RandomAllocationSampler(N, 20, generator=torch.Generator())
    with pytest.raises(lp.PipelineChangedError, match=r"RandomAllocationSampler's generator is in torch's fixed"):
        _run(request, sampler, 1)
