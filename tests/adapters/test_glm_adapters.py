"""Certified linear models in the host adapters (model="glm"): the derived constants and the
epsilon equal the core's for hand-derived constants, every refusal fires before the first step
and names the constants to declare by hand, and the per-step checks fire when the run stops
being the certified GLM. Real small models trained with Opacus / TF Privacy on CPU."""

from __future__ import annotations

import importlib.util
import math
import re
import types

import numpy as np
import pytest

import lastiter_plugins as lp
from tests.support import ROOT, quiet_single_threaded

HAVE_OPACUS = importlib.util.find_spec("opacus") is not None and importlib.util.find_spec("torch") is not None
HAVE_TF = importlib.util.find_spec("tensorflow_privacy") is not None
needs_opacus = pytest.mark.skipif(not HAVE_OPACUS, reason="needs torch and opacus")
needs_tf = pytest.mark.skipif(not HAVE_TF, reason="needs tensorflow and tensorflow-privacy")
if HAVE_OPACUS:
    import opacus.accountants

# make_private_with_epsilon creates the accountant by name: Opacus' registry (1.6); on 1.5 lo.attach stands in
needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None, reason="the examples need scikit-learn")
needs_registry = pytest.mark.skipif(
    not HAVE_OPACUS or not hasattr(opacus.accountants, "register_accountant"),
    reason="needs Opacus' accountant registry (Opacus >= 1.6) for make_private_with_epsilon",
)
pytestmark = [
    pytest.mark.filterwarnings("ignore:Secure RNG turned off"),
    pytest.mark.filterwarnings("ignore:.*[Ff]ull backward hook"),
]

DELTA = 1e-5
A = 1.0  # feature_norm
N, B, DIM = 60, 20, 4
LR = 0.5
EXAMPLES = ROOT / "examples"
BY_HAND = "declare smoothness, strong_convexity, weak_convexity and gradient_norms_within_clip by hand"


def _data(classes: int = 0, scale: float = 3.0, n: int = N):
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(n, DIM)) * scale).astype("float32")  # norms up to ~10: the clip is active
    labels = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0)
    return x, (labels % classes if classes else (x[:, 0] > 0).astype("float32"))


def _hand_constants(loss: str, clip_norm: float, *, bias: bool = True, w: float = 0.0) -> lp.LossAssumptions:
    """The constants derived by hand (docs/derivations/glm.md#glm-binary, #glm-softmax, #glm-l2-contraction and
    #glm-never-active), not by the code under test."""
    a2 = A**2 + (1.0 if bias else 0.0)
    if loss == "logistic":
        m, g, scalar = a2 / 4.0, math.sqrt(a2), True
    elif loss == "softmax":
        m, g, scalar = a2 / 2.0, math.sqrt(2.0 * a2), False
    else:  # huber, delta = 0.5
        m, g, scalar = a2, 0.5 * math.sqrt(a2), True
    never_active = clip_norm >= g * (1 + 1e-3) + 1e-6
    assert scalar or never_active
    return lp.LossAssumptions(
        smoothness=m + w,
        strong_convexity=w,
        gradient_norms_within_clip=never_active,
        clipped_loss_convex_smooth=True,
    )


def _assert_constants(found: lp.LossAssumptions, expected: lp.LossAssumptions) -> None:
    assert found.smoothness == pytest.approx(expected.smoothness, rel=1e-12)
    assert found.strong_convexity == pytest.approx(expected.strong_convexity, rel=1e-12)
    assert found.weak_convexity == 0.0 and found.diameter == expected.diameter
    assert found.gradient_norms_within_clip is expected.gradient_norms_within_clip
    assert found.clipped_loss_convex_smooth is expected.clipped_loss_convex_smooth


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ================================================================ Opacus

if HAVE_OPACUS:
    import torch
    from opacus import PrivacyEngine
    from opacus.grad_sample import GradSampleModule
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lastiter_plugins.adapters import opacus as lo

    torch.set_num_threads(1)


def _departed(engine, phrase: str, step: int = 1, steps: int | None = None) -> None:
    """The GLM route saw a fact its constants rest on break from ``step`` on: the run goes on, the derived
    assumptions left (the rows needing them with them), and the number is the core's for the declared
    pipeline without them (cyclic, n = N, b = B, z = 1)."""
    accountant = engine.accountant
    (departure,) = accountant.departures
    assert departure.step == step and departure.fact.startswith("model='glm': ") and phrase in departure.fact
    assert departure.changes["smoothness"] is None and departure.changes["clipped_loss_convex_smooth"] is False
    steps = accountant.steps if steps is None else steps
    config = lp.TrainingConfig(
        dataset_size=N, batch_size=B, noise_multiplier=1.0, steps=steps, sampling="cyclic", learning_rate=LR,
        clip_norm=accountant.observed.clip_norm,
    )  # fmt: skip
    assert engine.get_epsilon(DELTA) == lp.epsilon("best", DELTA, config=config).epsilon
    assert all(phrase in line for line in accountant.report(DELTA).rows_left)  # each row that left names the fact


def _glm(request, loss="logistic", **kw) -> str:
    return lo.register(
        "glm-" + request.node.name,
        force=True,
        sampling=kw.pop("sampling", "cyclic"),
        dataset_size=N,
        learning_rate=LR,
        model="glm",
        loss=loss,
        feature_norm=A,
        **kw,
    )


def _clipped_linear(outputs: int = 1, bias: bool = True) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(lo.FeatureNormClip(A), nn.Linear(DIM, outputs, bias=bias))


#: The loss module of each declared loss (huber: delta 0.5), one per test module: make_private's criterion
CRITERIA = (
    {"logistic": nn.BCEWithLogitsLoss(), "softmax": nn.CrossEntropyLoss(), "huber": nn.HuberLoss(delta=0.5)}
    if HAVE_OPACUS
    else {}
)


def _private(
    name, model, *, clip=1.0, optimizer=None, classes=0, noise=1.0, reduction="mean", loss="logistic", criterion=None
):
    x, y = _data(classes)
    engine = PrivacyEngine()
    lo.attach(engine, name)  # (PrivacyEngine(accountant=name) needs Opacus' registry, 1.6)
    optimizer = optimizer(model) if optimizer is not None else torch.optim.SGD(model.parameters(), lr=LR)
    loader = DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=B)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=optimizer,
        criterion=criterion if criterion is not None else CRITERIA[loss],
        data_loader=loader,
        noise_multiplier=noise,
        max_grad_norm=clip,
        poisson_sampling=False,
        loss_reduction=reduction,
    )
    return engine, model, optimizer, loader


def _loss_fn(loss: str):
    """The loss of the declared kind, computed with its loss module on the model's output (a view for one output)."""
    criterion = CRITERIA[loss]
    return criterion if loss == "softmax" else lambda u, y: criterion(u.squeeze(-1), y)


def _train(model, optimizer, loader, loss_fn, epochs=1):
    for _ in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss_fn(model(xb), yb).backward()
            optimizer.step()


