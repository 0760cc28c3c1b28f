"""Deep-model pipelines end to end (issue 37): every optimizer, schedule and clipping mode Opacus offers that a
proof covers gets the core's number for the pipeline that ran, names the rows that left and Opacus' own number;
what no row covers stays refused. Tiny MLPs and CNNs on generated data, CPU, seconds each.

Each pipeline's expected number is built by hand from what ran (the sampler, n, b, the noise multiplier, the
steps, the update) and computed by the core, never read back from the accountant.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("opacus")

from scipy.stats import norm as gaussian  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import lastiter_plugins as lp  # noqa: E402
from lastiter_plugins.adapters import opacus as lo  # noqa: E402

from .support import OPACUS_REGISTRY, left  # noqa: E402
from .support import engine as _engine  # noqa: E402

torch.set_num_threads(1)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
    pytest.mark.filterwarnings("ignore:.*[Ff]ull backward hook"),
    pytest.mark.filterwarnings("ignore:.*lr_scheduler"),
    pytest.mark.filterwarnings("ignore:.*Optimal order is the (largest|smallest) alpha"),
]

N, B, Z, DELTA, EPOCHS = 120, 20, 1.0, 1e-5, 2
STEPS = EPOCHS * N // B
ORDERS = [2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
OPACUS_16 = OPACUS_REGISTRY  # (ghost clipping's criterion arithmetic, wrap_model=False: Opacus 1.6)


def _data(image: bool = False) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 1, 6, 6, generator=gen) if image else torch.randn(N, 8, generator=gen)
    return TensorDataset(x, (torch.rand(N, generator=gen) < 0.5).long())


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(3 * 4 * 4, 2))


LOADERS = {
    "cyclic": lambda data: DataLoader(data, batch_size=B),
    "shuffle_once": lambda data: DataLoader(data, batch_size=B, sampler=lo.ShuffleOnceSampler(data)),
    "reshuffle": lambda data: DataLoader(data, batch_size=B, shuffle=True),
    "poisson": lambda data: DataLoader(data, batch_size=B),
}


def _register(request, sampling: str, **kw) -> str:
    if sampling == "poisson":
        kw.setdefault("relation", "add_or_remove_one")
        kw.setdefault("orders", ORDERS)
    return lo.register("pipe-" + request.node.name, force=True, sampling=sampling, dataset_size=N, **kw)


def _private(name, sampling, model, optimizer, *, image=False, clip=1.0, **kw):
    engine = _engine(name)
    out = engine.make_private(
        module=model, optimizer=optimizer, data_loader=LOADERS[sampling](_data(image)), noise_multiplier=Z,
        max_grad_norm=clip, poisson_sampling=sampling == "poisson", **kw,
    )  # fmt: skip
    return engine, out


def _train(model, optimizer, loader, criterion=None, schedule=None, per_step=False, epochs=EPOCHS):
    criterion = criterion or nn.CrossEntropyLoss()
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            criterion(model(xb), yb).backward()
            optimizer.step()
            if schedule is not None and per_step:
                schedule.step()
        if schedule is not None and not per_step:
            schedule.step()


def _core(sampling: str, steps: int = STEPS, **kw) -> float:
    """The core's best for the run that happened: n, b, z and the steps that ran, the sampler observed."""
    params = {"dataset_size": N, "batch_size": B, "noise_multiplier": Z, "steps": steps, "sampling": sampling, **kw}
    if sampling == "poisson":
        params.setdefault("relation", "add_or_remove_one")
        params.setdefault("orders", ORDERS)
    return lp.epsilon("best", DELTA, **params).epsilon


def _every_iterate_row(engine, sampling: str) -> None:
    """A deep model's number is the every-iterate row of the observed sampler, and the report says so."""
    result = engine.accountant.epsilon_result(DELTA)
    expected = {"poisson": "composition-pld-poisson"}.get(sampling, "composition-gdp-epochs")
    assert result.protects is lp.Protects.EVERY_ITERATE and result.winner == expected


# ---------------------------------------------------------------- optimizers and schedules (flat clipping)

