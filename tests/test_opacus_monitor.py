"""Opacus adapter, the run monitor: pipelines decided by the indices each step used (issue: adapters v4).

Story tests, end to end: each pipeline of the fourth audit (n = 200 examples, 8 features, b = 20,
logistic regression, z = 2, C = 1) is refused with an error naming its cause, or gets the core's
epsilon for what ran (``lastiter_plugins.epsilon`` with the parameters that ran, computed here
without the adapter). Real Opacus training of small models on CPU.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

import opacus.accountants  # noqa: E402
from opacus import PrivacyEngine  # noqa: E402
from opacus.data_loader import DPDataLoader  # noqa: E402
from opacus.utils.batch_memory_manager import BatchMemoryManager  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins.adapters import opacus as lo  # noqa: E402

torch.set_num_threads(1)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
    pytest.mark.filterwarnings("ignore:.*[Ff]ull backward hook"),
    pytest.mark.filterwarnings("ignore:.*lr_scheduler"),
]

N, D, B, Z, LR, DELTA = 200, 8, 20, 2.0, 0.5, 1e-5
EPOCH = N // B
ORDERS = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


def _dataset(n: int = N) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, D, generator=gen)
    x = x / x.norm(dim=1, keepdim=True)
    return TensorDataset(x, (torch.rand(n, generator=gen) < 0.5).float())


def _engine(name) -> PrivacyEngine:
    if hasattr(opacus.accountants, "register_accountant"):
        return PrivacyEngine(accountant=name)
    engine = PrivacyEngine()
    lo.attach(engine, name)
    return engine


def _register(request, sampling="cyclic", suffix="", **kw) -> str:
    params = {"sampling": sampling, "dataset_size": N, "learning_rate": LR, "smoothness": 0.25, **kw}
    if sampling == "poisson":
        params.setdefault("relation", "add_or_remove_one")
    if sampling != "cyclic":
        params.setdefault("orders", ORDERS)
    return lo.register("mon-" + request.node.name + suffix, force=True, **params)


def _private(name, loader=None, *, poisson=False, model=None, noise=Z, **kw):
    torch.manual_seed(0)
    model = model if model is not None else nn.Linear(D, 1)
    engine = _engine(name)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=loader if loader is not None else DataLoader(_dataset(), batch_size=B),
        noise_multiplier=noise, max_grad_norm=1.0, poisson_sampling=poisson, **kw,
    )  # fmt: skip
    return engine, model, optimizer, loader


def _bce(output, y):
    return nn.functional.binary_cross_entropy_with_logits(output.squeeze(-1), y)


def _step(model, optimizer, xb, yb):
    optimizer.zero_grad()
    _bce(model(xb), yb).backward()
    optimizer.step()


def _train(model, optimizer, loader, epochs=1):
    for _ in range(epochs):
        for xb, yb in loader:
            _step(model, optimizer, xb, yb)


def _expected(steps: int, sampling: str = "cyclic", **kw) -> float:
    """The core's epsilon for the declared loss assumptions and the parameters that ran."""
    params = {"dataset_size": N, "batch_size": B, "noise_multiplier": Z, "learning_rate": LR, "smoothness": 0.25,
              "sampling": sampling, "steps": steps, **kw}  # fmt: skip
    if sampling == "poisson":
        params.setdefault("relation", "add_or_remove_one")
    if sampling != "cyclic":
        params.setdefault("orders", ORDERS)
    return lp.epsilon("best", DELTA, **params).epsilon


def _refused(engine, action, match: str) -> None:
    before = engine.accountant.steps
    with pytest.raises(lp.PipelineChangedError, match=match):
        action()
    assert engine.accountant.steps == before
    with pytest.raises(lp.PipelineChangedError, match="void"):
        engine.get_epsilon(DELTA)


# ================================================================ the pipelines of the audit


def _duplicating_collate(batch):
    x = torch.stack([item[0] for item in batch])
    y = torch.stack([item[1] for item in batch])
    return torch.cat([x, x]), torch.cat([y, y])


def test_poisson_collate_fn_duplicating_rows_is_refused(request):
    name = _register(request, "poisson")
    loader = DataLoader(_dataset(), batch_size=B, collate_fn=_duplicating_collate)
    engine, model, optimizer, loader = _private(name, loader, poisson=True)
    _refused(engine, lambda: _train(model, optimizer, loader), r"holds \d+ examples\. Found \d+ per-example gradients")