@needs_opacus
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("dim", [1, 7, 1000])
def test_opacus_feature_norm_clip_keeps_every_norm_within_the_bound(dtype, dim):
    from lastiter_plugins.feature_clip import feature_norms_within, safe_clip_radius

    rng = np.random.default_rng(dim)
    rows = rng.normal(size=(2000, dim)) * rng.choice([1e-3, 0.5, 1.0, 3.0, 1e6], size=(2000, 1))
    rows[0] = 0.0
    bound = 0.7
    radius = safe_clip_radius(bound, dim, dtype)
    rows[1] *= radius / np.linalg.norm(rows[1])  # exactly at the safe radius: the clip must keep it
    x = torch.tensor(rows, dtype=getattr(torch, dtype))
    out = lo.FeatureNormClip(bound)(x)
    assert out.dtype == x.dtype
    assert feature_norms_within(out.numpy(), bound).all()
    assert torch.equal(out[0], x[0])
    small = torch.linalg.vector_norm(x.double(), dim=1) <= radius * (1 - 1e-6)
    assert small.any() and torch.equal(out[small], x[small])  # rows inside the radius are untouched
    large = torch.linalg.vector_norm(x.double(), dim=1) > 2 * bound
    assert large.any() and torch.allclose(
        torch.linalg.vector_norm(out[large].double(), dim=1), torch.tensor(radius).double()
    )


@needs_opacus
@pytest.mark.parametrize(
    ("loss", "outputs", "clip", "bias"),
    [("logistic", 1, 0.5, True), ("logistic", 1, 0.5, False), ("softmax", 3, 2.01, True), ("huber", 1, 0.3, True)],
    ids=["logistic-clipping-active", "logistic-no-bias", "softmax-never-active", "huber"],
)
def test_opacus_epsilon_equals_core_for_hand_derived_constants(request, loss, outputs, clip, bias):
    kw = {"huber_delta": 0.5} if loss == "huber" else {}
    name = _glm(request, loss=loss, **kw)
    classes = outputs if loss == "softmax" else 0
    if loss == "huber":
        classes = 0
    engine, model, optimizer, loader = _private(
        name, _clipped_linear(outputs, bias), clip=clip, classes=classes, loss=loss
    )
    expected_assumptions = _hand_constants(loss, clip, bias=bias)
    _assert_constants(engine.accountant.registration.assumptions, expected_assumptions)
    _train(model, optimizer, loader, _loss_fn(loss), epochs=2)
    config = lp.TrainingConfig(
        dataset_size=N,
        batch_size=B,
        noise_multiplier=1.0,
        steps=2 * N // B,
        sampling="cyclic",
        learning_rate=LR,
        clip_norm=clip,
    )
    expected = lp.epsilon("best", DELTA, config=config, assumptions=expected_assumptions)
    assert engine.get_epsilon(DELTA) == pytest.approx(expected.epsilon, rel=1e-12)
    assert engine.accountant.epsilon_result(DELTA).winner == expected.winner


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.clip, self.hidden, self.out = lo.FeatureNormClip(A), nn.Linear(DIM, 3), nn.Linear(3, 1)

    def forward(self, x):
        return self.out(torch.relu(self.hidden(self.clip(x))))


class _SigmoidAfter(nn.Module):
    """Not an nn.Sequential: the activation after the Linear is seen in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.clip, self.linear = lo.FeatureNormClip(A), nn.Linear(DIM, 1)

    def forward(self, x):
        return torch.sigmoid(self.linear(self.clip(x)))


@needs_opacus
@pytest.mark.parametrize(
    ("make_model", "optimizer", "clip", "phrase"),
    [
        (_Mlp, None, 1.0, "trainable parameters in 2 module(s)"),
        (lambda: nn.Sequential(lo.FeatureNormClip(A), nn.Linear(DIM, 1), nn.Sigmoid()), None, 1.0, "2 (Sigmoid)"),
        (_clipped_linear, lambda m: torch.optim.Adam(m.parameters(), lr=LR), 1.0, "Found Adam"),
        (lambda: nn.Sequential(nn.Linear(DIM, 1)), None, 1.0, "Found none in the model"),
        (
            lambda: nn.Sequential(lo.FeatureNormClip(A), nn.Dropout(0.1), nn.Linear(DIM, 1)),
            None,
            1.0,
            "Found Dropout before it",
        ),
        (lambda: nn.Sequential(lo.FeatureNormClip(2 * A), nn.Linear(DIM, 1)), None, 1.0, "FeatureNormClip(2)"),
        (lambda: _clipped_linear(3), None, 1.0, "must have one output"),
    ],
    ids=["mlp", "activation-after-linear", "adam", "missing-clip", "dropout-between", "clip-too-loose", "3-outputs"],
)
def test_opacus_refuses_at_make_private(request, make_model, optimizer, clip, phrase):
    name = _glm(request)
    engine = None
    with pytest.raises(lo.LastIterateConfigurationError) as info:
        engine, *_ = _private(name, make_model(), clip=clip, optimizer=optimizer)
    assert engine is None and phrase in str(info.value)
    if phrase not in ("Found Adam", "FeatureNormClip(2)", "must have one output"):
        assert BY_HAND in str(info.value)  # names the constants to declare by hand


@needs_opacus
def test_opacus_refuses_softmax_where_clipping_can_be_active(request):
    name = _glm(request, loss="softmax")
    with pytest.raises(lo.LastIterateConfigurationError, match=r"clip_norm must be >= 2\.002"):
        _private(name, _clipped_linear(3), clip=1.0, classes=3, loss="softmax")


@needs_opacus
def test_opacus_register_refuses_declared_constants_and_unknown_losses(request):
    with pytest.raises(ValueError, match="smoothness must not be given with model='glm'"):
        _glm(request, smoothness=0.5)
    with pytest.raises(ValueError, match="loss must be one of logistic, softmax, huber"):
        _glm(request, loss="squared")
    with pytest.raises(ValueError, match="huber_delta must be a finite number > 0"):
        _glm(request, loss="huber")
    with pytest.raises(ValueError, match="feature_norm must be"):
        lo.register("x", sampling="cyclic", dataset_size=N, learning_rate=LR, model="glm", loss="logistic")
    with pytest.raises(ValueError, match="need model='glm'"):
        lo.register("x", sampling="cyclic", dataset_size=N, learning_rate=LR, feature_norm=1.0)


@needs_opacus
def test_opacus_frozen_layers_before_the_clip_are_accepted(request):
    torch.manual_seed(0)
    frozen = nn.Linear(DIM, 5)
    frozen.requires_grad_(False)
    model = nn.Sequential(frozen, nn.Tanh(), lo.FeatureNormClip(A), nn.Linear(5, 1))
    engine, model, optimizer, loader = _private(_glm(request), model)
    _train(model, optimizer, loader, _loss_fn("logistic"))
    assert engine.get_epsilon(DELTA) > 0


class _Centering(nn.Module):
    """Subtracts a running mean of the inputs it has seen (a buffer updated in every training forward)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))

    def forward(self, x):
        if self.training:
            with torch.no_grad():
                self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return x - self.mean


@needs_opacus
@pytest.mark.parametrize(
    ("make_layer", "phrase"),
    [
        (lambda: nn.BatchNorm1d(DIM).requires_grad_(False), "Found 0.running_mean, 0.running_var changed"),
        (lambda: _Centering(DIM), "Found 0.mean changed"),
    ],
    ids=["frozen-batchnorm-in-train-mode", "ema-centering"],
)
def test_opacus_buffer_updated_by_the_forward_before_the_clip_is_refused(request, make_layer, phrase):
    """A running statistic of the private inputs before the feature clip is released without noise."""
    torch.manual_seed(0)
    model = nn.Sequential(make_layer(), lo.FeatureNormClip(A), nn.Linear(DIM, 1))
    engine, model, optimizer, loader = _private(_glm(request), model)
    xb, yb = next(iter(loader))
    _loss_fn("logistic")(model(xb), yb).backward()
    with pytest.raises(lp.PipelineChangedError, match="buffers must not change during training") as info:
        optimizer.step()
    assert phrase in str(info.value)
    assert engine.accountant.steps == 0