#: name -> (the optimizer, its schedule (None: none), stepped every step (else every epoch), the fact reported)
OPTIMIZERS = {
    "adam": (lambda m: torch.optim.Adam(m.parameters(), lr=1e-3), None, False, "the optimizer is torch.optim.Adam,"),
    "adamw": (
        lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01),
        None,
        False,
        "the optimizer is torch.optim.AdamW",
    ),
    "rmsprop": (lambda m: torch.optim.RMSprop(m.parameters(), lr=1e-3), None, False, "RMSprop"),
    "adagrad": (lambda m: torch.optim.Adagrad(m.parameters(), lr=1e-2), None, False, "Adagrad"),
    "momentum-onecycle": (
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9),
        lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=0.1, total_steps=STEPS),
        True,
        "momentum=0.9",
    ),
    "nesterov-cosine": (
        lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True),
        lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=STEPS),
        True,
        "momentum=0.9",
    ),
    "sgd-step-schedule": (
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
        lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5),
        False,
        "learning rate changed at step 7",
    ),
    "sgd-lambda-of-the-step": (
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
        lambda o: torch.optim.lr_scheduler.LambdaLR(o, lambda t: 1.0 / (1 + t)),
        True,
        "learning rate changed at step 2",
    ),
    "sgd-weight-decay": (
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, weight_decay=1e-3),
        None,
        False,
        "weight_decay=0.001",
    ),
}
#: the first step a schedule changes the rate at (the others depart at step 1)
FIRST = {"sgd-step-schedule": N // B + 1, "sgd-lambda-of-the-step": 2}
CASES = [
    ("adam", "reshuffle"),
    ("adam", "poisson"),
    ("adam", "cyclic"),
    ("adamw", "reshuffle"),
    ("adamw", "shuffle_once"),
    ("rmsprop", "reshuffle"),
    ("adagrad", "poisson"),
    ("momentum-onecycle", "reshuffle"),
    ("momentum-onecycle", "poisson"),
    ("nesterov-cosine", "cyclic"),
    ("sgd-step-schedule", "shuffle_once"),
    ("sgd-lambda-of-the-step", "cyclic"),
    ("sgd-weight-decay", "reshuffle"),
]


@pytest.mark.parametrize(("optimizer", "sampling"), CASES, ids=[f"{o}-{s}" for o, s in CASES])
def test_a_deep_model_gets_the_core_number_for_the_update_that_ran(request, optimizer, sampling):
    make, schedule, per_step, fact = OPTIMIZERS[optimizer]
    name = _register(request, sampling, learning_rate=0.1, smoothness=1.0)  # (declared: the rows that left name)
    model = _mlp()
    engine, (private, dp_optimizer, loader) = _private(name, sampling, model, make(model))
    _train(private, dp_optimizer, loader, schedule=None if schedule is None else schedule(dp_optimizer),
           per_step=per_step)  # fmt: skip
    assert engine.accountant.steps == STEPS  # (Poisson: 1/q = 6 batches a pass)
    ((found, (step, changes)),) = left(engine.accountant).items()
    assert fact in found and changes["update"] == "any"
    assert step == FIRST.get(optimizer, 1)
    assert engine.get_epsilon(DELTA) == _core(sampling, update="any")
    _every_iterate_row(engine, sampling)
    report = engine.accountant.report(DELTA)
    assert len(report.departures) == 1 and fact in report.departures[0] and "update='any'" in report.departures[0]
    assert all(fact in line for line in report.rows_left)  # (none applied to a Poisson run declaring no loss)
    assert report.rows_left or sampling == "poisson"
    prv = report.host[0]
    assert prv.startswith("Opacus' default accountant (prv)")
    assert ("NOT VALID" in prv) is (sampling != "poisson")


def test_plain_sgd_without_a_learning_rate_names_the_rows_it_would_bring_back(request):
    name = _register(request, "cyclic", smoothness=1.0)
    model = _mlp()
    engine, (private, optimizer, loader) = _private(name, "cyclic", model, torch.optim.SGD(model.parameters(), lr=0.1))
    _train(private, optimizer, loader)
    assert engine.accountant.departures == []
    assert engine.get_epsilon(DELTA) == _core("cyclic", smoothness=1.0)
    report = engine.accountant.report(DELTA)
    assert "kong-ribero-cyclic" in report.needs_learning_rate
    assert "give learning_rate= for" in report.explain()


def test_a_cnn_with_adam_gets_the_every_iterate_row(request):
    name = _register(request, "reshuffle")
    model = _cnn()
    engine, (private, optimizer, loader) = _private(
        name, "reshuffle", model, torch.optim.Adam(model.parameters(), lr=1e-3), image=True
    )
    _train(private, optimizer, loader)
    assert engine.get_epsilon(DELTA) == _core("reshuffle", update="any")
    _every_iterate_row(engine, "reshuffle")


# ---------------------------------------------------------------- clipping modes


def test_per_layer_clipping_of_a_cnn_with_momentum_and_a_multistep_schedule(request):
    name = _register(request, "poisson")
    model = _cnn()
    clips = [1.0, 0.5, 1.0, 0.5]  # conv weight, conv bias, linear weight, linear bias
    engine, (private, optimizer, loader) = _private(
        name, "poisson", model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), image=True,
        clip=clips, clipping="per_layer",
    )  # fmt: skip
    schedule = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[1], gamma=0.1)
    _train(private, optimizer, loader, schedule=schedule)
    observed = engine.accountant.observed
    assert observed.clipping == "per_layer" and observed.clip_norm >= math.sqrt(2.5)
    assert engine.get_epsilon(DELTA) == _core(
        "poisson", engine.accountant.steps, update="any", noise_multiplier=observed.noise_multiplier,
        clip_norm=observed.clip_norm,
    )  # fmt: skip
    assert "per-layer clipping" in engine.accountant.report(DELTA).mechanism


