"""Opacus adapter: the accountant verifies the run that actually happens, step by step.

Each case below got an epsilon below the truth from the first version of the adapter
(which froze the facts of the pipeline at make_private); each must now be refused with
``lastiter_plugins.PipelineChangedError`` (or, at make_private, NotApplicableError).
Real Opacus training of small models on CPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from torch.utils.data import (  # noqa: E402
    ConcatDataset,
    DataLoader,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
)

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins.adapters import opacus as lo  # noqa: E402
from lastiter_plugins.adapters.opacus import _internals  # noqa: E402

from .support import dataset, left  # noqa: E402
from .support import engine as _engine  # noqa: E402

torch.set_num_threads(1)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
    pytest.mark.filterwarnings("ignore:.*[Ff]ull backward hook"),
]

N, B, LR, DELTA = 500, 50, 0.5, 1e-5


def _dataset(n: int = N) -> TensorDataset:
    return dataset(n)


# max_grad_norm of the runs that declare gradient_norms_within_clip=True: the linear model below has per-example
# gradient norms |sigmoid(u) - y| |(x, 1)| < sqrt(2) (unit-norm features), so the declaration holds
WITHIN_CLIP = 1.5


def _register(request, **kw) -> str:
    params = {"sampling": "cyclic", "dataset_size": N, "learning_rate": LR, "smoothness": 0.25, **kw}
    return lo.register("v-" + request.node.name, force=True, **params)


def _private(name, loader, **kw):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    engine = _engine(name)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), data_loader=loader,
        noise_multiplier=1.0, **{"max_grad_norm": 1.0, "poisson_sampling": False, **kw},
    )  # fmt: skip
    return engine, model, optimizer, loader


def _loss(model, xb, yb):
    return torch.nn.functional.binary_cross_entropy_with_logits(model(xb).squeeze(-1), yb)


def _train(model, optimizer, loader, epochs=1):
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            _loss(model, xb, yb).backward()
            optimizer.step()


# ---------------------------------------------------------------- samplers over a subset


@pytest.mark.parametrize(
    "sampler",
    [lambda ds: SequentialSampler(range(N // 2)), lambda ds: RandomSampler(range(N // 2), num_samples=N)],
    ids=["sequential-over-half", "random-over-half-num-samples-n"],
)
def test_sampler_over_a_subset_is_refused(request, sampler):
    # each of the 250 examples is used twice as often as an n = 500 accountant counts
    name = _register(request, sampling="reshuffle" if "random" in request.node.name else "cyclic")
    loader = DataLoader(_dataset(), batch_size=B, sampler=sampler(_dataset()))
    with pytest.raises(lp.NotApplicableError, match=r"len\(dataset\) = 500|over all 500 examples"):
        _private(name, loader)


def _oversampled(data):
    return ConcatDataset([data, Subset(data, list(range(20)))])  # 20 people twice (class balancing)


def _nested_oversampled(data):
    return ConcatDataset([Subset(data, list(range(N - 20))), ConcatDataset([Subset(data, range(N - 40, N))])])


def _repeated_indices(data):
    return Subset(data, [*range(N - 20), *range(20)])


@pytest.mark.parametrize("build", [_oversampled, _nested_oversampled, _repeated_indices],
                         ids=["concat-with-subset", "nested", "subset-repeating-indices"])  # fmt: skip
@pytest.mark.parametrize("poisson", [False, True], ids=["cyclic", "poisson"])
def test_dataset_holding_an_example_twice_is_refused(request, build, poisson):
    # one person in two rows of the dataset: its change moves two examples (sensitivity 2C), which no bound counts
    data = build(_dataset())
    name = _register(
        request,
        dataset_size=len(data),
        **({"sampling": "poisson", "relation": "add_or_remove_one", "orders": [2.0]} if poisson else {}),
    )
    with pytest.raises(lp.NotApplicableError, match=r"each person's data must be one example .* 20 example\(s\) of an "
                       r"underlying TensorDataset appearing more than once .* Use each example once"):  # fmt: skip
        _private(name, DataLoader(data, batch_size=B), poisson_sampling=poisson)


def test_dataset_of_disjoint_parts_of_one_dataset_is_accepted(request):
    # a ConcatDataset of disjoint Subsets of one dataset (and of another dataset) holds each example once
    data, other = _dataset(), _dataset(100)
    joined = ConcatDataset([Subset(data, range(250, N)), Subset(data, range(250)), other])
    name = _register(request, dataset_size=len(joined))
    engine, model, optimizer, loader = _private(name, DataLoader(joined, batch_size=B))
    _train(model, optimizer, loader)
    assert engine.accountant.steps == len(joined) // B
    assert lo.describe_data_loader(DataLoader(joined, batch_size=B)).dataset_size == N + 100


def test_dataset_shrinking_after_make_private_is_refused(request):
    name = _register(request)
    data = _dataset()
    engine, model, optimizer, loader = _private(name, DataLoader(data, batch_size=B))
    _train(model, optimizer, loader)
    data.tensors = tuple(t[: N // 2] for t in data.tensors)  # the same dataset object, half the examples
    with pytest.raises(lp.PipelineChangedError, match=r"len\(dataset\): 500 -> 250"):
        _train(model, optimizer, loader)
    assert engine.accountant.steps == N // B
    with pytest.raises(lp.PipelineChangedError, match="void"):
        engine.get_epsilon(DELTA)


def test_loader_mutated_after_make_private_is_refused(request):
    name = _register(request)
    _, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B))
    _train(model, optimizer, loader)
    loader.batch_sampler.batch_size = 2 * B
    with pytest.raises(lp.PipelineChangedError, match=r"batch_size: 50 -> 100"):
        _train(model, optimizer, loader)


def test_loader_replaced_after_make_private_is_refused(request):
    name = _register(request)
    _, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B))
    _train(model, optimizer, loader)
    with pytest.raises(lp.PipelineChangedError, match=r"no batch drawn from it"):
        _train(model, optimizer, DataLoader(_dataset(), batch_size=B // 2))
    # a replacement with the same batch size over other data, the bound loader gone
    _engine, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B))
    _train(model, optimizer, loader)
    del loader
    half = torch.utils.data.Subset(_dataset(), range(N // 2))
    with pytest.raises(lp.PipelineChangedError, match="no longer exists"):
        _train(model, optimizer, DataLoader(half, batch_size=B))


def _reverse_permutation(loader):
    sampler = loader.batch_sampler.sampler
    sampler._permutation = tuple(reversed(sampler._permutation))


def _sample_with_replacement(loader):
    loader.batch_sampler.sampler.replacement = True


def _halve_sample_rate(loader):
    loader.batch_sampler.sample_rate /= 2


@pytest.mark.parametrize(
    ("sampling", "change", "match"),
    [
        ("shuffle_once", _reverse_permutation, r"sampler state: a tuple of 500 -> a tuple of 500"),
        ("reshuffle", _sample_with_replacement, r"sampler state: \(False, 500, 500\) -> \(True, 500, 500\)"),
        ("poisson", _halve_sample_rate, r"sampler state: 0.1 -> 0.05"),
    ],
    ids=["shuffle-once-permutation", "reshuffle-replacement", "poisson-sample-rate"],
)
def test_sampler_changed_after_many_steps_is_refused(request, sampling, change, match):
    """Each sampler's parameters are re-read at every step, also after many identical ones."""
    name = _register(request, sampling=sampling, relation="add_or_remove_one" if sampling == "poisson" else "replace_one",
                     orders=[2.0, 4.0, 8.0])  # fmt: skip
    data = _dataset()
    loader = {"shuffle_once": DataLoader(data, batch_size=B, sampler=lo.ShuffleOnceSampler(data)),
              "reshuffle": DataLoader(data, batch_size=B, shuffle=True),
              "poisson": DataLoader(data, batch_size=B)}[sampling]  # fmt: skip
    engine, model, optimizer, loader = _private(name, loader, poisson_sampling=sampling == "poisson")
    _train(model, optimizer, loader, epochs=2)
    steps = engine.accountant.steps
    assert steps >= 2 * 9
    change(loader)
    with pytest.raises(lp.PipelineChangedError, match=match):
        _train(model, optimizer, loader)
    assert engine.accountant.steps == steps