@needs_opacus
def test_opacus_frozen_batchnorm_in_eval_mode_before_the_clip_is_accepted(request):
    torch.manual_seed(0)
    norm = nn.BatchNorm1d(DIM).requires_grad_(False)
    model = nn.Sequential(norm, lo.FeatureNormClip(A), nn.Linear(DIM, 1))
    engine, model, optimizer, loader = _private(_glm(request), model)
    norm.eval()  # its running statistics are not updated: a fixed function of the example
    _train(model, optimizer, loader, _loss_fn("logistic"), epochs=2)
    assert engine.accountant.steps == 2 * N // B and engine.get_epsilon(DELTA) > 0


@needs_opacus
def test_opacus_step_check_fires_when_the_clip_is_removed_after_registration(request):
    engine, model, optimizer, loader = _private(_glm(request), _clipped_linear())
    _train(model, optimizer, loader, _loss_fn("logistic"))  # one certified epoch
    assert engine.get_epsilon(DELTA) > 0
    model._module[0] = nn.Identity()  # the features now reach the Linear unclipped
    batches = iter(loader)
    xb, yb = next(batches)
    optimizer.zero_grad()
    _loss_fn("logistic")(model(xb), yb).backward()  # (a forward hook records the fact, never raises in it)
    optimizer.step()
    _departed(engine, "did not come from the clip", step=N // B + 1)
    xb, yb = next(batches)
    optimizer.zero_grad()
    _loss_fn("logistic")(model(xb), yb).backward()  # the route stops watching: later steps are accepted
    optimizer.step()
    assert engine.accountant.steps == N // B + 2 and len(engine.accountant.departures) == 1


@needs_opacus
def test_opacus_step_check_fires_on_an_activation_after_the_linear(request):
    engine, model, optimizer, loader = _private(_glm(request), _SigmoidAfter())  # not Sequential: seen in forward
    xb, yb = next(iter(loader))
    nn.functional.binary_cross_entropy(model(xb).squeeze(-1), yb).backward()
    optimizer.step()
    _departed(engine, "model's output must be the final nn.Linear's output")


def _scaled(factor):
    return lambda u, y: factor * CRITERIA["logistic"](u.squeeze(-1), y)


def _extra_term(u, y):
    return CRITERIA["logistic"](u.squeeze(-1), y) + 0.1 * (u**2).mean()


@needs_opacus
@pytest.mark.parametrize(
    ("loss", "loss_fn", "phrase"),
    [
        ("logistic", lambda u, y: nn.functional.mse_loss(u.squeeze(-1), y), "Found 0 calls"),
        ("logistic", lambda u, y: nn.functional.binary_cross_entropy_with_logits(u.squeeze(-1), y), "Found 0 calls"),
        ("logistic", _scaled(10.0), "Found a difference of up to"),
        ("logistic", _scaled(1.5), "Found a difference of up to"),
        ("logistic", _extra_term, "Found a difference of up to"),
        ("logistic", lambda u, y: CRITERIA["logistic"](2.0 * u.squeeze(-1), y), "Found 0 calls"),
        ("huber", lambda u, y: nn.functional.huber_loss(u.squeeze(-1), y, delta=2.0), "Found 0 calls"),
    ],
    ids=["mse-declared-logistic", "functional-logistic", "scaled-logistic", "scaled-logistic-1.5",
         "extra-term-on-the-output", "scaled-output", "huber-wrong-delta"],
)  # fmt: skip
def test_opacus_step_check_fires_on_another_loss(request, loss, loss_fn, phrase):
    """The loss module given at make_private is the declared one; the loss backpropagated is not it."""
    kw = {"huber_delta": 0.5} if loss == "huber" else {}
    engine, model, optimizer, loader = _private(_glm(request, loss=loss, **kw), _clipped_linear(), loss=loss)
    xb, yb = next(iter(loader))
    optimizer.zero_grad()
    loss_fn(model(xb * 0.1), yb).backward()  # small scores: BCE and MSE differ there
    optimizer.step()
    _departed(engine, phrase)


@needs_opacus
@pytest.mark.parametrize("loss_inside", [False, True], ids=["loss-on-output-float", "loss-inside-autocast"])
def test_opacus_step_check_names_autocast(request, loss_inside):
    """bfloat16 scores (torch.autocast, no scaler): refused on the GLM route, the message naming the cause."""
    import opacus

    if int(opacus.__version__.split(".")[1]) < 6 and opacus.__version__.startswith("1."):
        pytest.skip(
            f"Opacus {opacus.__version__}'s per-sample gradients fail under bfloat16 autocast (an einsum of "
            "mixed dtypes): Opacus stops the run itself, before the adapter's check"
        )
    engine, model, optimizer, loader = _private(_glm(request), _clipped_linear())
    xb, yb = next(iter(loader))
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(xb).squeeze(-1)
        if loss_inside:
            loss = CRITERIA["logistic"](out, yb)
    (loss if loss_inside else CRITERIA["logistic"](out.float(), yb)).backward()
    optimizer.step()
    _departed(engine, "model's output is torch.bfloat16 (torch.autocast")


@needs_opacus
@pytest.mark.parametrize(
    ("loss", "criterion", "phrase"),
    [
        ("huber", lambda: nn.SmoothL1Loss(beta=0.25), "must be torch.nn.HuberLoss itself"),
        ("huber", lambda: nn.SmoothL1Loss(beta=1.0), "SmoothL1Loss(beta) is HuberLoss(delta=beta) / beta"),
        ("huber", lambda: nn.HuberLoss(delta=2.0), "HuberLoss.delta must be 0.5"),
        ("logistic", lambda: nn.BCEWithLogitsLoss(pos_weight=torch.tensor(3.0)), "pos_weight must be None"),
        ("logistic", lambda: nn.BCEWithLogitsLoss(weight=torch.tensor(2.0)), "weight must be None"),
        ("logistic", lambda: nn.BCEWithLogitsLoss(reduction="sum"), "reduction must be 'mean'"),
        ("logistic", lambda: nn.BCELoss(), "Found BCELoss"),
        ("logistic", lambda: nn.MSELoss(), "Found MSELoss"),
        ("softmax", lambda: nn.CrossEntropyLoss(label_smoothing=0.1), "label_smoothing must be 0.0"),
        ("softmax", lambda: nn.CrossEntropyLoss(weight=torch.ones(3)), "weight must be None"),
        ("softmax", lambda: type("MyLoss", (nn.CrossEntropyLoss,), {})(), "Found MyLoss"),
    ],
    ids=["smooth-l1-beta-0.25", "smooth-l1-beta-1", "huber-delta", "pos-weight", "bce-weight", "reduction", "bce",
         "mse", "label-smoothing", "ce-weight", "subclass"],
)  # fmt: skip
def test_opacus_refuses_a_loss_module_that_is_not_the_declared_loss(request, loss, criterion, phrase):
    kw = {"huber_delta": 0.5} if loss == "huber" else {}
    outputs, clip, classes = (3, 2.01, 3) if loss == "softmax" else (1, 1.0, 0)
    name = _glm(request, loss=loss, **kw)
    with pytest.raises(lo.LastIterateConfigurationError) as info:
        _private(name, _clipped_linear(outputs), clip=clip, classes=classes, loss=loss, criterion=criterion())
    assert phrase in str(info.value) and BY_HAND in str(info.value)


@needs_opacus
def test_opacus_loss_module_changed_during_training_departs(request):
    criterion = nn.HuberLoss(delta=0.5)
    engine, model, optimizer, loader = _private(
        _glm(request, loss="huber", huber_delta=0.5), _clipped_linear(), loss="huber", criterion=criterion
    )
    _train(model, optimizer, loader, lambda u, y: criterion(u.squeeze(-1), y))
    assert engine.accountant.steps == N // B
    criterion.delta = 2.0  # four times the curvature scale the constants were derived for
    xb, yb = next(iter(loader))
    optimizer.zero_grad()
    criterion(model(xb).squeeze(-1), yb).backward()
    optimizer.step()
    _departed(engine, "HuberLoss.delta must be 0.5", step=N // B + 1)


def _set_pos_weight(loss):
    loss.pos_weight = torch.tensor([2.0])


def _sum_reduction(loss):
    loss.reduction = "sum"


def _forward_replaced(loss):
    loss.forward = types.MethodType(nn.BCEWithLogitsLoss.forward, loss)


@needs_opacus
@pytest.mark.parametrize(
    ("change", "phrase"),
    [
        (_set_pos_weight, "BCEWithLogitsLoss.pos_weight must be None"),
        (_sum_reduction, "BCEWithLogitsLoss.reduction must be 'mean'"),
        (_forward_replaced, "with forward replaced"),
    ],
)
def test_opacus_loss_module_changed_after_accepted_steps_departs(request, change, phrase):
    """The loss module is checked in full when a value check_loss_module reads differs from the last step's."""
    criterion = nn.BCEWithLogitsLoss()
    engine, model, optimizer, loader = _private(_glm(request), _clipped_linear(), criterion=criterion)
    _train(model, optimizer, loader, lambda u, y: criterion(u.squeeze(-1), y))
    assert engine.accountant.steps == N // B
    change(criterion)
    xb, yb = next(iter(loader))
    optimizer.zero_grad()
    criterion(model(xb).squeeze(-1), yb).backward()
    optimizer.step()
    _departed(engine, phrase, step=N // B + 1)


@needs_opacus
def test_opacus_refuses_a_run_without_the_loss_module(request):
    """make_private's criterion left at Opacus' default: the loss cannot be verified."""
    name = _glm(request)
    x, y = _data()
    engine = PrivacyEngine()
    lo.attach(engine, name)
    model = _clipped_linear()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=B),
        noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False,
    )  # fmt: skip
    xb, yb = next(iter(loader))
    _loss_fn("logistic")(model(xb), yb).backward()
    optimizer.step()
    _departed(engine, "pass it to make_private(criterion=...)")


@needs_opacus
def test_opacus_says_when_the_given_loss_module_is_gone(request):
    """docs/opacus.md's Poisson snippet passed criterion=nn.BCEWithLogitsLoss() inline and computed the loss
    with another instance: the given module was garbage-collected, and the refusal said "no loss module
    given". It now says that the module given no longer exists and how to keep it."""
    import gc

    name = _glm(request)
    x, y = _data()
    engine = PrivacyEngine()
    lo.attach(engine, name)
    model = _clipped_linear()
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=LR), criterion=nn.BCEWithLogitsLoss(),
        data_loader=DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=B),
        noise_multiplier=1.0, max_grad_norm=1.0, poisson_sampling=False,
    )  # fmt: skip
    gc.collect()
    xb, yb = next(iter(loader))
    nn.BCEWithLogitsLoss()(model(xb).squeeze(-1), yb).backward()
    optimizer.step()
    _departed(engine, "no longer exists")
    assert "Keep it in a variable" in engine.accountant.departures[0].fact