def _exact_gaussian_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon of the Gaussian mechanism N(mu, 1) vs N(0, 1) at ``delta`` (Balle & Wang 2018, Thm 8)."""
    lo_, hi = 0.0, 100.0
    for _ in range(200):
        eps = (lo_ + hi) / 2
        d = gaussian.cdf(mu / 2 - eps / mu) - math.exp(eps) * gaussian.cdf(-mu / 2 - eps / mu)
        lo_, hi = (eps, hi) if d > delta else (lo_, eps)
    return hi


def test_per_layer_clipping_is_never_below_the_exact_gaussian(request):
    """Ground truth (docs/derivations/opacus-adapter.md#per-layer-clipping): one full-batch step with C = (1, 1)
    has sensitivity 2 sqrt(2) (replace-one) and noise std z m, m Opacus' float32 sqrt(2) < sqrt(2); the number
    is the exact Gaussian's or above. Counting Opacus' noise multiplier at face value would be below it."""
    n = 10
    data = TensorDataset(torch.randn(n, 1), torch.randn(n, 1))
    lo.register("pipe-" + request.node.name, force=True, sampling="cyclic", dataset_size=n)
    torch.manual_seed(0)
    model = nn.Linear(1, 1)
    engine = _engine("pipe-" + request.node.name)
    private, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), data_loader=DataLoader(data, batch_size=n),
        noise_multiplier=Z, max_grad_norm=[1.0, 1.0], clipping="per_layer", poisson_sampling=False,
    )  # fmt: skip
    _train(private, optimizer, loader, criterion=nn.MSELoss(), epochs=1)
    m = optimizer.max_grad_norm
    assert m < math.sqrt(2)  # (float32: the case the derivation is about)
    for delta in (1e-3, 1e-5, 1e-8):
        exact = _exact_gaussian_epsilon(2 * math.sqrt(2) / (Z * m), delta)
        ours = engine.get_epsilon(delta)
        assert ours >= exact
        face_value = lp.epsilon("composition-gdp-epochs", delta, dataset_size=n, batch_size=n, noise_multiplier=Z,
                                steps=1, sampling="cyclic").epsilon  # fmt: skip
        assert face_value < exact  # what the adapter must not report


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_ghost_clipping_through_the_returned_criterion(request, optimizer):
    name = _register(request, "reshuffle", learning_rate=0.1)
    model = _mlp()
    make = {"adam": lambda m: torch.optim.Adam(m.parameters(), lr=1e-3),
            "sgd": lambda m: torch.optim.SGD(m.parameters(), lr=0.1)}[optimizer]  # fmt: skip
    engine, (private, dp_optimizer, criterion, loader) = _private(
        name, "reshuffle", model, make(model), criterion=nn.CrossEntropyLoss(), grad_sample_mode="ghost"
    )
    _train(private, dp_optimizer, loader, criterion=criterion)
    assert engine.accountant.observed.clipping == "ghost"
    update = {"update": "any"} if optimizer == "adam" else {"learning_rate": 0.1}
    assert engine.get_epsilon(DELTA) == _core("reshuffle", **update)
    assert [v[1] for v in left(engine.accountant).values()] == ([{"update": "any", "learning_rate": None}]
                                                                 if optimizer == "adam" else [])  # fmt: skip


@pytest.mark.parametrize("bypass", ["user-criterion", "second-loss", "arithmetic"])
def test_ghost_clipping_whose_loss_bypasses_the_returned_criterion_is_refused(request, bypass):
    if bypass == "arithmetic" and not OPACUS_16:
        pytest.skip("Opacus 1.5's ghost loss tensor has no arithmetic")
    name = _register(request, "reshuffle")
    model = _mlp()
    engine, (private, optimizer, criterion, loader) = _private(
        name, "reshuffle", model, torch.optim.Adam(model.parameters(), lr=1e-3), criterion=nn.CrossEntropyLoss(),
        grad_sample_mode="ghost",
    )  # fmt: skip
    xb, yb = next(iter(loader))
    optimizer.zero_grad()
    plain = nn.CrossEntropyLoss()  # (Opacus 1.5 sets the reduction of the criterion it was given to "none")
    if bypass == "user-criterion":
        plain(private(xb), yb).backward()  # the unclipped sum would be noised
    elif bypass == "second-loss":
        criterion(private(xb), yb).backward()
        plain(private(xb), yb).backward()  # a second loss back-propagated outside the criterion
    else:
        (criterion(private(xb), yb) * 2.0).backward()
    with pytest.raises(lp.PipelineChangedError, match="ghost clipping"):
        optimizer.step()
    with pytest.raises(lp.PipelineChangedError, match="void"):
        engine.get_epsilon(DELTA)


def test_ghost_clipping_sums_the_flat_clipped_gradients(request):
    """The derivation's premise (#ghost-clipping): the two passes leave the flat-clipped sum in p.grad."""
    from opacus import GradSampleModule

    xb, yb = _data()[:B]
    clip = 0.05  # every example clipped
    model = _mlp()
    flat = GradSampleModule(_mlp())  # (the same initial weights: _mlp seeds)
    nn.CrossEntropyLoss(reduction="sum")(flat(xb), yb).backward()
    per_example = [p.grad_sample.reshape(B, -1) for p in flat.parameters()]
    norms = torch.cat(per_example, dim=1).norm(dim=1)
    factor = (clip / (norms + 1e-6)).clamp(max=1.0)
    expected = [torch.einsum("i,i...->...", factor, g) for g in per_example]
    name = _register(request, "cyclic")
    _, (private, optimizer, criterion, _) = _private(
        name, "cyclic", model, torch.optim.SGD(model.parameters(), lr=0.0), clip=clip,
        criterion=nn.CrossEntropyLoss(reduction="sum"), grad_sample_mode="ghost", loss_reduction="sum",
    )  # fmt: skip
    optimizer.zero_grad()
    criterion(private(xb), yb).backward()
    for p, e in zip(private.parameters(), expected, strict=True):
        assert torch.allclose(p.grad.reshape(-1), e, atol=1e-6)


@pytest.mark.skipif(not OPACUS_16, reason="make_private(wrap_model=False) needs Opacus 1.6")
def test_wrap_model_false_is_observed_at_the_users_model(request):
    name = _register(request, "reshuffle")
    model = _mlp()
    engine, (_, optimizer, loader) = _private(
        name, "reshuffle", model, torch.optim.AdamW(model.parameters(), lr=1e-3), wrap_model=False
    )
    _train(model, optimizer, loader)  # the loop calls the user's model
    assert engine.get_epsilon(DELTA) == _core("reshuffle", update="any")
    counter = engine.accountant.run.examples.counter  # the examples are counted where the loop calls
    xb, _ = next(iter(loader))
    with torch.no_grad():
        model(xb)
    assert counter is not None and counter.count == 0
    model(xb)
    assert counter.count == len(xb)


def test_batch_memory_manager_with_adam_counts_one_logical_batch_per_step(request):
    from opacus.utils.batch_memory_manager import BatchMemoryManager

    name = _register(request, "reshuffle")
    model = _mlp()
    engine, (private, optimizer, loader) = _private(name, "reshuffle", model, torch.optim.Adam(model.parameters()))
    for _ in range(EPOCHS):
        with BatchMemoryManager(data_loader=loader, max_physical_batch_size=7, optimizer=optimizer) as physical:
            for xb, yb in physical:
                optimizer.zero_grad()
                nn.CrossEntropyLoss()(private(xb), yb).backward()
                optimizer.step()
    assert engine.accountant.steps == STEPS
    assert engine.get_epsilon(DELTA) == _core("reshuffle", update="any")


# ---------------------------------------------------------------- rules reading a metric


def _plateau(request, **declared):
    name = _register(request, "reshuffle", **declared)
    model = _mlp()
    engine, (private, optimizer, loader) = _private(name, "reshuffle", model, torch.optim.Adam(model.parameters()))
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=0, factor=0.5)
    public = TensorDataset(torch.randn(30, 8), (torch.rand(30) < 0.5).long())  # not the private set
    for _ in range(EPOCHS):
        _train(private, optimizer, loader, epochs=1)
        with torch.no_grad():
            plateau.step(float(nn.CrossEntropyLoss()(private(public.tensors[0]), public.tensors[1])))
    return engine