def test_poisson_two_batches_concatenated_into_one_step_are_refused(request):
    name = _register(request, "poisson")
    engine, model, optimizer, loader = _private(name, poisson=True)

    def concatenated():
        it = iter(loader)
        for _ in range(EPOCH // 2):
            (x1, y1), (x2, y2) = next(it), next(it)
            _step(model, optimizer, torch.cat([x1, x2]), torch.cat([y1, y2]))

    _refused(engine, concatenated, r"holds \d+ examples\. Found \d+ per-example gradients")


def test_poisson_skip_signals_merging_two_logical_batches_are_refused(request):
    name = _register(request, "poisson")
    engine, model, optimizer, loader = _private(name, poisson=True)

    def merged():
        with BatchMemoryManager(data_loader=loader, max_physical_batch_size=8, optimizer=optimizer) as memory_safe:
            for i, (xb, yb) in enumerate(memory_safe):
                optimizer.zero_grad()
                _bce(model(xb), yb).backward()
                if i % 2 == 0:
                    optimizer.signal_skip_step(True)
                optimizer.step()

    _refused(engine, merged, r"Found \d+ per-example gradients summed|skipped steps|examples entering")


def test_poisson_declared_but_the_loop_iterates_the_fixed_order_loader_is_refused(request):
    name = _register(request, "poisson")
    original = DataLoader(_dataset(), batch_size=B)
    engine, model, optimizer, _poisson_loader = _private(name, original, poisson=True)
    _refused(engine, lambda: _train(model, optimizer, original), "no batch drawn from it")


@pytest.mark.parametrize("reseed", ["generator", "torch.manual_seed"])
def test_reshuffle_reseeded_with_the_same_seed_every_epoch_is_refused(request, reseed):
    name = _register(request, "reshuffle")
    generator = torch.Generator()
    loader = DataLoader(_dataset(), batch_size=B, shuffle=True, generator=generator if reseed == "generator" else None)
    engine, model, optimizer, loader = _private(name, loader)

    def epoch():
        generator.manual_seed(0)
        torch.manual_seed(0)
        _train(model, optimizer, loader)

    epoch()
    _refused(engine, epoch, "equal to an earlier epoch's.*sampling='cyclic'")
    # what ran: a public order, cyclic, with a larger epsilon than the reshuffle number (4.63 vs 4.03 in the audit)


def test_hand_built_poisson_loader_reseeded_every_epoch_is_refused(request):
    name = _register(request, "poisson")
    generator = torch.Generator()
    dp_loader = DPDataLoader.from_data_loader(DataLoader(_dataset(), batch_size=B), generator=generator)
    engine, model, optimizer, loader = _private(name, dp_loader, poisson=False)
    assert loader is dp_loader

    def epoch():
        generator.manual_seed(1)
        _train(model, optimizer, loader)

    epoch()
    _refused(engine, epoch, "equal to an earlier pass's.*re-seeded")


def test_epoch_two_over_a_new_loader_is_refused(request):
    name = _register(request, "reshuffle")
    data = _dataset()
    engine, model, optimizer, loader = _private(name, DataLoader(data, batch_size=B, shuffle=True))
    _train(model, optimizer, loader)
    _refused(engine, lambda: _train(model, optimizer, DataLoader(data, batch_size=B)), "no batch drawn from it")


def test_a_second_engine_on_the_trained_model_continues_its_accounting(request):
    """2 epochs under one engine, then make_private again on the same model for 1 epoch: 3 epochs."""
    name = _register(request)
    torch.manual_seed(0)
    model = nn.Linear(D, 1)
    engine, private, optimizer, loader = _private(name, model=model)
    _train(private, optimizer, loader, epochs=2)
    assert engine.get_epsilon(DELTA) == pytest.approx(_expected(2 * EPOCH), rel=1e-12)
    private.remove_hooks()  # the first engine closed: Opacus refuses hooks added twice to one model
    second, private, optimizer, loader = _private(name, model=model)
    _train(private, optimizer, loader)
    assert second.accountant.steps == 3 * EPOCH
    assert second.get_epsilon(DELTA) == pytest.approx(_expected(3 * EPOCH), rel=1e-12)
    with pytest.raises(lp.PipelineChangedError, match="continues its accounting"):
        engine.get_epsilon(DELTA)  # the first engine's number no longer describes the model


def test_a_second_engine_on_the_returned_grad_sample_module_continues_its_accounting(request):
    name = _register(request)
    _engine1, private, optimizer, loader = _private(name)
    _train(private, optimizer, loader, epochs=2)
    second, private2, optimizer2, loader2 = _private(name, model=private)
    _train(private2, optimizer2, loader2)
    assert second.get_epsilon(DELTA) == pytest.approx(_expected(3 * EPOCH), rel=1e-12)


def _trained_and_closed(name):
    torch.manual_seed(0)
    model = nn.Linear(D, 1)
    _engine1, private, optimizer, loader = _private(name, model=model)
    _train(private, optimizer, loader, epochs=2)
    private.remove_hooks()  # the first engine closed: Opacus refuses hooks added twice to one model
    return model


def test_a_second_engine_registered_otherwise_on_the_trained_model_is_refused(request):
    model = _trained_and_closed(_register(request))
    with pytest.raises(lp.NotApplicableError, match=r"already trained for 20 DP steps.*same configuration"):
        _private(_register(request, suffix="-other", smoothness=0.5), model=model)


def test_a_second_engine_with_less_noise_on_the_trained_model_is_refused(request):
    name = _register(request)
    model = _trained_and_closed(name)
    second, private, optimizer, loader = _private(name, model=model, noise=1.0)  # same registration, less noise
    _refused(second, lambda: _train(private, optimizer, loader), "same noise, clipping")


@pytest.mark.parametrize("created", ["after make_private", "on the SGD before make_private"])
def test_reduce_lr_on_plateau_is_refused_whether_or_not_it_fires(request, created):
    name = _register(request)
    schedulers = []
    torch.manual_seed(0)
    model = nn.Linear(D, 1)
    sgd = torch.optim.SGD(model.parameters(), lr=LR)
    if created != "after make_private":
        schedulers.append(torch.optim.lr_scheduler.ReduceLROnPlateau(sgd, patience=100))
    engine = _engine(name)
    private, optimizer, loader = engine.make_private(
        module=model, optimizer=sgd, data_loader=DataLoader(_dataset(), batch_size=B), noise_multiplier=Z,
        max_grad_norm=1.0, poisson_sampling=False,
    )  # fmt: skip
    if not schedulers:
        schedulers.append(torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=100))

    def epoch():
        total = 0.0
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = _bce(private(xb), yb)
            loss.backward()
            optimizer.step()
            total += float(loss)
        schedulers[0].step(total)  # never fires (patience 100): the learning rate stays LR

    _refused(engine, epoch, "ReduceLROnPlateau")
    assert optimizer.param_groups[0]["lr"] == LR