@needs_opacus
@pytest.mark.parametrize("labels", ["out-of-range", "probabilities"])
def test_opacus_softmax_targets_checked(request, labels):
    """Class indices outside [0, k) (e.g. ignore_index, which rescales a mean) are refused; class
    probabilities are accepted (the same constants)."""
    engine, model, optimizer, loader = _private(
        _glm(request, loss="softmax"), _clipped_linear(3), clip=2.01, classes=3, loss="softmax"
    )
    xb, yb = next(iter(loader))
    optimizer.zero_grad()
    if labels == "out-of-range":
        target = yb.clone()
        target[0] = -100  # CrossEntropyLoss' ignore_index
        CRITERIA["softmax"](model(xb), target).backward()
        optimizer.step()
        ((fact, (step, _)),) = {d.fact: (d.step, d.changes) for d in engine.accountant.departures}.items()
        assert step == 1 and "class indices in [0, 3)" in fact
    else:
        CRITERIA["softmax"](model(xb), nn.functional.one_hot(yb, 3).float() * 0.8 + 0.2 / 3).backward()
        optimizer.step()
        assert engine.accountant.steps == 1


@needs_opacus
def test_opacus_step_check_fires_on_per_example_gradients_that_are_not_rank_one(request):
    engine, model, optimizer, loader = _private(_glm(request), _clipped_linear())
    original = GradSampleModule.GRAD_SAMPLERS[nn.Linear]

    def not_rank_one(layer, activations, backprops):
        out = original(layer, activations, backprops)
        out[layer.weight] = out[layer.weight] + 0.1 * torch.randn_like(out[layer.weight])
        return out

    GradSampleModule.GRAD_SAMPLERS[nn.Linear] = not_rank_one
    try:
        xb, yb = next(iter(loader))
        optimizer.zero_grad()
        _loss_fn("logistic")(model(xb), yb).backward()
        optimizer.step()
        (departure,) = engine.accountant.departures
        assert "must be rank one" in departure.fact
    finally:
        GradSampleModule.GRAD_SAMPLERS[nn.Linear] = original


@needs_opacus
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_opacus_feature_norm_filter_bounds_the_exact_square_from_above(dtype):
    """The step's feature-norm check accepts from the square computed in the features' dtype only when its
    bound is <= A^2: the bound must be >= the exact sum of squares (computed with fractions) for every row,
    including rows of tiny entries; and the clip's own output (norm 1 clipped to A = 1) passes the filter."""
    from fractions import Fraction

    from lastiter_plugins.adapters.opacus import _glm_clip

    rng = np.random.default_rng(0)
    for d in (1, 7, 30, 512):
        for scale in (1.0, 1e-3, 1e-19, 1e-21):
            rows = (rng.standard_normal((16, d)) * scale).astype(dtype)
            t = torch.from_numpy(rows)
            computed = float(_glm_clip.largest_square([t]))
            exact = max(sum(Fraction(float(v)) ** 2 for v in row) for row in rows)
            assert Fraction(_glm_clip.square_bound(computed, [t])) >= exact
    x = torch.from_numpy(rng.standard_normal((256, 512)).astype(dtype))
    clipped = lo.FeatureNormClip(1.0)(x / x.norm(dim=1, keepdim=True))
    assert _glm_clip.square_bound(float(_glm_clip.largest_square([clipped])), [clipped]) <= 1.0