def test_equal_permutation_in_a_new_tuple_is_accepted(request):
    """The sampler's state is compared by value: an equal permutation in a new tuple is the same sampler."""
    name = _register(request, sampling="shuffle_once", gradient_norms_within_clip=True)
    data = _dataset()
    sampler = lo.ShuffleOnceSampler(data, seed=3)
    engine, model, optimizer, loader = _private(
        name, DataLoader(data, batch_size=B, sampler=sampler), max_grad_norm=WITHIN_CLIP
    )
    _train(model, optimizer, loader)
    sampler._permutation = tuple(list(sampler._permutation))
    _train(model, optimizer, loader)
    expected = lp.epsilon("best", DELTA, dataset_size=N, batch_size=B, noise_multiplier=1.0, learning_rate=LR,
                          smoothness=0.25, gradient_norms_within_clip=True, sampling="shuffle_once",
                          steps=2 * N // B)  # fmt: skip
    assert engine.get_epsilon(DELTA) == pytest.approx(expected.epsilon, rel=1e-12)


# ---------------------------------------------------------------- one example, one clipped gradient


def test_two_views_in_two_backward_passes_are_refused(request):
    # Opacus accumulates both passes' per-example gradients: each example is clipped twice (sensitivity 2C)
    name = _register(request)
    engine, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(lp.PipelineChangedError, match=r"Found 2 backward passes"):
        for xb, yb in loader:
            optimizer.zero_grad()
            _loss(model, xb + 0.01 * torch.randn_like(xb), yb).backward()
            _loss(model, xb - 0.01 * torch.randn_like(xb), yb).backward()
            optimizer.step()
    assert engine.accountant.steps == 0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_collate_fn_adding_views_is_refused(request):
    def two_views(batch):
        x = torch.stack([item[0] for item in batch])
        y = torch.stack([item[1] for item in batch])
        return torch.cat([x, x.flip(-1)]), torch.cat([y, y])

    name = _register(request)
    _engine, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B, collate_fn=two_views))
    with pytest.raises(lp.PipelineChangedError, match=r"holds 50 examples.*Found 100 per-example"):
        _train(model, optimizer, loader)