def test_a_plateau_rule_on_a_public_metric_declared_gets_the_every_iterate_row(request):
    engine = _plateau(request, metric_source="public")
    assert engine.get_epsilon(DELTA) == _core("reshuffle", update="any")
    assert "metric_source='public'" in " ".join(left(engine.accountant))


def test_a_plateau_rule_without_the_declaration_is_refused(request):
    with pytest.raises(lp.PipelineChangedError, match="un-noised metric of the private data"):
        _plateau(request)


# ---------------------------------------------------------------- declarations, checkpoints


def test_require_last_iterate_refuses_adam_at_make_private(request):
    name = _register(request, "cyclic", learning_rate=0.1, smoothness=1.0, require="last_iterate")
    model = _mlp()
    with pytest.raises(lo.LastIterateConfigurationError, match="require='last_iterate'"):
        _private(name, "cyclic", model, torch.optim.Adam(model.parameters()))


def test_a_checkpoint_keeps_the_rows_that_left(request):
    name = _register(request, "cyclic", learning_rate=0.1, smoothness=1.0)
    model = _mlp()
    engine, (private, optimizer, loader) = _private(name, "cyclic", model, torch.optim.Adam(model.parameters()))
    _train(private, optimizer, loader, epochs=1)
    state = engine.accountant.state_dict()
    resumed = lo.create_accountant(name)
    resumed.load_state_dict(state)
    assert [d.fact for d in resumed.departures] == [d.fact for d in engine.accountant.departures]
    assert resumed.get_epsilon(DELTA) == _core("cyclic", N // B, update="any")


@pytest.mark.parametrize(("clip", "kept"), [(50.0, True), (0.01, False)], ids=["never-active", "active"])
def test_ghost_clipping_checks_a_declared_gradient_norm_bound(request, clip, kept):
    """With ghost clipping the per-example norms are the first pass' (the module's); a norm above the clip
    departs as under flat clipping."""
    name = _register(request, "cyclic", learning_rate=0.1, smoothness=1.0, gradient_norms_within_clip=True)
    model = _mlp()
    engine, (private, optimizer, criterion, loader) = _private(
        name, "cyclic", model, torch.optim.SGD(model.parameters(), lr=0.1), clip=clip, criterion=nn.CrossEntropyLoss(),
        grad_sample_mode="ghost",
    )  # fmt: skip
    _train(private, optimizer, loader, criterion=criterion, epochs=1)
    changes = [c for _, c in left(engine.accountant).values()]
    assert changes == ([] if kept else [{"gradient_norms_within_clip": False}])
    expected = _core("cyclic", N // B, learning_rate=0.1, smoothness=1.0, clip_norm=clip,
                     gradient_norms_within_clip=kept)  # fmt: skip
    assert engine.get_epsilon(DELTA) == expected