@needs_opacus
def test_opacus_step_check_fires_when_the_clip_norm_changes(request):
    _, model, optimizer, loader = _private(
        _glm(request, loss="softmax"), _clipped_linear(3), clip=2.01, classes=3, loss="softmax"
    )
    _train(model, optimizer, loader, _loss_fn("softmax"))
    optimizer.max_grad_norm = 1.0  # clipping could now be active: the softmax certificate no longer holds
    xb, yb = next(iter(loader))
    optimizer.zero_grad()
    _loss_fn("softmax")(model(xb), yb).backward()
    with pytest.raises(lp.PipelineChangedError, match=r"must stay constant.*clip_norm: 2\.01 -> 1\.0"):
        optimizer.step()  # (the mechanism changed: every row needs it)


@needs_opacus
def test_opacus_custom_engine_binds_the_model_and_derives_at_the_first_step(request):
    from opacus.optimizers import DPOptimizer

    accountant = lo.create_accountant(_glm(request))  # (also on Opacus 1.5, which has no registry)
    x, y = _data()
    loader = DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=B)
    with pytest.raises(lo.LastIterateConfigurationError, match="trainable parameters in 2 module"):
        accountant.bind_data_loader(loader, module=GradSampleModule(_Mlp()))
    module = GradSampleModule(_clipped_linear())
    optimizer = DPOptimizer(
        torch.optim.SGD(module.parameters(), lr=LR), noise_multiplier=1.0, max_grad_norm=0.5, expected_batch_size=B
    )
    optimizer.attach_step_hook(accountant.get_optimizer_hook_fn(sample_rate=B / N))
    accountant.bind_data_loader(loader, module=module, loss=CRITERIA["logistic"])
    assert accountant.derivation is None  # the optimizer is seen at the first step
    _train(module, optimizer, loader, _loss_fn("logistic"))
    _assert_constants(accountant.registration.assumptions, _hand_constants("logistic", 0.5))
    config = lp.TrainingConfig(
        dataset_size=N, batch_size=B, noise_multiplier=1.0, steps=N // B, sampling="cyclic", learning_rate=LR,
        clip_norm=0.5,
    )  # fmt: skip
    expected = lp.epsilon("best", DELTA, config=config, assumptions=_hand_constants("logistic", 0.5))
    assert accountant.get_epsilon(DELTA) == pytest.approx(expected.epsilon, rel=1e-12)


@needs_opacus
@needs_registry
def test_opacus_make_private_with_epsilon_calibrates_with_the_derived_constants(request):
    name = _glm(request)
    x, y = _data()
    engine = PrivacyEngine(accountant=name)
    model = _clipped_linear()
    model, optimizer, loader = engine.make_private_with_epsilon(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=LR),
        data_loader=DataLoader(TensorDataset(torch.tensor(x), torch.tensor(y)), batch_size=B),
        target_epsilon=3.0,
        target_delta=DELTA,
        epochs=3,
        max_grad_norm=0.5,
        poisson_sampling=False,
        criterion=CRITERIA["logistic"],
    )
    _train(model, optimizer, loader, _loss_fn("logistic"), epochs=3)
    _assert_constants(engine.accountant.registration.assumptions, _hand_constants("logistic", 0.5))
    assert 2.5 < engine.get_epsilon(DELTA) <= 3.0


@needs_opacus
def test_opacus_weight_decay_is_folded_into_the_constants(request):
    w = 0.05
    engine, model, optimizer, loader = _private(
        _glm(request), _clipped_linear(), optimizer=lambda m: torch.optim.SGD(m.parameters(), lr=LR, weight_decay=w)
    )
    _assert_constants(engine.accountant.registration.assumptions, _hand_constants("logistic", 1.0, w=w))
    _train(model, optimizer, loader, _loss_fn("logistic"), epochs=2)
    config = lp.TrainingConfig(
        dataset_size=N, batch_size=B, noise_multiplier=1.0, steps=2 * N // B, sampling="cyclic", learning_rate=LR
    )
    expected = lp.epsilon("best", DELTA, config=config, assumptions=_hand_constants("logistic", 1.0, w=w))
    assert engine.get_epsilon(DELTA) == pytest.approx(expected.epsilon, rel=1e-12)
    # a bias without weight decay: the l2 term no longer covers every parameter, lam = 0
    engine, *_ = _private(
        _glm(request),
        _clipped_linear(),
        optimizer=lambda m: torch.optim.SGD(
            [{"params": [m[1].weight], "weight_decay": w}, {"params": [m[1].bias], "weight_decay": 0.0}], lr=LR
        ),
    )
    derived = engine.accountant.registration.assumptions
    assert derived.strong_convexity == 0.0 and derived.smoothness == pytest.approx(0.5 + w)


@needs_opacus
@needs_sklearn
@pytest.mark.parametrize("name", ["opacus_logistic_regression", "opacus_softmax_regression"])
def test_opacus_examples_run_without_weight_decay(name, capsys):
    result = _load_example(name).main(["--epochs", "3", "--weight-decay", "0"])
    out = capsys.readouterr().out
    assert f"certified: epsilon = {result['epsilon']:.4g} at delta = 1e-05 for the final model only" in out
    assert result["accuracy"] >= (0.9 if "logistic" in name else 0.8)


@needs_opacus
@needs_sklearn
@pytest.mark.parametrize("name", ["opacus_logistic_regression", "opacus_softmax_regression"])
def test_opacus_examples_run_with_their_defaults(name, capsys):
    result = _load_example(name).main(["--epochs", "3"])
    default = "0.01" if "logistic" in name else "0.005"
    assert f"lam={default}, gradient norms within clip" in capsys.readouterr().out  # weight decay folded in
    assert result["accuracy"] >= (0.9 if "logistic" in name else 0.8)


# Opacus' default sampling (make_private(poisson_sampling=True)) under add-or-remove-one: the
# shifted-interpolation Poisson row (docs/derivations/random-batch.md#random-batch-poisson) on a certified logistic
# regression
# whose weight decay is the l2 term added after the noisy clipped mean (l2_outside_clip).
POISSON_W, POISSON_Z, POISSON_EPOCHS, POISSON_BATCHES = 0.05, 2.0, 40, 10


def _breast_cancer():
    from sklearn.datasets import load_breast_cancer

    data = load_breast_cancer()
    x = (data.data - data.data.mean(axis=0)) / data.data.std(axis=0)
    return torch.tensor(x, dtype=torch.float32), torch.tensor(data.target, dtype=torch.float32)


def _poisson_run(name: str, *, weight_decay: float, lr: float, glm: bool):
    """Train a logistic regression with make_private(poisson_sampling=True) for POISSON_EPOCHS epochs."""
    x, y = _breast_cancer()
    torch.manual_seed(0)
    model = nn.Sequential(lo.FeatureNormClip(A), nn.Linear(x.shape[1], 1, bias=False)) if glm else nn.Linear(30, 1)
    engine = PrivacyEngine()
    lo.attach(engine, name)
    model, optimizer, loader = engine.make_private(
        module=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=lr, weight_decay=weight_decay),
        criterion=CRITERIA["logistic"],
        data_loader=DataLoader(TensorDataset(x, y), batch_size=math.ceil(len(y) / POISSON_BATCHES)),  # q = 1/10
        noise_multiplier=POISSON_Z,
        max_grad_norm=1.0,
        poisson_sampling=True,
    )
    _train(model, optimizer, loader, _loss_fn("logistic"), epochs=POISSON_EPOCHS)
    return engine, len(y)