def test_two_forward_passes_into_one_backward_are_refused(request):
    name = _register(request)
    _engine, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B))
    with pytest.raises(lp.PipelineChangedError, match=r"Found 100 examples entering the private module"):
        for xb, yb in loader:
            optimizer.zero_grad()
            (_loss(model, xb, yb) + _loss(model, xb.flip(-1), yb)).backward()
            optimizer.step()


# ---------------------------------------------------------------- parameters


def test_second_non_private_optimizer_is_refused(request):
    name = _register(request)
    engine, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B))
    head = torch.optim.SGD([model._module.bias], lr=LR)  # trains the bias without noise
    with pytest.raises(lp.PipelineChangedError, match="change only through the accounted DP steps"):
        for xb, yb in loader:
            optimizer.zero_grad()
            head.zero_grad()
            _loss(model, xb, yb).backward()
            optimizer.step()
            model._module.bias.grad = torch.ones_like(model._module.bias)
            head.step()
    assert engine.accountant.steps == 1


def test_parameters_changed_after_the_last_step_void_the_number(request):
    name = _register(request)
    engine, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B))
    _train(model, optimizer, loader)
    assert engine.get_epsilon(DELTA) > 0
    with torch.no_grad():
        model._module.weight.add_(1.0)  # e.g. non-private fine-tuning before release
    with pytest.raises(lp.PipelineChangedError, match="change only through the accounted DP steps"):
        engine.get_epsilon(DELTA)


@pytest.mark.parametrize("via_data", [False, True], ids=["in-place", "through-.data"])
def test_parameters_pushed_out_of_the_ball(request, via_data):
    """An in-place write is refused (every row: the model is not the run's output); a write through .data
    (which bypasses the version counters) is seen as parameters outside the declared domain: the rows that
    need the diameter leave from the step before."""
    name = _register(request, diameter=1.0)
    engine, model, optimizer, loader = _private(name, DataLoader(_dataset(), batch_size=B))
    lo.attach_projection(optimizer, 1.0)
    batches = iter(loader)
    for _ in range(3):
        xb, yb = next(batches)
        optimizer.zero_grad()
        _loss(model, xb, yb).backward()
        optimizer.step()
    with torch.no_grad():
        (model._module.weight.data if via_data else model._module.weight).mul_(0).add_(10.0)
    xb, yb = next(batches)
    optimizer.zero_grad()
    _loss(model, xb, yb).backward()
    if via_data:
        optimizer.step()
        ((fact, (step, changes)),) = left(engine.accountant).items()
        assert step == 3 and "outside its ball" in fact and changes == {"diameter": None}
        return
    with pytest.raises(lp.PipelineChangedError, match="change only through the accounted DP steps"):
        optimizer.step()
    assert engine.accountant.steps == 3


# ---------------------------------------------------------------- over-refusal, renamed keyword, host version


def test_drop_last_accepted_when_batch_divides_n(request):
    name = _register(request, gradient_norms_within_clip=True)
    engine, model, optimizer, loader = _private(
        name, DataLoader(_dataset(), batch_size=B, drop_last=True), max_grad_norm=WITHIN_CLIP
    )
    _train(model, optimizer, loader, epochs=2)
    expected = lp.epsilon(
        "best",
        DELTA,
        dataset_size=N,
        batch_size=B,
        noise_multiplier=1.0,
        learning_rate=LR,
        smoothness=0.25,
        gradient_norms_within_clip=True,
        sampling="cyclic",
        steps=2 * N // B,
    )
    assert engine.get_epsilon(DELTA) == pytest.approx(expected.epsilon, rel=1e-12)


def test_register_refuses_renamed_clipping_keyword(request):
    with pytest.raises(ValueError, match="gradient_norms_within_clip"):
        lo.register("v-renamed", sampling="cyclic", dataset_size=N, learning_rate=LR, clipping=False)


def test_untested_opacus_version_refused(request, monkeypatch):
    assert _internals.TESTED_OPACUS == ("1.5", "1.6")
    _internals.require_tested_opacus("1.5.4")
    with pytest.raises(lp.UnsupportedHostError, match=r"Found opacus 1.7.0"):
        _internals.require_tested_opacus("1.7.0")
    monkeypatch.setattr(_internals.opacus, "__version__", "2.0.0")
    with pytest.raises(lp.UnsupportedHostError, match=r"opacus version must be one of 1\.5\.x, 1\.6\.x"):
        _register(request)