# ================================================================ crashes and messages on the GLM route

W_DECAY = 0.05


def _glm(request, sampling, lr=1.0, **kw) -> str:
    params = {"sampling": sampling, "dataset_size": N, "learning_rate": lr, "model": "glm", "loss": "logistic",
              "feature_norm": 1.0, **kw}  # fmt: skip
    if sampling == "poisson":
        params.setdefault("relation", "add_or_remove_one")
        params.setdefault("orders", ORDERS)
    return lo.register("mon-glm-" + request.node.name, force=True, **params)


def _glm_private(name, loader, *, poisson, bias=False, lr=1.0):
    torch.manual_seed(0)
    model = nn.Sequential(lo.FeatureNormClip(1.0), nn.Linear(D, 1, bias=bias))
    criterion = nn.BCEWithLogitsLoss()
    engine = _engine(name)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=lr, weight_decay=W_DECAY),
        criterion=criterion, data_loader=loader, noise_multiplier=Z, max_grad_norm=1.0, poisson_sampling=poisson,
    )  # fmt: skip
    return engine, model, optimizer, loader, criterion


def _glm_train(model, optimizer, loader, criterion):
    for xb, yb in loader:
        optimizer.zero_grad()
        criterion(model(xb).squeeze(-1), yb).backward()
        optimizer.step()


def test_poisson_glm_with_empty_batches_is_accounted(request):
    """batch_size 1, q = 1/n: about a third of the Poisson batches are empty, each a valid noise-only step."""
    name = _glm(request, "poisson")
    engine, model, optimizer, loader, criterion = _glm_private(name, DataLoader(_dataset(), batch_size=1), poisson=True)
    sizes = []
    for xb, yb in loader:
        sizes.append(len(xb))
        optimizer.zero_grad()
        criterion(model(xb).squeeze(-1), yb).backward()
        optimizer.step()
    assert engine.accountant.steps == N and sizes.count(0) > 30
    # logistic, no bias, A = 1: M = A^2/4 + w, lam = w (b = ceil(n q) = 1 = Opacus' int(n q))
    assumptions = {"smoothness": 0.25 + W_DECAY, "strong_convexity": W_DECAY, "clipped_loss_convex_smooth": True,
                   "l2_outside_clip": True}  # fmt: skip
    expected = lp.epsilon("best", DELTA, dataset_size=N, batch_size=1, noise_multiplier=Z, learning_rate=1.0,
                          sampling="poisson", relation="add_or_remove_one", steps=N, orders=ORDERS,
                          **assumptions)  # fmt: skip
    assert engine.get_epsilon(DELTA) == pytest.approx(expected.epsilon, rel=1e-12)


def test_glm_bias_frozen_after_an_epoch_is_refused_naming_the_freeze(request):
    name = _glm(request, "cyclic")
    engine, model, optimizer, loader, criterion = _glm_private(
        name, DataLoader(_dataset(), batch_size=B), poisson=False, bias=True
    )
    _glm_train(model, optimizer, loader, criterion)
    model._module[1].bias.requires_grad_(False)
    _refused(engine, lambda: _glm_train(model, optimizer, loader, criterion), "frozen")