def _poisson_params(n: int, lr: float, steps: int) -> dict:
    """The run in the core's terms, by hand (docs/opacus.md): Opacus divides by int(n q); the core's
    b = ceil(n q) with the step size rescaled to that divisor."""
    b, divisor = math.ceil(n / POISSON_BATCHES), int(n * (1.0 / POISSON_BATCHES))
    return dict(
        dataset_size=n, batch_size=b, noise_multiplier=POISSON_Z, sampling="poisson",
        relation="add_or_remove_one", steps=steps, learning_rate=lr * b / divisor, clip_norm=1.0,
    )  # fmt: skip


@needs_opacus
@needs_sklearn
def test_opacus_poisson_weight_decay_gets_the_shifted_interpolation_poisson_row(request):
    w = POISSON_W
    m = A**2 / 4.0 + w  # logistic, no bias (docs/derivations/glm.md#glm-route)
    lr = 1.0 / (m + w)
    name = lo.register(
        "glm-" + request.node.name, force=True, sampling="poisson", relation="add_or_remove_one",
        dataset_size=569, learning_rate=lr, model="glm", loss="logistic", feature_norm=A,
    )  # fmt: skip
    engine, n = _poisson_run(name, weight_decay=w, lr=lr, glm=True)
    params = _poisson_params(n, lr, engine.accountant.steps)
    lam = w * 56 / 57  # w N / b in the core's terms: Opacus divides by N = int(569 / 10) = 56, the core by b = 57
    derived = engine.accountant.registration.assumptions
    assert derived.l2_outside_clip is True  # torch's weight_decay is added after Opacus' noisy clipped mean
    assert derived.strong_convexity == pytest.approx(lam, rel=1e-12)
    assert derived.smoothness == pytest.approx(A**2 / 4.0 + lam, rel=1e-12)
    config = engine.accountant.training_config()
    assert config.sampling is lp.Sampling.POISSON and config.relation is lp.Relation.ADD_OR_REMOVE_ONE
    assert config.batch_size == params["batch_size"] == 57
    assert config.learning_rate == pytest.approx(params["learning_rate"], rel=1e-15)
    assumptions = dict(
        smoothness=A**2 / 4.0 + lam, strong_convexity=lam, clipped_loss_convex_smooth=True, l2_outside_clip=True
    )
    expected = lp.epsilon("best", DELTA, **params, **assumptions)
    result = engine.accountant.epsilon_result(DELTA)
    assert result.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    assert result.winner == expected.winner == "shifted-interpolation-poisson"
    assert result.relation is lp.Relation.ADD_OR_REMOVE_ONE
    baseline = lp.epsilon("composition-pld-poisson", DELTA, **params, **assumptions).epsilon
    assert result.epsilon < 0.75 * baseline  # about 1.52 against 4.91 at 400 steps
    # without the l2_outside_clip fact the row allows any split of lam and M between the example and the step
    weaker = lp.epsilon("shifted-interpolation-poisson", DELTA, **params, **{**assumptions, "l2_outside_clip": False})
    assert result.epsilon < weaker.epsilon
    row = next(r for r in engine.accountant.report(DELTA).rows if r.bound == "shifted-interpolation-poisson")
    assert row.applies and row.epsilon == pytest.approx(result.epsilon, rel=1e-12)


@needs_opacus
@needs_sklearn
def test_opacus_poisson_without_convexity_gets_the_standard_baseline(request):
    lr = 0.5
    name = lo.register(
        "plain-" + request.node.name, force=True, sampling="poisson", relation="add_or_remove_one",
        dataset_size=569, learning_rate=lr,
    )  # fmt: skip
    engine, n = _poisson_run(name, weight_decay=0.0, lr=lr, glm=False)
    params = _poisson_params(n, lr, engine.accountant.steps)
    result = engine.accountant.epsilon_result(DELTA)
    assert result.winner == "composition-pld-poisson"
    assert result.epsilon == pytest.approx(lp.epsilon("best", DELTA, **params).epsilon, rel=1e-12)
    rows = {r.bound: r for r in engine.accountant.report(DELTA).rows}
    for bound in ("shifted-interpolation-poisson", "shifted-interpolation-poisson-replace-one"):
        assert not rows[bound].applies and rows[bound].epsilon is None and rows[bound].reasons
    assert any("smooth" in reason for reason in rows["shifted-interpolation-poisson"].reasons)


# ================================================================ Keras / TF Privacy

if HAVE_TF:
    import tensorflow as tf
    import tensorflow_privacy as tfp_privacy

    from lastiter_plugins.adapters import tf_privacy as ltf

    quiet_single_threaded(tf)

TF_N, TF_B = 64, 16


def _bce():
    return tf.keras.losses.BinaryCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


def _sparse():
    return tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=tf.keras.losses.Reduction.NONE)


def _keras(layers, loss=None, clip=1.0):
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential([tf.keras.Input((DIM,)), *layers]) if isinstance(layers, list) else layers
    optimizer = tfp_privacy.DPKerasSGDOptimizer(
        l2_norm_clip=clip, noise_multiplier=1.0, num_microbatches=None, learning_rate=LR
    )
    model.compile(optimizer=optimizer, loss=loss if loss is not None else _bce())
    return model


def _fit(model, callback, labels=None, classes=0, epochs=2):
    x, y = _data(classes, n=TF_N)
    y = y if labels is None else labels
    model.fit(x, y, batch_size=TF_B, epochs=epochs, shuffle=False, callbacks=[callback], verbose=0)


def _glm_callback():
    return ltf.LastIterateCallback(sampling="cyclic", dataset_size=TF_N, delta=DELTA, model="glm", feature_norm=A)


@needs_tf
@pytest.mark.parametrize("dim", [1, 7, 1000])
def test_keras_feature_norm_clip_keeps_every_norm_within_the_bound(dim):
    from lastiter_plugins.feature_clip import feature_norms_within, safe_clip_radius

    rng = np.random.default_rng(dim)
    rows = (rng.normal(size=(1000, dim)) * rng.choice([1e-3, 0.5, 3.0, 1e6], size=(1000, 1))).astype("float32")
    rows[0] = 0.0
    out = ltf.FeatureNormClip(0.7)(tf.constant(rows)).numpy()
    assert out.dtype == np.float32 and feature_norms_within(out, 0.7).all()
    inside = np.linalg.norm(rows.astype("float64"), axis=1) <= safe_clip_radius(0.7, dim, "float32") * (1 - 1e-6)
    assert inside.any() and np.array_equal(out[inside], rows[inside])
    config = ltf.FeatureNormClip(0.7).get_config()
    assert ltf.FeatureNormClip.from_config(config).feature_norm_bound == 0.7


@needs_tf
@pytest.mark.parametrize(
    ("loss", "units", "clip"),
    [("logistic", 1, 1.0), ("logistic", 1, 1.5), ("softmax", 3, 2.01)],
    ids=["logistic-clipping-active", "logistic-never-active", "softmax-never-active"],
)
def test_keras_epsilon_equals_core_for_hand_derived_constants(loss, units, clip):
    keras_loss = _sparse() if loss == "softmax" else _bce()
    model = _keras([ltf.FeatureNormClip(A), tf.keras.layers.Dense(units)], keras_loss, clip=clip)
    callback = _glm_callback()
    _fit(model, callback, classes=units if loss == "softmax" else 0)
    hand = _hand_constants(loss, clip)
    _assert_constants(callback.assumptions, hand)
    config = lp.TrainingConfig(
        dataset_size=TF_N,
        batch_size=TF_B,
        noise_multiplier=float(np.float32(1.0 * clip)) / float(np.float32(clip)),  # float32 std / clip, as run
        steps=2 * TF_N // TF_B,
        sampling="cyclic",
        learning_rate=LR,
        clip_norm=clip,
    )
    expected = lp.epsilon("best", DELTA, config=config, assumptions=hand)
    assert callback.epsilon == pytest.approx(expected.epsilon, rel=1e-12)


class _MaybeBypass(tf.keras.Model if HAVE_TF else object):
    """Calls the clip, but feeds the Dense layer the raw features once ``bypass`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.clip = ltf.FeatureNormClip(A)
        self.dense = tf.keras.layers.Dense(1)
        self.bypass = False

    def call(self, x, training=None):
        clipped = self.clip(x)
        return self.dense(x if self.bypass else clipped)


@needs_tf
@pytest.mark.parametrize(
    ("layers", "loss", "clip", "phrase", "by_hand"),
    [
        (
            lambda: [ltf.FeatureNormClip(A), tf.keras.layers.Dense(3, activation="relu"), tf.keras.layers.Dense(1)],
            None,
            1.0,
            "Found trainable variables in",
            True,
        ),
        (
            lambda: [ltf.FeatureNormClip(A), tf.keras.layers.Dense(1, activation="sigmoid")],
            None,
            1.0,
            "Found activation='sigmoid'",
            True,
        ),
        (lambda: [tf.keras.layers.Dense(1)], None, 1.0, "Found none in the model", True),
        (
            lambda: [ltf.FeatureNormClip(A), tf.keras.layers.Dense(1, kernel_regularizer="l2")],
            None,
            1.0,
            "Found kernel_regularizer",
            False,
        ),
        (
            lambda: [ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)],
            lambda: tf.keras.losses.BinaryCrossentropy(reduction=tf.keras.losses.Reduction.NONE),
            1.0,
            "Found from_logits=False",
            True,
        ),
        (
            lambda: [ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)],
            lambda: tf.keras.losses.MeanSquaredError(reduction=tf.keras.losses.Reduction.NONE),
            1.0,
            "Found MeanSquaredError",
            True,
        ),
        (lambda: [ltf.FeatureNormClip(A), tf.keras.layers.Dense(3)], _sparse, 1.0, "clip_norm must be >= 2.002", True),
    ],
    ids=["mlp", "activation", "missing-clip", "kernel-regularizer", "probabilities", "mse", "softmax-small-clip"],
)
def test_keras_refuses_before_the_first_step(layers, loss, clip, phrase, by_hand):
    model = _keras(layers(), loss() if loss is not None else None, clip=clip)
    with pytest.raises(ltf.AccountingError) as info:
        _fit(model, _glm_callback(), classes=3 if loss is _sparse else 0)
    assert phrase in str(info.value)
    assert not by_hand or "by hand" in str(info.value)
    assert int(model.optimizer.iterations.numpy()) == 0


@needs_tf
def test_keras_refuses_declared_constants_with_glm():
    with pytest.raises(ValueError, match="smoothness must not be given with model='glm'"):
        ltf.LastIterateCallback(
            sampling="cyclic", dataset_size=TF_N, delta=DELTA, model="glm", feature_norm=A, smoothness=0.5
        )
    with pytest.raises(ValueError, match="feature_norm needs model='glm'"):
        ltf.LastIterateCallback(sampling="cyclic", dataset_size=TF_N, delta=DELTA, feature_norm=A, smoothness=0.5)


def _assert_glm_rows_left(callback, fragment, step=1):
    """The linear model did not run as certified from ``step`` on: the rows needing its loss assumptions left,
    and the number is the core's for the run without them (clipping still bounds each example's gradient)."""
    config = lp.TrainingConfig(
        dataset_size=TF_N, batch_size=TF_B, noise_multiplier=1.0, steps=2 * TF_N // TF_B, sampling="cyclic",
        learning_rate=LR, clip_norm=1.0,
    )  # fmt: skip
    certified = lp.epsilon("best", DELTA, config=config, assumptions=_hand_constants("logistic", 1.0))
    expected = lp.epsilon("best", DELTA, config=config, assumptions=lp.LossAssumptions())
    assert expected.epsilon > certified.epsilon  # the departure costs something here
    assert callback.epsilon == pytest.approx(expected.epsilon, rel=1e-12)
    (departure,) = callback.departures
    assert departure.step == step and re.search(fragment, departure.fact), departure.fact
    left = {row.bound for row in callback.rows_left}
    assert certified.winner in left and all(row.step == step for row in callback.rows_left)
    assert callback.config.steps == 2 * TF_N // TF_B  # every planned step ran and counts


@needs_tf
def test_keras_clip_bypassed_after_registration_leaves_the_rows_needing_the_loss_assumptions():
    model = _MaybeBypass()
    model.build((None, DIM))
    model = _keras(model)
    callback = _glm_callback()
    model.bypass = True  # after the callback was created: the Dense layer now sees raw features
    _fit(model, callback)  # two epochs planned: found at the first step
    _assert_glm_rows_left(callback, r"Dense layer's input must be the FeatureNormClip's output.*\(step 1\)")


@needs_tf
def test_keras_same_model_with_the_clip_in_place_is_accepted():
    model = _MaybeBypass()
    model.build((None, DIM))
    model = _keras(model)
    callback = _glm_callback()
    _fit(model, callback)
    assert callback.epsilon > 0
    _assert_constants(callback.assumptions, _hand_constants("logistic", 1.0))


@needs_tf
def test_keras_labels_outside_the_range_the_certificate_needs_leave_its_rows():
    model = _keras([ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)], clip=1.5)  # never-active route
    _, y = _data(n=TF_N)
    callback = _glm_callback()
    _fit(model, callback, labels=2.0 * y)
    (departure,) = callback.departures
    assert departure.step == 1 and re.search(r"binary labels must be in \[0, 1\]", departure.fact)
    assert callback.rows_left and callback.result.winner not in {row.bound for row in callback.rows_left}


@needs_tf
def test_keras_named_linear_model_bound_broken_by_a_step_voids_the_epsilon():
    model = _keras([ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)], clip=1.5)
    _, y = _data(n=TF_N)
    callback = ltf.LastIterateCallback(
        sampling="cyclic", dataset_size=TF_N, delta=DELTA, model="glm", feature_norm=A, bound="kong-ribero-cyclic"
    )
    with pytest.raises(lp.PipelineChangedError, match=r"kong-ribero-cyclic.*binary labels must be in \[0, 1\]"):
        _fit(model, callback, labels=2.0 * y)


@needs_tf
def test_keras_loss_weights_are_refused_before_the_first_step():
    # compile(loss_weights=5) multiplies the per-example loss, hence the smoothness behind the constants.
    model = _keras([ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)])
    model.compile(optimizer=model.optimizer, loss=_bce(), loss_weights=5.0)
    with pytest.raises(ltf.AccountingError, match=r"loss_weights must be None or 1.*Found loss_weights=5\.0"):
        _fit(model, _glm_callback())
    assert int(model.optimizer.iterations.numpy()) == 0


class _ScaledTrainStep(tf.keras.Sequential if HAVE_TF else object):
    """Keras' train_step with the loss multiplied by 5 before TF Privacy differentiates it."""

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = 5.0 * self.compute_loss(x, y, self(x, training=True))
        self.optimizer.minimize(loss, self.trainable_variables, tape=tape)
        return {}


@needs_tf
def test_keras_custom_train_step_scaling_the_loss_is_refused_before_the_first_step():
    model = _keras(_ScaledTrainStep([tf.keras.Input((DIM,)), ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)]))
    with pytest.raises(ltf.AccountingError, match=r"train_step must be Keras' own Model\.train_step"):
        _fit(model, _glm_callback())
    assert int(model.optimizer.iterations.numpy()) == 0


class _ScaleAfterTheChecks(tf.keras.callbacks.Callback if HAVE_TF else object):
    """Changes the compiled loss' weight after the accountant's checks, before the step is traced."""

    def on_train_begin(self, logs=None):
        self.model.compiled_loss._loss_weights = [5.0]


@needs_tf
def test_keras_optimizer_differentiating_another_loss_leaves_the_rows_needing_the_loss_assumptions():
    model = _keras([ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)])
    callback = _glm_callback()
    x, y = _data(n=TF_N)
    model.fit(x, y, batch_size=TF_B, epochs=2, shuffle=False, callbacks=[callback, _ScaleAfterTheChecks()], verbose=0)
    _assert_glm_rows_left(callback, r"must differentiate the certified loss itself.*\(step 1\)")


def _epsilon_for(clip: float, loss: str = "logistic", steps: int = 2 * TF_N // TF_B) -> float:
    config = lp.TrainingConfig(
        dataset_size=TF_N,
        batch_size=TF_B,
        noise_multiplier=float(np.float32(1.0 * clip)) / float(np.float32(clip)),
        steps=steps,
        sampling="cyclic",
        learning_rate=LR,
        clip_norm=clip,
    )
    return lp.epsilon("best", DELTA, config=config, assumptions=_hand_constants(loss, clip)).epsilon


@needs_tf
def test_keras_float64_clip_feeding_a_float32_dense_is_accepted_with_the_true_number():
    # Keras casts the clip's float64 output to the Dense layer's float32: the norms stay <= A after the cast.
    model = _keras([ltf.FeatureNormClip(A, dtype="float64"), tf.keras.layers.Dense(1)])
    callback = _glm_callback()
    _fit(model, callback)
    _assert_constants(callback.assumptions, _hand_constants("logistic", 1.0))
    assert callback.epsilon == pytest.approx(_epsilon_for(1.0), rel=1e-12)


@needs_tf
def test_keras_float64_clip_keeps_every_norm_within_the_bound_after_a_cast_to_float32():
    from lastiter_plugins.feature_clip import feature_norms_within

    rng = np.random.default_rng(7)
    for dim in (1, 7, 1000):
        rows = rng.normal(size=(2000, dim)) * rng.choice([1e-3, 0.5, 3.0, 1e6], size=(2000, 1))
        clipped = ltf.FeatureNormClip(0.7, dtype="float64")(tf.constant(rows))
        assert clipped.dtype == tf.float64
        assert feature_norms_within(tf.cast(clipped, tf.float32).numpy(), 0.7).all(), dim


@needs_tf
def test_keras_linear_activation_after_the_dense_is_accepted_with_the_true_number():
    model = _keras([ltf.FeatureNormClip(A), tf.keras.layers.Dense(1), tf.keras.layers.Activation("linear")])
    callback = _glm_callback()
    _fit(model, callback)
    assert callback.epsilon == pytest.approx(_epsilon_for(1.0), rel=1e-12)


@needs_tf
def test_keras_other_activation_after_the_dense_is_refused_before_the_first_step():
    model = _keras([ltf.FeatureNormClip(A), tf.keras.layers.Dense(1), tf.keras.layers.Activation("sigmoid")])
    with pytest.raises(ltf.AccountingError, match=r"Found \w+ \(Activation sigmoid\) after it"):
        _fit(model, _glm_callback())
    assert int(model.optimizer.iterations.numpy()) == 0


@needs_tf
def test_keras_statement_callback_and_core_give_one_number_on_the_glm_route():
    # Issue 31: the statement takes every declaration the core takes (model="glm" as the callback, or the
    # flags by hand) and prints the callback's number for the same run (shuffle=True, clipping active).
    import re

    n, b, epochs = 160, 20, 2
    x, y = _data(0, n=n)  # features of norm up to 3 A: the feature clip acts, and so can the gradient clip
    model = _keras([ltf.FeatureNormClip(A), tf.keras.layers.Dense(1)], _bce(), clip=1.0)
    callback = ltf.LastIterateCallback(sampling="reshuffle", dataset_size=n, delta=DELTA, model="glm", feature_norm=A)
    model.fit(x, y, batch_size=b, epochs=epochs, shuffle=True, callbacks=[callback], verbose=0)
    core = lp.epsilon(
        "best",
        DELTA,
        dataset_size=n,
        batch_size=b,
        noise_multiplier=1.0,
        clip_norm=1.0,
        learning_rate=LR,
        sampling="reshuffle",
        epochs=epochs,
        smoothness=callback.assumptions.smoothness,
        clipped_loss_convex_smooth=True,
    )
    assert callback.assumptions.clipped_loss_convex_smooth and not callback.assumptions.gradient_norms_within_clip
    assert callback.epsilon == pytest.approx(core.epsilon, rel=1e-12) and callback.result.winner == core.winner
    common = dict(
        number_of_examples=n,
        batch_size=b,
        num_epochs=epochs,
        noise_multiplier=1.0,
        delta=DELTA,
        l2_norm_clip=1.0,
        learning_rate=LR,
        sampling="reshuffle",
    )
    by_model = ltf.compute_last_iterate_privacy_statement(model="glm", feature_norm=A, loss=_bce(), **common)
    by_hand = ltf.compute_last_iterate_privacy_statement(
        smoothness=callback.assumptions.smoothness, clipped_loss_convex_smooth=True, **common
    )
    for text in (by_model, by_hand):
        best = re.search(r"\n    best +([0-9.]+) +\(via ([a-z-]+);", text)
        assert float(best.group(1)) == round(callback.epsilon, 3) and best.group(2) == core.winner
        assert "model='glm'" not in text  # no advice to use what was used
    with pytest.raises(ValueError, match="smoothness, clipped_loss_convex_smooth must not be given with model='glm'"):
        ltf.compute_last_iterate_privacy_statement(
            model="glm", feature_norm=A, loss=_bce(), smoothness=0.5, clipped_loss_convex_smooth=True, **common
        )


@needs_tf
def test_keras_statement_cites_each_reference_once_at_the_end():
    text = ltf.compute_last_iterate_privacy_statement(
        number_of_examples=2000,
        batch_size=100,
        num_epochs=20,
        noise_multiplier=1.0,
        delta=1e-5,
        l2_norm_clip=1.0,
        learning_rate=0.5,
        sampling="reshuffle",
        smoothness=0.5,
    )
    answer, rest = text.split("\n\n", 1)  # the answer first (issue 41): its winner's provenance, once
    assert answer.startswith("epsilon = ") and answer.count("Dong, Roth & Su 2019") == 1
    body, references = rest.split("\nReferences:\n")
    assert "arXiv" not in body[: body.index("Baseline:")]  # rows cite [k]; the references follow once
    cited = references.split("\n  [")
    assert len(cited) == len(set(cited)) >= 3 and all(line.count("arXiv 1905.02383") <= 1 for line in cited)
    assert rest.count("Dong, Roth & Su 2019") == 1
    assert max(len(line) for line in text.splitlines()) <= 110 and len(rest.splitlines()) < 120
    assert len(answer.splitlines()) <= 10
